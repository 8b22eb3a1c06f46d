"""Large inputs for bench_scale.py whose message bodies vary from line to line.

Written with plain string formatting (no tracelens import, so writing is not what is measured), in the formats of
docs/formats/nccl.md as the generator (synth/) prints them: a 128-node x 8-GPU job's
launcher stdout (pdsh `host: ` prefixes). Every round is a new communicator's init on all
1,024 ranks (per-rank comm pointers, bootstrap addresses, trees, rings, channel connections,
init timings, proxy connections), then collective calls as NCCL_DEBUG_SUBSYS=COLL prints them
(one line per rank and call, distinct op counts and buffers) with DeepSpeed timer lines of
every rank and rank 0's `step=`, ThroughputTimer and Megatron `iteration` lines between them.

    python benchmarks/workloads.py nccl OUT.log --mb 1000
    python benchmarks/workloads.py deepspeed OUT.log --mb 500
    python benchmarks/workloads.py deepspeed-one-stream OUT.log --mb 1000   # every line node001, rank 0
    python benchmarks/workloads.py folder OUT_DIR --files 4096 --mb 400
    python benchmarks/workloads.py glued OUT.log --mb 250   # the nccl log with glued lines and free text
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

NODES, GPUS = 128, 8
RANKS = NODES * GPUS
BUS = ("1b000", "29000", "3d000", "4e000", "9b000", "ac000", "bc000", "dc000")
OPS = ("AllReduce", "AllGather", "ReduceScatter")
START = datetime(2026, 11, 30, 8, 0, 0)


class Job:
    """The ranks' processes and a clock; everything else is drawn per line."""

    def __init__(self, seed: int, nodes: int = NODES) -> None:
        self.rand = random.Random(seed)
        self.ranks = nodes * GPUS
        self.hosts = [f"node{n:03d}" for n in range(1, nodes + 1)]
        self.pids = [self.rand.randint(10_000, 990_000) for _ in range(self.ranks)]
        self.t = START
        self.op_count = 0
        self.step = 0

    def head(self, r: int, tid: int | None = None) -> str:
        host = self.hosts[r // GPUS]
        return f"{host}: {host}:{self.pids[r]}:{tid or self.pids[r]} [{r % GPUS}] NCCL INFO "

    def ip(self, r: int) -> str:
        n = r // GPUS + 1
        return f"10.{n // 250}.{n % 250}.{r % GPUS + 1}"

    def ptr(self) -> str:
        return f"0x{self.rand.getrandbits(44):x}"

    def init(self, r: int, comm_hash: str, nranks: int, order: list[int] | None = None) -> list[str]:
        """One rank's lines from Init START to its proxy connections: every body carries its own numbers.
        `order`: the communicator's ring (a new permutation of the ranks per communicator)."""
        rand = self.rand
        dev, ptr, tid = r % GPUS, self.ptr(), self.pids[r] + rand.randint(1, 900)
        ident = (f"ncclCommInitRank comm {ptr} rank {r} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {BUS[dev]} "
                 f"commId {comm_hash}")  # fmt: skip
        at = order.index(r) if order else r
        ring = order or list(range(nranks))
        nxt, prv, up = ring[(at + 1) % nranks], ring[(at - 1) % nranks], ring[(at - 1) // 2]
        t = [rand.random() * 2 for _ in range(8)]
        bodies = [
            f"{ident} - Init START",
            f"Bootstrap : Using eth0:{self.ip(r)}<0>",
            f"NET/IB : Using [0]mlx5_{dev % 4}:1/IB [1]mlx5_{(dev + 1) % 4}:1/IB [RO]; OOB eth0:{self.ip(r)}<0>",
            f"comm {ptr} rank {r} nRanks {nranks} nNodes {nranks // GPUS} localRanks {GPUS} localRank {dev} MNNVL 0",
            (
                f"Trees [0] {ring[(2 * at + 1) % nranks]}/{ring[(2 * at + 2) % nranks]}/-1->{r}->{up} [1] "
                f"{ring[(2 * at + 2) % nranks]}/-1/-1->{r}->{up}"
            ),
            f"Ring 00 : {prv} -> {r} -> {nxt}",
            f"Tree 1 : {up} -> {r} -> {ring[(2 * at + 1) % nranks]}/{ring[(2 * at + 2) % nranks]}/-1",
            f"Channel 00/0 : {r}[{dev}] -> {nxt}[{nxt % GPUS}] via P2P/IPC/read",
            f"Channel 01/0 : {r}[{dev}] -> {nxt}[{nxt % GPUS}] [send] via NET/IB/{dev % 4}/GDRDMA",
            f"Channel 01/0 : {prv}[{prv % GPUS}] -> {r}[{dev}] [receive] via NET/IB/{dev % 4}/GDRDMA",
            f"NCCL_IB_TIMEOUT set by environment to {rand.randint(18, 22)}.",
            f"Bootstrap timings total {rand.random():.6f} (create {rand.random() / 100:.6f}, "
            f"send {rand.random() / 100:.6f}, recv {rand.random():.6f}, ring "
            f"{rand.random() / 10:.6f}, delay {rand.random() / 1000:.6f})",
            f"New proxy send connection {rand.randint(0, 40)} from local rank {dev}, transport 2",
            f"Connected to proxy localRank {dev} -> connection {self.ptr()}",
            "Connected all rings, use ring PXN 0 GDR 1",
            f"threadThresholds 8/8/64 | {8 * nranks}/8/64 | 512 | 512",
            f"{ident} - Init COMPLETE",
            f"Init timings - ncclCommInitRank: rank {r} nranks {nranks} total {sum(t):.2f} (kernels {t[0]:.2f}, "
            f"alloc {t[1]:.2f}, bootstrap {t[2]:.2f}, allgathers {t[3]:.2f}, topo {t[4]:.2f}, graphs {t[5]:.2f}, "
            f"connections {t[6]:.2f}, rest {t[7]:.2f})",
        ]
        head = self.head(r, tid)
        return [head + b for b in bodies]

    def init_round(self) -> Iterator[str]:
        comm_hash = f"0x{self.rand.getrandbits(64):x}"
        ring = list(range(self.ranks))
        self.rand.shuffle(ring)  # each communicator its own ring
        printing = list(ring)
        self.rand.shuffle(printing)  # the ranks' lines interleave in any order
        for r in printing:
            yield from self.init(r, comm_hash, self.ranks, ring)

    def collectives(self, calls: int) -> Iterator[str]:
        rand = self.rand
        for _ in range(calls):
            op = OPS[self.op_count % 3]
            count = rand.choice((1_048_576, 4_194_304, 33_554_432)) + rand.randint(0, 4096)
            for r in range(self.ranks):
                buf = self.ptr()
                yield (f"{self.head(r)}{op}: opCount {self.op_count:x} sendbuff {buf} recvbuff {buf} count {count} "
                       f"datatype 9 op 0 root 0 comm {self.ptr()} [nranks={self.ranks}] "
                       f"stream {self.ptr()}")  # fmt: skip
            self.op_count += 1

    def stamp(self) -> str:
        return self.t.strftime("%Y-%m-%d %H:%M:%S,") + f"{self.t.microsecond // 1000:03d}"

    def training_step(self, every_rank: bool = True) -> Iterator[str]:
        """One optimizer step: DeepSpeed timers of every rank, rank 0's step/throughput lines,
        Megatron's iteration line."""
        rand = self.rand
        self.step += 1
        self.t += timedelta(milliseconds=900 + rand.random() * 200)
        host0 = self.hosts[0]
        for r in range(self.ranks if every_rank else 1):
            f, b, a = 300 + rand.random() * 50, 500 + rand.random() * 80, 120 + rand.random() * 30
            yield (f"{self.hosts[r // GPUS]}: [{self.stamp()}] [INFO] [logging.py:96:log_dist] [Rank {r}] time (ms) | "
                   f"fwd_microstep: {f:.2f} | bwd_microstep: {b + a:.2f} | bwd_inner_microstep: {b:.2f} | "
                   f"bwd_allreduce_microstep: {a:.2f} | step_microstep: {rand.random() * 40:.2f}")  # fmt: skip
        lr = 1e-4 * min(1.0, self.step / 500) * (1 + rand.random() * 1e-3)
        yield (f"{host0}: [{self.stamp()}] [INFO] [logging.py:96:log_dist] [Rank 0] step={self.step}, skipped=0, "
               f"lr=[{lr}, {lr}], mom=[(0.9, 0.95), (0.9, 0.95)]")  # fmt: skip
        yield (f"{host0}: [{self.stamp()}] [INFO] [timer.py:264:stop] "
               f"epoch=0/micro_step={self.step * 4}/global_step={self.step}, "
               f"RunningAvgSamplesPerSec={900 + rand.random() * 50}, CurrSamplesPerSec={900 + rand.random() * 80}, "
               f"MemAllocated=5.53GB, MaxMemAllocated=8.61GB")  # fmt: skip
        yield (f"{host0}:  iteration {self.step:8d}/ 1000000 | consumed samples: {self.step * 1024:12d} | "
               f"elapsed time per iteration (ms): {1000 + rand.random() * 100:.1f} | learning rate: {lr:.6E} | "
               f"global batch size:  1024 | lm loss: {2 + rand.random():.6E} | loss scale: 65536.0 | "
               f"grad norm: {rand.random() * 3:.3f} | number of skipped iterations:   0 | "
               f"number of nan iterations:   0 |")  # fmt: skip


INIT_LINES = 18  # lines of one rank's communicator init (Job.init)
ROUND_LINES = RANKS * INIT_LINES + 4 * (4 * RANKS + RANKS + 3)  # one round of nccl_lines: 38,924 lines


def nccl_lines(job: Job) -> Iterator[str]:
    """Rounds of init, collectives and training steps, without end: every round the same events."""
    while True:
        yield from job.init_round()
        for _ in range(4):
            yield from job.collectives(4)
            yield from job.training_step()


def deepspeed_lines(job: Job) -> Iterator[str]:
    """A DeepSpeed/Megatron-heavy log: one init, then steps with every rank's timers and a few collectives."""
    yield from job.init_round()
    while True:
        yield from job.training_step()
        yield from job.training_step()
        yield from job.collectives(1)


# Free text in NCCL records and in DeepSpeed's logger: words that vary from line to line, in no grammar
FREE_TEXT = (
    "Rank {r} loaded shard model-{n:05d}-of-00064.safetensors from s3://ckpt-{word}/run-{word2}/",
    "[job {word}] tensor layers.{n}.mlp.{word2} bucket ready after {x:.3f} s",
    "Checkpoint tag global_step{n} written by {word}-{word2} in {x:.2f} s",
)
# A WARN printed without its newline: the next line's text follows it on the same line
UNFINISHED = (
    "NET/IB : Got async event : port error",
    "Cuda failure 'out of memory'",
    "Call to ibv_reg_mr failed with error Cannot allocate memory",
)


def glued_lines(job: Job, every: int = 20) -> Iterator[str]:
    """The nccl log with, every `every` lines, a line glued onto an unfinished WARN of another rank of its
    node (NCCL's host:pid:tid prefix, DeepSpeed's logger stamp or a torchrun tag where the next line
    starts), and free-text NCCL and DeepSpeed records whose words vary from line to line."""
    rand = job.rand
    words = ["".join(rand.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(5000)]
    for n, line in enumerate(nccl_lines(job)):
        if n % every:
            yield line
            continue
        r = rand.randrange(job.ranks)
        host = job.hosts[r // GPUS]
        pick = n // every % 4
        if pick == 3:
            text = rand.choice(FREE_TEXT).format(
                r=r, n=rand.randrange(10_000), word=rand.choice(words), word2=rand.choice(words), x=rand.random() * 9
            )
            yield (
                job.head(r) + text
                if n // every // 4 % 2
                else f"{host}: [{job.stamp()}] [INFO] [engine.py:3417:_save] {text}"
            )
            yield line
            continue
        warn = job.head(r).replace("NCCL INFO", "NCCL WARN") + rand.choice(UNFINISHED)
        tail = line.split(": ", 1)[1] if line.startswith(f"{job.hosts[0][:4]}") else line
        if pick == 1 and "NCCL INFO" in line:
            tail = f"[default{r % GPUS}]:" + tail
        yield warn + tail


def one_stream(lines: Iterator[str]) -> Iterator[str]:
    """The lines all on one host and rank (`node001: `, `[Rank 0]`): one stream of millions of step
    records, the shape that once held a stream whole (benchmarks/README.md)."""
    host, rank = re.compile(r"^node\d+: "), re.compile(r"\[Rank \d+\]")
    for line in lines:
        yield rank.sub("[Rank 0]", host.sub("node001: ", line, count=1))


def write(path: Path, lines: Iterator[str], size: int) -> int:
    written = 0
    with path.open("w") as out:
        while written < size:
            block = "\n".join(next(lines) for _ in range(20_000)) + "\n"
            out.write(block)
            written += len(block)
    return written


def write_folder(folder: Path, files: int, size: int, seed: int = 3) -> None:
    """`files` per-rank logs (as NCCL_DEBUG_FILE writes them, no launcher prefix) of one job, `size` bytes in all."""
    nodes = files // GPUS
    job = Job(seed, nodes=nodes)
    per_file = size // files
    comm_hash = f"0x{job.rand.getrandbits(64):x}"
    for r in range(files):
        node = folder / job.hosts[r // GPUS]
        node.mkdir(parents=True, exist_ok=True)
        lines = job.init(r, comm_hash, job.ranks)
        written = sum(len(x) for x in lines)
        while written < per_file:
            for _ in range(50):
                buf = job.ptr()
                lines.append(f"{job.head(r)}AllReduce: opCount {job.op_count:x} sendbuff {buf} recvbuff {buf} "
                             f"count 4194304 datatype 9 op 0 root 0 comm {job.ptr()} [nranks={job.ranks}] "
                             f"stream {job.ptr()}")  # fmt: skip
                written += len(lines[-1])
                job.op_count += 1
        text = "\n".join(line.split(": ", 1)[1] for line in lines) + "\n"  # NCCL_DEBUG_FILE: no pdsh prefix
        (node / f"nccl.{job.hosts[r // GPUS]}.{job.pids[r]}").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["nccl", "deepspeed", "deepspeed-one-stream", "folder", "glued"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--mb", type=int, default=1000)
    parser.add_argument("--files", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.what == "folder":
        write_folder(args.out, args.files, args.mb << 20, args.seed)
    else:
        makers = {"nccl": nccl_lines, "glued": glued_lines}
        lines = makers.get(args.what, deepspeed_lines)(Job(args.seed))
        write(args.out, one_stream(lines) if args.what == "deepspeed-one-stream" else lines, args.mb << 20)


if __name__ == "__main__":
    main()
