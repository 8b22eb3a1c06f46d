"""TL420-TL423 and TL411 on hung runs: the real lab runs (fixtures/lab-hang-*, torch 2.13 gloo)
name the right rank, process group, sequence id and frame; the healthy run gives no hang finding."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pytest

from tests.helpers import FIXTURES, fire, tables_from
from tests.helpers.hangs import stuck_entries
from tracelens.analyze import analyze

LAB = sorted(p for p in FIXTURES.glob("lab-hang-*") if (p / "expected.json").is_file())
HANG_RULES = {"TL420", "TL421", "TL422", "TL423"}


def _by_rule(analysis) -> dict:
    return {f.rule_id: f for f in analysis.findings}


@pytest.mark.parametrize("folder", LAB, ids=lambda p: p.name)
def test_real_lab_run_fires_its_hang_rules(folder, analysis_of):
    expected = json.loads((folder / "expected.json").read_text())
    assert expected["real"] is True and "real run" in (folder / "README.md").read_text()
    assert {f.rule_id for f in analysis_of(folder).findings} & HANG_RULES == set(expected["rules"])


@pytest.mark.parametrize(
    "folder", [p for p in LAB if "hang" in json.loads((p / "expected.json").read_text())], ids=lambda p: p.name
)
def test_hung_collective_names_rank_group_seq_and_frame(folder, analysis_of):
    hang = json.loads((folder / "expected.json").read_text())["hang"]
    found = _by_rule(analysis_of(folder))
    tl420 = found["TL420"]
    assert f"#{hang['seq']} of process group {hang['pg']}" in tl420.title
    assert hang["frame"] in tl420.summary
    stopped = hang.get("stopped_rank", hang["rank"])
    assert found["TL422"].ranks == [stopped]
    if "stopped_frame" in hang:
        assert hang["stopped_frame"] in found["TL422"].title


def test_skip_names_rank_2_missing_from_group_1_and_the_consequence_in_group_0(analysis_of):
    found = _by_rule(analysis_of(FIXTURES / "lab-hang-skip"))
    assert found["TL420"].ranks == [2]
    assert (
        "ranks 0, 1 and 3 from train" in found["TL420"].summary and "rank 2 never started it" in found["TL420"].summary
    )
    assert "#25 of process group 0 (default_pg), where rank 2 waits" in found["TL420"].summary
    assert "gloo:all_reduce #25 of process group 0" in found["TL422"].summary


def test_size_mismatch_is_a_desync_with_both_call_sites(analysis_of):
    found = _by_rule(analysis_of(FIXTURES / "lab-hang-size"))
    desync = found["TL421"]
    assert desync.ranks == [2] and "#21 of process group 0" in desync.title
    assert "[[8199]]" in desync.summary and "[[128,64]]" in desync.summary
    assert desync.summary.count("worker.py:103") == 2
    assert "gloo::EnforceNotMet" in found["TL422"].summary and "left no Flight Recorder dump" in found["TL422"].summary


def test_sleeping_data_loader_is_where_rank_2_stopped(analysis_of):
    stop = _by_rule(analysis_of(FIXTURES / "lab-hang-sleep"))["TL422"]
    assert stop.title == "Rank 2 stopped first, in the data loader: Loader.next_batch (worker.py:47)"
    assert stop.evidence[0].file == "rank2/pyspy_native_rank2.txt" or stop.evidence[0].file == "rank2/pyspy_rank2.txt"


def test_killed_rank_has_no_dump_and_no_stack(analysis_of):
    found = _by_rule(analysis_of(FIXTURES / "lab-hang-kill"))
    assert "rank 2 left no Flight Recorder dump" in found["TL420"].summary
    assert "it raised on ranks 0, 1 and 3" in found["TL420"].summary
    assert "no dump, stack or traceback" in found["TL422"].summary


def test_the_analyzer_text_alone_names_the_same_hang(tmp_path):
    (tmp_path / "torchfrtrace.txt").write_bytes((FIXTURES / "lab-hang-sleep" / "torchfrtrace.txt").read_bytes())
    found = {f.rule_id: f for f in analyze(tmp_path).findings}
    assert found["TL420"].ranks == [2] and "#21 of process group 0" in found["TL420"].title
    assert found["TL422"].ranks == [2]


def test_tl411_uses_the_dumps_when_present(tmp_path):
    """The synthetic watchdog hang names no rank from its logs; synthetic dumps of the same job name rank 5."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "watchdog-hang", run)
    before = [f for f in analyze(run).findings if f.rule_id == "TL411"][0]
    assert before.ranks == []
    t0 = 1_733_510_000_000_000_000
    for rank in range(8):
        entries = [
            {
                "record_id": s,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": s,
                "p2p_seq_id": 0,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": t0 + s * 10**9,
                "input_sizes": [[4096]],
                "output_sizes": [[4096]],
                "state": "completed" if s < 1583 else "started",
                "frames": [],
            }
            for s in range(1580, 1584 if rank != 5 else 1583)
        ]
        dump = {
            "version": "2.4",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(8)))}},
            "entries": entries,
        }
        (run / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
    after = [f for f in analyze(run).findings if f.rule_id == "TL411"][0]
    assert after.ranks == [5] and "Flight Recorder" in after.summary


def _stuck_run(**extra):
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    rows = stuck_entries(t0)
    return tables_from(fr_entries=rows, **extra), t0


def test_tl423_names_network_errors_in_the_minute_before_the_stop():
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    err = {
        "host": "node02",
        "kind": "ib_completion",
        "status_name": "transport retry counter exceeded",
        "message": "NET/IB : Got completion with error 12",
        "ts": t0,
        "ts_lo": t0,
        "ts_hi": t0,
    }
    tables, _ = _stuck_run(nccl_errors=[err])
    (finding,) = fire(tables, "TL423")
    assert (
        finding.ranks == [1]
        and "IB completion (transport retry counter exceeded)" in finding.summary
        and finding.hosts == ["node02"]
    )
    quiet, _ = _stuck_run()
    assert fire(quiet, "TL423") == []
    assert fire(quiet, "TL422")[0].ranks == [1]


def test_healthy_dump_has_no_hang_finding(analysis_of):
    found = analysis_of(FIXTURES / "lab-hang-healthy").findings
    assert not [f for f in found if f.rule_id in HANG_RULES | {"TL411"}]


@pytest.mark.parametrize(
    "frames,exception,kind",
    [
        ([("save", "torch/serialization.py"), ("save_checkpoint", "/job/train.py")], None, "a checkpoint write"),
        (
            [
                ("_next_data", "torch/utils/data/dataloader.py"),
                ("__next__", "torch/utils/data/dataloader.py"),
                ("train", "/job/train.py"),
            ],
            None,
            "the data loader",
        ),
        ([("all_reduce", "torch/distributed/distributed_c10d.py"), ("step", "/job/train.py")], None, "a collective"),
        ([("forward", "/job/model.py")], "ValueError: nan loss", "an exception (ValueError: nan loss)"),
        ([("forward", "/job/model.py")], None, "Python code"),
    ],
)
def test_where_a_rank_was(frames, exception, kind):
    from tracelens.derived.hangs import call_site, where_kind

    rows = [{"name": n, "filename": f, "line": 1} for n, f in frames]
    assert where_kind(rows, exception) == kind
    assert call_site(rows)["filename"].startswith("/job/")


@pytest.mark.parametrize("column,odd,what", [("op", "broadcast", "op"), ("input_dtypes", '["BFloat16"]', "dtypes")])
def test_desync_of_op_or_dtype_fires_and_equal_ranks_do_not(column, odd, what):
    rows = [
        {
            "rank": r,
            "pg_name": "0",
            "collective_seq_id": 7,
            "op": "all_reduce",
            "input_sizes": "[[8]]",
            "input_dtypes": '["Float"]',
            "is_p2p": False,
            "status": "started",
            "encoding": "pickle",
            "record_id": 7,
            "frames": [{"name": "step", "filename": f"/job/train_{r}.py", "line": 10 + r}],
        }
        for r in range(4)
    ]
    assert fire(tables_from(fr_entries=rows), "TL421") == []
    rows[3] = {**rows[3], column: odd}
    (finding,) = fire(tables_from(fr_entries=rows), "TL421")
    assert finding.ranks == [3] and f"another {what}" in finding.title
    assert "/job/train_3.py:13" in finding.summary and "/job/train_0.py:10" in finding.summary


def _p2p_rows(peer_posted: bool, completed: bool = False):
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    base = {
        "pg_name": "2",
        "pg_desc": "pp_group",
        "is_p2p": True,
        "encoding": "pickle",
        "input_sizes": "[[4, 1024]]",
        "frames": [],
    }
    rows = [
        {
            **base,
            "rank": 0,
            "record_id": 1,
            "p2p_seq_id": 1,
            "op": "send",
            "profiling_name": "nccl:send 0->1",
            "status": "completed",
            "ts": t0,
        },
        {
            **base,
            "rank": 1,
            "record_id": 1,
            "p2p_seq_id": 1,
            "op": "recv",
            "profiling_name": "nccl:recv 1<-0",
            "status": "completed",
            "ts": t0,
        },
        {
            **base,
            "rank": 0,
            "record_id": 2,
            "p2p_seq_id": 2,
            "op": "send",
            "profiling_name": "nccl:send 0->1",
            "status": "completed" if completed else "started",
            "ts": t0 + timedelta(seconds=1),
        },
    ]
    if peer_posted:
        rows.append(
            {
                **base,
                "rank": 1,
                "record_id": 2,
                "p2p_seq_id": 2,
                "op": "recv",
                "profiling_name": "nccl:recv 1<-0",
                "status": "completed" if completed else "started",
                "ts": t0 + timedelta(seconds=1),
            }
        )
    return tables_from(fr_entries=rows)


def test_a_send_whose_peer_never_posted_the_recv():
    (hang,) = fire(_p2p_rows(peer_posted=False), "TL420")
    assert (
        hang.ranks == [1]
        and "send #2 of process group 2 (pp_group)" in hang.title
        and "rank 1 never started it" in hang.summary
    )
    assert fire(_p2p_rows(peer_posted=False), "TL422")[0].ranks == [1]
    (both,) = fire(_p2p_rows(peer_posted=True), "TL420")
    assert "never joined" not in both.title and both.ranks == [0, 1]
    assert fire(_p2p_rows(peer_posted=True, completed=True), "TL420") == []


def test_a_pyspy_dump_without_a_rank_gets_it_from_nccl_pids():
    from tracelens.derived.hangs import stacks

    frames = [
        {"name": "_next_data", "filename": "torch/utils/data/dataloader.py", "line": 1, "native": False},
        {"name": "train", "filename": "/job/train.py", "line": 7, "native": False},
    ]
    tables = tables_from(
        stacks=[
            {"pid": 4242, "host": "node02", "tool": "py-spy", "thread_name": "MainThread", "frames": frames},
            {"pid": 4242, "host": "node01", "tool": "py-spy", "thread_name": "MainThread", "frames": frames},
        ],
        nccl_comms=[
            {"pid": 4242, "host": "node02", "rank": 13, "nranks": 16},
            {"pid": 4242, "host": "node02", "rank": 1, "nranks": 2},
            {"pid": 4242, "host": "node01", "rank": 4, "nranks": 16},
        ],
    )
    assert stacks(tables)["rank"].to_list() == [13, 4]


def test_ranks_are_listed_as_a_person_writes_them():
    from tracelens.prose import ranks_text as who

    assert [who([2]), who([0, 1, 3]), who(list(range(64))), who([3, 0, 2, 1, 1])] == [
        "rank 2",
        "ranks 0, 1 and 3",
        "ranks 0-63",  # runs of three or more in a row, as in a hang of a whole job
        "ranks 0-3",  # sorted, each once
    ]
    assert who([*range(4), 7, 9, 10, 11, 40, 42, *range(44, 50)], limit=4) == "ranks 0-3, 7, 9-11 and 8 more"
    assert who([0, 1, 2, 3, 7, 9, 10, 11, 40, 42, 44, 46], limit=4) == "ranks 0-3, 7, 9-11 and 4 more"  # ranks
