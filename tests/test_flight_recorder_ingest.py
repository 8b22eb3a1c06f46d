"""Flight Recorder dumps: the real torch 2.13 gloo dumps of fixtures/lab-hang-*, the format
versions torch 2.13 cannot write (synthetic, from the documented field lists), a dump printed as
a Python dict, and pickles that ask to run something (refused, nothing runs, the run goes on)."""

from __future__ import annotations

import json
import os
import pickle
import pprint
import shutil
from pathlib import Path

import pytest

from tests.helpers import FIXTURES
from tracelens.analyze import analyze
from tracelens.ingest import InputFile, sniff_format
from tracelens.ingest.hangs import flight_recorder as fr
from tracelens.ingest.hangs import safe_pickle

SKIP = FIXTURES / "lab-hang-skip"


def _read(path: Path, name: str | None = None):
    source = InputFile(path, name or path.name, sniff_format(path.read_bytes()[:65536]))
    assert source.format == "flight_recorder"
    return fr.ingest(source)


def test_real_gloo_pickle_is_read_without_torch():
    result = _read(SKIP / "rank2" / "fr_trace_rank_2", "rank2/fr_trace_rank_2")
    rows = result.tables["fr_entries"]
    assert result.account.errors == [] and result.account.parsed == rows.height == 30
    assert set(rows["rank"]) == {2} and set(rows["version"]) == {"2.10"} and set(rows["backend"]) == {"gloo"}
    last = rows.filter(rows["pg_id"] == 0).sort("collective_seq_id").row(-1, named=True)
    # torch 2.13 gloo: state stays "scheduled"; pg_status says #25 was enqueued, #24 completed
    assert (last["collective_seq_id"], last["state"], last["status"], last["input_sizes"]) == (
        25,
        "scheduled",
        "scheduled",
        "[[128,64]]",
    )
    assert [(f["name"], f["line"]) for f in last["frames"]][2] == ("train", 103)
    groups = result.tables["fr_groups"].sort("pg_id")
    assert groups["last_completed"].to_list() == [24, 5] and groups["last_enqueued"].to_list() == [25, 5]
    assert groups["ranks"].null_count() == 2  # gloo writes an empty pg_config


def test_real_json_dump_matches_the_pickle_but_has_no_frames():
    pkl = _read(SKIP / "rank0" / "fr_trace_rank_0").tables["fr_entries"]
    js = _read(SKIP / "rank0" / "fr_trace_rank_0.json").tables["fr_entries"]
    cols = ["rank", "pg_id", "collective_seq_id", "op", "status", "input_sizes", "time_created_ns"]
    assert js.select(cols).equals(pkl.select(cols))
    assert set(js["encoding"]) == {"json"} and js["frames"].list.len().max() == 0
    assert js["time_discovered_started_ns"].null_count() == js.height  # JSON writes 0 for "unknown"


@pytest.mark.parametrize(
    "name,rank", [("nccl_trace_rank_3", 3), ("rank5/dump.pkl", 5), ("x/fr_trace_rank_12.json", 12), ("dump", None)]
)
def test_rank_from_the_file_name(name, rank):
    assert fr.rank_from_name(name) == rank


# -- versions torch 2.13 cannot write (synthetic: field lists documented by PyTorch's analyzer) ------


def _entry_v1(seq, state, **extra):
    """A 1.x entry: one `seq_id`, no p2p_seq_id, no dtypes, pg as (name, desc)."""
    return {
        "record_id": seq,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "seq_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "input_sizes": [[1024]],
        "output_sizes": [[1024]],
        "state": state,
        "retired": state == "completed",
        "frames": [{"name": "step", "filename": "train.py", "line": 40}],
        **extra,
    }


def test_synthetic_version_1_dump_with_seq_id_and_pg_config_lists(tmp_path):
    dump = {
        "version": "1.1",
        "pg_config": {"0": ["0", "1", "2", "3"]},
        "entries": [
            _entry_v1(1, "completed"),
            _entry_v1(2, "started", time_discovered_started_ns=1_700_000_001_000_000_000),
        ],
    }
    path = tmp_path / "nccl_trace_rank_1"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    result = _read(path)
    rows = result.tables["fr_entries"].sort("collective_seq_id")
    assert rows["collective_seq_id"].to_list() == [1, 2] and rows["status"].to_list() == ["completed", "started"]
    assert rows["backend"].to_list() == ["nccl", "nccl"] and rows["p2p_seq_id"].null_count() == 2
    assert result.tables["fr_groups"]["ranks"].to_list() == [[0, 1, 2, 3]]


def test_synthetic_nccl_2x_dump_with_p2p_and_pg_status(tmp_path):
    send = {
        **_entry_v1(3, "started"),
        "seq_id": None,
        "collective_seq_id": 0,
        "p2p_seq_id": 7,
        "is_p2p": True,
        "profiling_name": "nccl:send 0->1",
        "input_dtypes": ["BFloat16"],
        "output_dtypes": ["BFloat16"],
        "timeout_ms": 600000,
        "duration_ms": None,
        "thread_name": "pt_main_thread",
    }
    dump = {
        "version": "2.4",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {"last_enqueued_collective": 2, "last_started_collective": 2, "last_completed_collective": 1}
        },
        "entries": [_entry_v1(1, "scheduled"), _entry_v1(2, "scheduled"), send],
    }
    path = tmp_path / "trace_0.json"
    path.write_text(json.dumps(dump))
    result = _read(path)
    rows = result.tables["fr_entries"].sort("record_id")
    # pg_status corrects the entries' own state; p2p ops keep theirs
    assert rows["status"].to_list() == ["completed", "started", "started"]
    assert rows["is_p2p"].to_list() == [False, False, True] and rows["op"].to_list()[-1] == "send"
    assert rows["p2p_seq_id"][2] == 7 and rows["input_dtypes"][2] == '["BFloat16"]'
    group = result.tables["fr_groups"].row(0, named=True)
    assert (group["ranks"], group["pg_desc"], group["last_started"], group["comm_lib_version"]) == (
        [0, 1],
        "default_pg",
        2,
        "2.21.5",
    )


def test_dump_printed_as_a_python_dict_with_elisions_and_a_cut(tmp_path):
    real = safe_pickle.loads((SKIP / "rank1" / "fr_trace_rank_1").read_bytes())
    first, last, cut = real["entries"][0], real["entries"][-2], real["entries"][-1]
    pasted = (
        "here is what print(pickle.load(f)) showed:\n{'version': '2.10',\n 'entries': ["
        + pprint.pformat(first)
        + ",\n  ...,\n  "
        + pprint.pformat(last)
        + ",\n  "
        + pprint.pformat(cut)[:300]
    )
    assert "('0', 'default_pg')" in pasted  # tuples, single quotes: not JSON
    path = tmp_path / "rank1_paste.txt"
    path.write_text(pasted)
    result = _read(path)
    rows = result.tables["fr_entries"]
    assert result.account.errors == [] and set(rows["encoding"]) == {"dict text"}
    assert {first["record_id"], last["record_id"]} <= set(rows["record_id"])
    row = rows.filter(rows["record_id"] == last["record_id"]).row(0, named=True)
    assert (row["collective_seq_id"], row["pg_name"], row["frames"][2]["line"]) == (last["collective_seq_id"], "0", 103)


# -- untrusted pickles ----------------------------------------------------------------------------


class _RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_a_command_is_refused_and_the_run_is_analysed(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "lab-hang-sleep", run)
    marker = tmp_path / "pwned"
    evil = {"version": "2.10", "entries": [_RunsACommand(marker)], "pg_config": {}}
    (run / "rank2" / "fr_trace_rank_9").write_bytes(pickle.dumps(evil))
    (run / "notes.pkl").write_bytes(pickle.dumps(_RunsACommand(marker), protocol=4))
    analysis = analyze(run)
    assert not marker.exists()
    inputs = {r["file"]: r for r in analysis.tables["inputs"].to_dicts()}
    for name in ("rank2/fr_trace_rank_9", "notes.pkl"):
        (error,) = inputs[name]["errors"]
        assert "refused to load" in error and "system" in error and "\n" not in error
    assert {"TL420", "TL422"} <= {f.rule_id for f in analysis.findings}  # the rest of the run is analysed


def test_torchscript_typed_lists_load_as_plain_lists():
    # GLOBAL torch.jit._pickle.build_intlist, REDUCE over ([1, 2],): what TorchScript's pickler writes
    data = b"\x80\x02ctorch.jit._pickle\nbuild_intlist\n]q\x00(K\x01K\x02e\x85R."
    assert safe_pickle.loads(data) == [1, 2]
    with pytest.raises(safe_pickle.UnsafePickle, match="builtins.eval"):
        safe_pickle.loads(b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.")


def test_a_pickle_that_is_not_a_dump_says_so(tmp_path):
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"layers": [1, 2]}))
    result = fr.ingest(InputFile(path, "weights.pkl", "flight_recorder"))
    assert result.account.errors == ["weights.pkl: a pickle but not a Flight Recorder dump (no 'entries')"]


def test_shared_references_do_not_blow_up(tmp_path):
    """A small pickle whose memo shares one list everywhere: read, shown as too large, in bounded time."""
    nested = [1, 2]
    for _ in range(40):
        nested = [nested, nested]  # 2**40 leaves when walked, a few hundred bytes pickled
    entry = {
        "record_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 1,
        "profiling_name": "nccl:all_reduce",
        "input_sizes": nested,
        "state": "scheduled",
        "frames": [{"name": "f", "filename": "f.py", "line": 1}] * 100_000,
    }
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.4", "entries": [entry] * 3}))
    assert path.stat().st_size < 300_000
    rows = _read(path).tables["fr_entries"]
    assert rows.height == 3 and set(rows["input_sizes"]) == {"(too large to show)"}
    assert rows["frames"].list.len().max() == fr.MAX_FRAMES


def test_a_dump_without_a_rank_in_its_name_says_so(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"version": "2.10", "entries": [_entry_v1(1, "completed")]}))
    result = _read(path)
    assert result.tables["fr_entries"]["rank"].to_list() == [None]
    assert result.account.errors == [
        "dump.json: no rank in the file name (like fr_trace_rank_3); its entries are read but belong to no rank"
    ]


def test_a_dump_without_entries_still_names_its_groups(tmp_path):
    path = tmp_path / "trace_rank_2.json"
    path.write_text(
        json.dumps(
            {
                "version": "2.4",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
                "entries": [],
            }
        )
    )
    result = _read(path)
    assert not result.account.errors and result.account.lines == 0 and "fr_entries" not in result.tables
    assert result.tables["fr_groups"]["ranks"].to_list() == [[0, 1, 2]]


@pytest.mark.parametrize("head, kind, limit", [
    (b'{"version": "2.4", "entries": [', "text dump", 64), (b"\x80\x02}q\x00(X\x07\x00\x00\x00version", "pickle", 512),
], ids=["json", "pickle"])  # fmt: skip
def test_a_dump_of_gigabytes_is_refused_before_it_is_read(tmp_path: Path, head: bytes, kind: str, limit: int):
    """A dump's head before a sparse hole of 4 GiB: its size is checked before anything is read (a
    pickle was read whole first, 8 GB of memory)."""
    import tracemalloc

    from tracelens.ingest import InputFile

    path = tmp_path / "fr_trace_rank_3.json"
    with path.open("wb") as fh:
        fh.write(head)
        fh.truncate(4 << 30)
    tracemalloc.start()
    try:
        result = fr.ingest(InputFile(path=path, name=path.name, format="flight_recorder"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.account.errors == [
        "fr_trace_rank_3.json: not a readable Flight Recorder dump: "
        f"{kind} of 4,294,967,296 bytes is larger than the {limit} MiB read"
    ]
    assert peak < 64 << 20
