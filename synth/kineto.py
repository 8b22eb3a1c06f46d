"""PyTorch profiler traces (Kineto Chrome-trace JSON) of a data-parallel job, one per rank.

Every rank runs the same steps: a host-to-device copy, the forward and backward kernels, two
gradient buckets all-reduced (the first while the backward pass still runs, the second after it),
and the optimizer's kernels. A collective ends on every rank when the last rank has arrived and
the transfer is done, so a rank that is `late` (a slower forward pass in some steps) makes every
other rank's NCCL kernel (or gloo op, CPU only) start early and wait. The layout and the fields
are Kineto's: `distributedInfo`, `ProfilerStep#N`, `record_param_comms` with the collective's
arguments and `nccl:all_reduce` inside it, `cudaLaunchKernel` and the kernels it launched (by
correlation id), times in microseconds after `baseTimeNanoseconds`. `traceName` marks it synthetic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TextIO

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01 00:00 UTC
START_MS = 100.0  # the first step's start, after the base time
MAIN_TID, BACKWARD_TID, GLOO_TID = 1000, 1001, 1002
COMPUTE_STREAM, COMM_STREAM = 7, 20
GRAD_ELEMENTS = (25_000_000, 8_000_000)  # the two buckets


@dataclass(frozen=True)
class Job:
    """The job the traces are of: its ranks, steps and timing (milliseconds)."""

    world: int = 4
    first_step: int = 10
    steps: int = 20
    forward_ms: float = 30.0
    backward_ms: float = 60.0
    optimizer_ms: float = 8.0
    transfer_ms: tuple[float, float] = (12.0, 6.0)  # per bucket, once every rank has arrived
    gap_ms: float = 1.0  # host time between steps
    gpu: bool = True  # False: CPU only, gloo
    late: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> {step: extra forward ms}
    slow_transfer: dict[int, float] = field(default_factory=dict)  # step -> extra ms of every transfer (the network)
    loader_ms: float = 0.0  # each step first waits this long for its batch (the data loader), the GPU idle
    sequence_numbers: bool = True  # record_param_comms carries `Seq` (PyTorch 2.3+)
    clock_ms: dict[int, float] = field(default_factory=dict)  # rank -> how far ahead its host's clock runs
    detail: int = 0  # small operators (and kernels) per forward pass
    base_ns: int = BASE_NS  # the traces' times count from it

    def extra_ms(self, rank: int, step: int) -> float:
        return self.late.get(rank, {}).get(step, 0.0)


@dataclass
class _Rank:
    rank: int
    pid: int
    clock_ms: float = 0.0
    events: list[dict] = field(default_factory=list)
    correlation: int = 1_000_000  # CUPTI's ids are large by the time a profiled step runs

    def span(self, cat: str, name: str, tid: int | str, start_ms: float, dur_ms: float, **args) -> None:
        pid: int | str = self.pid if cat not in ("kernel", "gpu_memcpy", "gpu_memset") else 0
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": round((start_ms + self.clock_ms) * 1000, 3),
                "dur": round(dur_ms * 1000, 3),
                "args": args,
            }
        )

    def launch(self, cat: str, name: str, stream: int, start_ms: float, dur_ms: float, **args) -> None:
        """A GPU span and the cudaLaunchKernel (or cudaMemcpyAsync) that queued it 0.02 ms before."""
        self.correlation += 1
        call = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.span("cuda_runtime", call, MAIN_TID, start_ms - 0.02, 0.005, correlation=self.correlation)
        self.span(cat, name, stream, start_ms, dur_ms, device=0, stream=stream, correlation=self.correlation, **args)


LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _collective_args(job: Job, bucket: int, seq: int) -> dict:
    args = {
        "Collective name": "allreduce",
        "In msg nelems": GRAD_ELEMENTS[bucket],
        "Out msg nelems": GRAD_ELEMENTS[bucket],
        "dtype": "Float",
        "Group size": job.world,
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": json.dumps(list(range(job.world))),
    }
    return args | ({"Seq": seq} if job.sequence_numbers else {})


def _steps(job: Job) -> Iterator[list[_Rank]]:
    """Step by step, every rank with that step's events (and only those)."""
    ranks = [_Rank(r, 4000 + 17 * r, job.clock_ms.get(r, 0.0)) for r in range(job.world)]
    now = START_MS
    seq = 0
    for step in range(job.first_step, job.first_step + job.steps):
        step_start, start = now, now + job.loader_ms
        ready = [start + 0.5 + job.forward_ms + job.extra_ms(r.rank, step) for r in ranks]  # backward starts
        ends = []
        done_prev = 0.0
        for bucket, share in enumerate((0.5, 1.0)):
            arrive = [t + share * job.backward_ms for t in ready]
            end = max(max(arrive), done_prev) + job.transfer_ms[bucket] + job.slow_transfer.get(step, 0.0)
            ends.append((arrive, end))
            done_prev = end
        finish = done_prev + job.optimizer_ms
        for r, fwd_end in zip(ranks, ready):
            r.events = []
            r.span("user_annotation", f"ProfilerStep#{step}", MAIN_TID, step_start, finish + job.gap_ms - step_start)
            if job.loader_ms:
                r.span("user_annotation", LOADER, MAIN_TID, step_start + 0.01, job.loader_ms - 0.02)
            r.span("user_annotation", "## forward ##", MAIN_TID, start + 0.1, fwd_end - start - 0.1)
            r.span("cpu_op", "aten::linear", MAIN_TID, start + 0.2, fwd_end - start - 0.3)
            _detail(job, r, start + 0.2, fwd_end - start - 0.3)
            if job.gpu:
                r.launch(
                    "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", COMPUTE_STREAM, start + 0.1, 0.3, bytes=1 << 20
                )
                r.launch("kernel", "ampere_sgemm_128x64_tn", COMPUTE_STREAM, start + 0.5, fwd_end - start - 0.5)
                r.launch("kernel", "ampere_sgemm_64x64_nt", COMPUTE_STREAM, fwd_end, job.backward_ms)
            r.span("cpu_op", "autograd::engine::evaluate_function", BACKWARD_TID, fwd_end, job.backward_ms)
            for bucket, (arrive, end) in enumerate(ends):
                at = arrive[r.rank]
                args = _collective_args(job, bucket, seq + bucket)
                r.span("cpu_op", "record_param_comms", BACKWARD_TID, at - 0.05, 0.04, **args)
                op = "nccl:all_reduce" if job.gpu else "gloo:all_reduce"
                r.span("user_annotation", op, BACKWARD_TID, at - 0.045, 0.03)
                if job.gpu:
                    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
                    r.launch("kernel", kernel, COMM_STREAM, at, end - at, **args)
                else:
                    r.span("user_annotation", op, GLOO_TID, at, end - at)
            r.span("user_annotation", "Optimizer.step#SGD.step", MAIN_TID, done_prev, job.optimizer_ms)
            if job.gpu:
                r.launch("kernel", "multi_tensor_apply_kernel", COMPUTE_STREAM, done_prev, job.optimizer_ms)
        yield ranks
        seq += 2
        now = finish + job.gap_ms


def _detail(job: Job, r: _Rank, start_ms: float, dur_ms: float) -> None:
    """`job.detail` small operators inside the forward pass, as a real trace has hundreds: each an aten op
    holding a deeper one (three and four deep: below what tracelens keeps) and its kernel's launch."""
    if not job.detail:
        return
    each = dur_ms / job.detail
    for k in range(job.detail):
        at = start_ms + k * each
        r.span("cpu_op", "aten::add", MAIN_TID, at, each * 0.9, **{"Input Dims": [[1024, 1024], [1024, 1024]]})
        r.span("cpu_op", "aten::empty_strided", MAIN_TID, at + each * 0.1, each * 0.2)
        if job.gpu:
            r.launch("kernel", "vectorized_elementwise_kernel<4, add>", COMPUTE_STREAM, at + each * 0.5, each * 0.3)


def traces(job: Job) -> dict[int, str]:
    """Rank -> the text of its trace file."""
    events: dict[int, list[dict]] = {r: [] for r in range(job.world)}
    for ranks in _steps(job):
        for r in ranks:
            events[r.rank] += r.events
    return {rank: "".join(_lines(job, rank, [mine])) for rank, mine in events.items()}


def write(job: Job, rank: int, out: TextIO) -> None:
    """Rank `rank`'s trace, written to `out` a step at a time (a benchmark's gigabyte trace)."""
    for text in _lines(job, rank, ([r.events for r in ranks if r.rank == rank][0] for ranks in _steps(job))):
        out.write(text)


def _lines(job: Job, rank: int, steps: Iterable[list[dict]]) -> Iterator[str]:
    """Kineto's layout: the head's keys, one event a line in `traceEvents`, then the tail's keys."""
    head = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}] if job.gpu else [],
        "distributedInfo": {
            "backend": "nccl" if job.gpu else "gloo",
            "rank": rank,
            "world_size": job.world,
            "pg_count": 1,
            "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "pg_size": job.world, "ranks": list(range(job.world))}
            ],
            **({"nccl_version": "2.21.5"} if job.gpu else {}),
        },
    }
    tail = {
        "traceName": "synthetic: written by tracelens's generator (synth/kineto.py)",
        "baseTimeNanoseconds": job.base_ns,
    }
    yield "{\n"
    for key, value in head.items():
        yield f'  "{key}": {json.dumps(value)},\n'
    yield '  "traceEvents": [\n'
    separator = ""
    for events in steps:
        ordered = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
        yield separator + ",\n".join("  " + json.dumps(e) for e in ordered)
        separator = ",\n"
    yield "\n  ],\n"
    yield ",\n".join(f'  "{key}": {json.dumps(value)}' for key, value in tail.items())
    yield "\n}\n"


def step_ms(job: Job, step: int) -> tuple[float, float]:
    """When step `step` starts and ends, in ms after the base time (the same on every rank)."""
    spans = {}
    for ranks in _steps(job):
        first = ranks[0].events[0]  # the ProfilerStep span
        spans[int(first["name"].split("#")[1])] = (first["ts"] / 1000, (first["ts"] + first["dur"]) / 1000)
    return spans[step]


@dataclass(frozen=True)
class ProfilerTraces:
    """A story event (synth.runs): every rank writes its profiler trace (`job`'s ranks are the run's
    processes, in order) beside its host's logs, `node01/rank-0.pt.trace.json`; the steps a late rank
    slows are the story span "slow"."""

    job: Job

    def play(self, run) -> None:  # a synth.runs.Run (not imported: runs imports the story events)
        start = run.utc(run.now)
        job = replace(self.job, base_ns=int(start.timestamp()) * 10**9)
        for rank, text in traces(job).items():
            run.attach(f"{run.procs[rank].host.name}/rank-{rank}.pt.trace.json", text.encode())
        slow = sorted({step for steps in job.late.values() for step in steps})
        if slow:
            begin, end = step_ms(job, slow[0])[0], step_ms(job, slow[-1])[1]
            run.spans["slow"] = (run.now + begin / 1000, run.now + end / 1000)
        run.now += step_ms(job, job.first_step + job.steps - 1)[1] / 1000 + 1.0
