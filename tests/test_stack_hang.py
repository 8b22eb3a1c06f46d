"""TL424: a hang read from the ranks' stack dumps alone (no Flight Recorder dump, no watchdog).

The runs here are synthetic: py-spy dumps and DeepSpeed step lines written by the tests, shaped
like a real 4-rank ZeRO-2 job on two hosts whose rank 2 issued an all_reduce the others never
issue. The real lab runs (fixtures/lab-hang-*) check that TL424 agrees with what was injected
once their Flight Recorder dumps are taken away, and stays silent while those speak.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, corpus_dir, fire, tables_from
from tracelens.analyze import analyze
from tracelens.derived import hangs
from tracelens.ingest import InputFile, textlog
from tracelens.report.summary import verdict

HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
LAST_STEP = datetime(2026, 3, 2, 9, 15, 30, 868000, tzinfo=timezone.utc)
COMM = [
    ("all_reduce", "torch/distributed/distributed_c10d.py:3252"),
    ("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py:83"),
]
ZERO2_BUCKET = [
    *COMM,
    ("TorchBackend.all_reduce", "deepspeed/comm/torch.py:290"),
    ("timed_op.<locals>.log_wrapper", "deepspeed/comm/comm.py:129"),
    ("DeepSpeedZeroOptimizer.allreduce_bucket", "deepspeed/runtime/zero/stage_1_and_2.py:2384"),
    ("DeepSpeedZeroOptimizer.reduce_ipg_grads", "deepspeed/runtime/zero/stage_1_and_2.py:2229"),
    (
        "DeepSpeedZeroOptimizer.create_gradient_handling_hooks.<locals>.wrapper.<locals>.grad_handling_hook",
        "deepspeed/runtime/zero/stage_1_and_2.py:1372",
    ),
    ("_engine_run_backward", "torch/autograd/graph.py:979"),
    ("Tensor.backward", "torch/_tensor.py:623"),
    ("DeepSpeedEngine.backward", "deepspeed/runtime/engine.py:3428"),
    ("instrument_w_nvtx.<locals>.wrapped_fn", "deepspeed/utils/nvtx.py:33"),
    ("main", "train.py:130"),
    ("<module>", "train.py:149"),
]
EXTRA_ALL_REDUCE = [*COMM, ("extra_all_reduce", "job.py:113"), ("main", "train.py:128"), ("<module>", "train.py:149")]
DATA_LOADER = [
    ("_next_data", "torch/utils/data/dataloader.py:1480"),
    ("__next__", "torch/utils/data/dataloader.py:733"),
    ("main", "train.py:121"),
    ("<module>", "train.py:149"),
]

# ZeRO-3: a parameter's all-gather waited for under the model's forward; the gradients'
# reduce-scatter under backward
ZERO3_FORWARD = [
    ("instrument_w_nvtx.<locals>.wrapped_fn", "deepspeed/utils/nvtx.py:33"),
    ("AllGatherCoalescedHandle.wait", "deepspeed/runtime/zero/partition_parameters.py:921"),
    ("PartitionedParameterCoordinator.fetch_sub_module", "deepspeed/runtime/zero/partitioned_param_coordinator.py:404"),
    ("DeepSpeedZeRoOffload._pre_forward_module_hook", "deepspeed/runtime/zero/parameter_offload.py:380"),
    ("Module._call_impl", "torch/nn/modules/module.py:1779"),
    ("Net.forward", "job.py:60"),
    ("main", "train.py:126"),
    ("<module>", "train.py:149"),
]
ZERO3_BACKWARD = [
    ("reduce_scatter_tensor", "torch/distributed/distributed_c10d.py:4688"),
    ("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py:83"),
    ("reduce_scatter_fn", "deepspeed/comm/comm.py:301"),
    ("reduce_scatter_coalesced", "deepspeed/runtime/comm/coalesced_collectives.py:128"),
    ("DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads", "deepspeed/runtime/zero/stage3.py:1487"),
    ("DeepSpeedZeroOptimizer_Stage3.reduce_partition_and_remove_grads", "deepspeed/runtime/zero/stage3.py:1601"),
    ("_engine_run_backward", "torch/autograd/graph.py:979"),
    ("main", "train.py:130"),
    ("<module>", "train.py:149"),
]
# DDP: the gradients' all-reduce waited for in C++, under the autograd engine
DDP_BACKWARD = [
    ("_engine_run_backward", "torch/autograd/graph.py:979"),
    ("backward", "torch/autograd/__init__.py:395"),
    ("Tensor.backward", "torch/_tensor.py:623"),
    ("main", "train_ddp.py:71"),
    ("<module>", "train_ddp.py:120"),
]


def pyspy(rank: int, frames: list[tuple[str, str]], state: str = "idle") -> str:
    """`py-spy dump --pid` of one rank's process (synthetic: the command names no real job)."""
    pid = 4000 + rank
    head = [f"Process {pid}: python synthetic_train.py", "Python v3.11.7 (/usr/bin/python3.11)", ""]
    return "\n".join([*head, f'Thread {pid} ({state}): "MainThread"', *(f"    {n} ({f})" for n, f in frames)]) + "\n"


def step_lines(rank: int, last: int = 29) -> str:
    """DeepSpeed's step lines of one rank, one step every 0.7 s up to `last` (synthetic)."""
    lines = []
    for step in range(last - 9, last + 1):
        at = LAST_STEP - timedelta(seconds=0.7 * (last - step)) + timedelta(milliseconds=rank)
        stamp = f"{at:%Y-%m-%d %H:%M:%S},{at.microsecond // 1000:03d}"
        lines.append(
            f"[{stamp}] [INFO] [logging.py:123:log_dist] [Rank {rank}] step={step}, skipped=0, lr=[0.0001], "
            "mom=[(0.9, 0.999)]"
        )
        lines.append(f"[Rank {rank}] time (ms) | fwd: 120.00 | bwd: 470.00 | bwd_allreduce: 8.00 | step: 100.00")
    return "\n".join(lines) + "\n"


def job(tmp_path: Path, dumps: dict[int, list[tuple[str, str]]], state: str = "idle") -> Path:
    """A 4-rank run on two hosts: every rank's log, and the py-spy dumps of the ranks given."""
    for rank, host in HOSTS.items():
        (tmp_path / host).mkdir(exist_ok=True)
        (tmp_path / host / f"rank{rank}.log").write_text(step_lines(rank))
        if rank in dumps:
            (tmp_path / host / f"pyspy-rank{rank}.txt").write_text(pyspy(rank, dumps[rank], state))
    return tmp_path


def tl424(run: Path):
    analysis = analyze(run)
    found = [f for f in analysis.findings if f.rule_id == "TL424"]
    return found, analysis


def test_a_rank_in_a_collective_the_others_never_issue_is_the_desync(tmp_path):
    run = job(tmp_path, {0: ZERO2_BUCKET, 1: ZERO2_BUCKET, 2: EXTRA_ALL_REDUCE, 3: ZERO2_BUCKET})
    (hang,), analysis = tl424(run)
    assert hang.ranks == [2] and hang.hosts == ["node-b"]
    assert hang.title == (
        "Hang: rank 2 (node-b) waits in all_reduce at extra_all_reduce (job.py:113), "
        "a collective the other ranks never reach"
    )
    assert "rank 2 (node-b) waits in all_reduce issued by extra_all_reduce (job.py:113), outside forward" in (
        hang.summary
    )
    assert (
        "ranks 0, 1 and 3 (node-a and node-b) wait in all_reduce issued by DeepSpeedZeroOptimizer.allreduce_bucket "
        "(deepspeed/runtime/zero/stage_1_and_2.py:2384), in backward" in hang.summary
    )
    assert "a desync" in hang.summary and "last step is 29" in hang.summary
    assert hang.window[0] == LAST_STEP + timedelta(milliseconds=3)  # the last rank's last step line
    assert hang.evidence[0].location == "node-b/pyspy-rank2.txt:4" and "extra_all_reduce (job.py:113)" in (
        hang.evidence[0].text
    )
    assert any(e.file == "node-a/pyspy-rank0.txt" and "allreduce_bucket" in e.text for e in hang.evidence)
    top = verdict(analysis)
    assert top.headline == hang.title and top.severity == "critical"


def test_zero3_rank_in_a_forward_all_gather_while_the_others_reduce_scatter(tmp_path):
    (hang,), _ = tl424(job(tmp_path, {0: ZERO3_BACKWARD, 1: ZERO3_BACKWARD, 2: ZERO3_FORWARD, 3: ZERO3_BACKWARD}))
    assert hang.ranks == [2]
    assert "rank 2 (node-b) waits in all_gather issued by AllGatherCoalescedHandle.wait" in hang.summary
    assert "wait in reduce_scatter_tensor issued by reduce_scatter_coalesced" in hang.summary
    assert "partition_parameters.py:921), in forward" in hang.summary and "in backward" in hang.summary


def test_ddp_ranks_idle_in_backward_wait_for_the_rank_that_issued_an_extra_all_reduce(tmp_path):
    (hang,), _ = tl424(job(tmp_path, {0: DDP_BACKWARD, 1: EXTRA_ALL_REDUCE, 2: DDP_BACKWARD, 3: DDP_BACKWARD}))
    assert hang.ranks == [1] and hang.hosts == ["node-a"]
    assert (
        "ranks 0, 2 and 3 (node-a and node-b) wait in the gradients' all_reduce (DDP, in backward's C++) issued by "
        "main (train_ddp.py:71), in backward" in hang.summary
    )


def test_ranks_busy_in_backward_are_not_waiting(tmp_path):
    """On the CPU (py-spy: active) in backward is own work, not a wait: too few ranks wait for a verdict."""
    found, _ = tl424(job(tmp_path, {0: DDP_BACKWARD, 1: EXTRA_ALL_REDUCE, 2: DDP_BACKWARD}, state="active"))
    assert found == []


def test_every_rank_at_the_same_call_site_blames_no_rank(tmp_path):
    (hang,), _ = tl424(job(tmp_path, dict.fromkeys(HOSTS, ZERO2_BUCKET)))
    assert hang.ranks == [] and hang.hosts == ["node-a", "node-b"]
    assert hang.title == (
        "Hang: every dumped rank waits in all_reduce at DeepSpeedZeroOptimizer.allreduce_bucket "
        "(deepspeed/runtime/zero/stage_1_and_2.py:2384)"
    )
    assert "the hang is in that collective (the network, or a peer outside the dumps)" in hang.summary


def test_a_rank_missing_from_the_dumps_is_named_when_the_others_agree(tmp_path):
    (hang,), _ = tl424(job(tmp_path, {0: ZERO2_BUCKET, 1: ZERO2_BUCKET, 3: ZERO2_BUCKET}))
    assert hang.ranks == [] and "rank 2 of the job left no stack dump" in hang.summary


def test_a_rank_in_no_collective_is_the_one_the_others_wait_for(tmp_path):
    (hang,), _ = tl424(job(tmp_path, {0: ZERO2_BUCKET, 1: ZERO2_BUCKET, 2: DATA_LOADER, 3: ZERO2_BUCKET}))
    assert hang.ranks == [2] and hang.hosts == ["node-b"]
    assert hang.title == (
        "Hang: rank 2 (node-b) is in no collective (the data loader: main (train.py:121)) while the others wait in one"
    )
    assert "stuck outside communication" in hang.summary and "DataLoader(timeout=...)" in hang.fix


def test_one_rank_dump_gives_no_verdict(tmp_path):
    found, _ = tl424(job(tmp_path, {2: EXTRA_ALL_REDUCE}))
    assert found == []


def test_a_run_without_dumps_has_no_stack_hang(tmp_path):
    found, analysis = tl424(job(tmp_path, {}))
    assert found == [] and "TL424" in {r.id for r, _ in analysis.not_run}


def test_dumps_taken_while_steps_went_on_are_no_hang():
    """Dumps timed before the last step caught a running job: ranks in collectives at that instant."""
    at = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
    frames = frames_of(COMM)
    dumps = [{"rank": r, "tool": "py-spy", "thread_name": "MainThread", "frames": frames, "ts": at} for r in (0, 1)]
    steps = [{"rank": 0, "step": 5, "ts": at - timedelta(seconds=1)}]
    assert len(fire(tables_from(stacks=dumps, steps=steps), "TL424")) == 1
    steps.append({"rank": 0, "step": 6, "ts": at + timedelta(seconds=1)})
    assert fire(tables_from(stacks=dumps, steps=steps), "TL424") == []


def frames_of(spec: list[tuple[str, str]]) -> list[dict]:
    """The stacks table's frames of (name, `file:line` or a native library) pairs, innermost first."""
    frames = []
    for name, where in spec:
        m = re.fullmatch(r"(?P<file>.*):(?P<line>\d+)", where)
        file, line = (m["file"], int(m["line"])) if m else (where, None)
        frames.append({"name": name, "filename": file, "line": line, "native": m is None})
    return frames


NATIVE_RECV = [
    ("pthread_cond_timedwait", "libc.so.6"),
    ("c10d::ProcessGroupGloo::RecvWork::wait", "libtorch_cpu.so"),
    ("DeepSpeedEngine.step", "deepspeed/runtime/engine.py:2400"),
]


@pytest.mark.parametrize(
    ("spec", "collective", "site", "phase"),
    [
        (ZERO2_BUCKET, "all_reduce", "DeepSpeedZeroOptimizer.allreduce_bucket", "backward"),
        (ZERO3_FORWARD, "all_gather", "AllGatherCoalescedHandle.wait", "forward"),
        (
            [("wait", "deepspeed/runtime/zero/partition_parameters.py:921"), *ZERO3_FORWARD[2:]],
            "all_gather",
            "wait",
            "forward",
        ),
        (ZERO3_BACKWARD, "reduce_scatter_tensor", "reduce_scatter_coalesced", "backward"),
        (NATIVE_RECV, "recv", "DeepSpeedEngine.step", "optimizer step"),  # py-spy --native: only C++ names it
        (EXTRA_ALL_REDUCE, "all_reduce", "extra_all_reduce", None),
        (DATA_LOADER, None, None, None),
    ],
)
def test_what_a_stack_waits_in_where_and_in_which_phase(spec, collective, site, phase):
    frames = frames_of(spec)
    assert hangs.collective(frames) == collective
    assert hangs.phase(frames) == phase
    if collective:
        assert hangs.collective_site(frames)["name"] == site


LAB = sorted(p for p in FIXTURES.glob("lab-hang-*") if (p / "expected.json").is_file())


@pytest.mark.parametrize("folder", LAB, ids=lambda p: p.name)
def test_real_lab_runs_agree_with_what_was_injected(folder, tmp_path, analysis_of):
    """With its Flight Recorder dumps the run is TL420-TL422's (TL424 is silent); without them,
    TL424 names the injected rank and where it stopped wherever every rank left a stack dump."""
    assert not [f for f in analysis_of(folder).findings if f.rule_id == "TL424"]
    run = tmp_path / folder.name
    shutil.copytree(folder, run, ignore=shutil.ignore_patterns("fr_trace*", "torchfrtrace*"))
    found, _ = tl424(run)
    hang = json.loads((folder / "expected.json").read_text()).get("hang")
    if not list(folder.glob("rank*/pyspy*")):
        assert found == []
        return
    (finding,) = found
    assert finding.ranks == [hang["rank"]] and hang["stopped_frame"] in finding.title


def test_real_dumps_of_the_corpus_wait_where_they_say():
    """A faulthandler dump stuck in broadcast and a py-spy --native dump stuck in a gloo recv."""
    folder = corpus_dir("host/hang")
    seen = {}
    for path in sorted(folder.glob("*.txt")):
        stacks = textlog.ingest(InputFile(path, path.name, "log")).tables["stacks"]
        seen[path.name.split("_")[0]] = {hangs.collective(f) for f in stacks["frames"].to_list()} - {None}
    assert seen["sglang3709"] == {"broadcast"}
    assert seen["sglang17941"] == {"recv"}
    assert seen["verl7180"] == set()


def test_the_report_shows_where_each_rank_waits(tmp_path):
    from tracelens.report.html import render

    run = job(tmp_path, {0: ZERO2_BUCKET, 1: ZERO2_BUCKET, 2: EXTRA_ALL_REDUCE, 3: ZERO2_BUCKET})
    html = render(analyze(run))
    section = html.split('id="hang"')[1].split("</section>")[0]
    assert "<td>2</td><td>waits in all_reduce</td><td><code>extra_all_reduce (job.py:113)</code></td><td></td>" in (
        section
    )
    assert section.count("<td>backward</td>") == 3 and "Process group" not in section


def test_the_title_of_a_hang_on_many_hosts_names_a_few_and_counts_the_rest(tmp_path):
    """Thousands of ranks' dumps: the title lists ranks as runs and at most eight hosts, not every host
    (a 3,000-rank job's title named 375 of them)."""
    for rank in range(30):
        host = tmp_path / f"node{rank:02d}"
        host.mkdir()
        (host / f"pyspy-rank{rank}.txt").write_text(pyspy(rank, EXTRA_ALL_REDUCE if rank >= 18 else ZERO2_BUCKET))
    (hang,), _ = tl424(tmp_path)
    assert hang.ranks == list(range(18, 30))
    assert hang.title.startswith(
        "Hang: ranks 18-29 (node18, node19, node20, node21, node22, node23, node24 and 5 more) wait"
    )
