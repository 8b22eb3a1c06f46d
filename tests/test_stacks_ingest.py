"""Stack dumps read from any text file: the real py-spy dumps of the lab runs, the corpus's
py-spy, `ray stack` and faulthandler pastes, tracebacks and C++ aborts inside training logs."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import FIXTURES, corpus_dir
from tracelens.ingest import InputFile, textlog


def _stacks(path: Path, name: str | None = None):
    result = textlog.ingest(InputFile(path, name or path.name, "log"))
    return result, result.tables.get("stacks")


def test_real_pyspy_dump_of_a_rank_stuck_in_its_data_loader():
    result, stacks = _stacks(FIXTURES / "lab-hang-sleep" / "rank2" / "pyspy_rank2.txt", "rank2/pyspy_rank2.txt")
    (row,) = stacks.to_dicts()
    assert (row["tool"], row["rank"], row["thread_name"], row["thread_state"]) == ("py-spy", 2, "MainThread", "idle")
    assert row["pid"] == int(row["thread_id"]) and row["process"].split()[0].endswith("/bin/python")
    assert (row["frames"][0]["name"], row["frames"][0]["filename"], row["frames"][0]["line"]) == (
        "Loader.next_batch",
        "worker.py",
        47,
    )
    assert result.account.parsed == result.account.lines - 1  # all but the blank line


def test_real_pyspy_native_dump_marks_native_frames():
    _, stacks = _stacks(FIXTURES / "lab-hang-skip" / "rank2" / "pyspy_native_rank2.txt")
    frames = stacks.row(0, named=True)["frames"]
    natives = [f for f in frames if f["native"]]
    assert natives and all(f["line"] is None for f in natives)
    assert "c10d::Work::wait" in [f["name"] for f in natives]
    python = [f["name"] for f in frames if not f["native"]]
    assert "all_reduce" in python and "train" in python


def test_corpus_stack_dumps():
    hang = corpus_dir("host/hang")
    counts = {}
    for path in sorted(hang.iterdir()):
        result, stacks = _stacks(path)
        assert result.account.errors == []
        counts[path.name.split("_")[0]] = stacks
    ray = counts["ray3187"]
    assert set(ray["tool"]) == {"ray stack"} and sorted(set(ray["pid"])) == [20768, 20769]
    assert ray.row(2, named=True)["frames"][0]["name"] == "_get_next_task_from_local_scheduler"
    fault = counts["sglang3709"]
    assert set(fault["tool"]) == {"faulthandler"} and fault.row(1, named=True)["frames"][0]["name"] == "broadcast"
    native = counts["sglang17941"]
    main = native.filter(native["thread_name"] == "MainThread").row(0, named=True)
    assert main["pid"] == 88693 and "gloo::transport::tcp::UnboundBuffer::waitRecv" in [
        f["name"] for f in main["frames"]
    ]
    idle = counts["verl7180"]
    assert idle.height == 6 and idle.filter(idle["thread_id"] == "868545")["frames"].list.len().item() == 0


def test_traceback_with_launcher_tags_and_carets_and_a_cpp_abort(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "[rank3]:[W1201 02:49:09 ProcessGroupGloo.cpp:123] some warning\n"
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/job/train.py", line 140, in main\n'
        "[rank3]:     train(args)\n"
        '[rank3]:   File "/job/train.py", line 103, in train\n'
        "[rank3]:     dist.all_reduce(grad)\n"
        "[rank3]:     ^^^^^^^^^^^^^^^^^^^^^\n"
        "[rank3]: RuntimeError: Connection closed by peer [10.0.0.2]:1234\n"
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at pair.cc:456] Received data size doesn't match expected size.\n"
    )
    _, stacks = _stacks(log, "node01/train.log")
    tb, abort = stacks.sort("line").to_dicts()
    assert (tb["tool"], tb["rank"], tb["exception"]) == (
        "traceback",
        3,
        "RuntimeError: Connection closed by peer [10.0.0.2]:1234",
    )
    assert [(f["name"], f["line"]) for f in tb["frames"]] == [("train", 103), ("main", 140)]  # innermost first
    assert abort["tool"] == "abort" and abort["exception"].startswith("gloo::EnforceNotMet: [enforce fail")


def test_a_log_without_stacks_has_none(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("    indented line (not a frame)\nstep 1 (loss 2.0)\nThreadPool started\n")
    _, stacks = _stacks(log)
    assert stacks is None


def test_a_number_past_what_a_table_holds_loses_its_field_not_the_file(tmp_path):
    """A mangled paste with 2^128 as a pid and a frame's line: the dump is still read, those fields null."""
    huge = str(2**128)
    text = (FIXTURES / "lab-hang-sleep" / "rank2" / "pyspy_rank2.txt").read_text()
    pid = text.split()[1]  # `Process 29414: ...`
    text = text.replace(f"Process {pid}", f"Process {huge}", 1).replace("(worker.py:47)", f"(worker.py:{huge})", 1)
    (tmp_path / "rank2").mkdir()
    path = tmp_path / "rank2" / "pyspy_rank2.txt"
    path.write_text(text)
    _, stacks = _stacks(path, "rank2/pyspy_rank2.txt")
    (row,) = stacks.to_dicts()
    assert row["pid"] is None and row["frames"][0]["line"] is None
    assert row["frames"][0]["name"] == "Loader.next_batch"
