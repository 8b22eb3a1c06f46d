"""Many small logs read as one batch (ingest/small_files.py) give the tables and per-file accounts
that reading each file alone gives: on the real corpus, on fixtures, and on files made to stress
the file boundaries (a WARN first in a file, a quote or a wrapped record last in one, a version
line of one file beside the communicators of another, CRLF, no final newline, other parsers' files)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from synth.kineto import Job, traces
from tracelens import analyze
from tracelens.ingest import IngestResult, InputFile, small_files
from tracelens.tables import SCHEMAS

from .conftest import CORPUS, FIXTURES, corpus_dir


def _ingest(target: Path, work: Path) -> dict[str, pl.DataFrame]:
    tables, _ = analyze.ingest_run(target, work, jobs=1)
    return {name: tables[name] for name in SCHEMAS}


def assert_reads_alike(target: Path, tmp_path: Path, monkeypatch) -> dict[str, pl.DataFrame]:
    """The run's tables with small logs batched equal those with every file read alone.

    A file the batched run reads alone too (no small log, or one another line parser claims) is read
    once, by the same call with the same arguments, and its result serves both runs: only the files
    read in batches are read a second time, alone."""
    read_alone: dict[tuple, IngestResult] = {}
    ingest_alone = analyze._ingest_with_host

    def once(source: InputFile, jobs: int = 1, workers=None) -> IngestResult:
        key = (source.name, source.format, source.host_hint, source.size, source.error, jobs, workers)
        if key not in read_alone:  # the path differs between the runs for an archive's extracted member
            read_alone[key] = ingest_alone(source, jobs, workers)
        return read_alone[key]

    monkeypatch.setattr(analyze, "_ingest_with_host", once)
    batched = _ingest(target, tmp_path / "batched")
    assert any(len(item) > 1 for item in small_files.work_items(_discovered(target, tmp_path))), "nothing was batched"
    with monkeypatch.context() as m:
        m.setattr(small_files, "work_items", lambda files: [[f] for f in files])
        alone = _ingest(target, tmp_path / "alone")
    for name in SCHEMAS:
        try:
            assert_frame_equal(batched[name], alone[name])
        except AssertionError as exc:
            raise AssertionError(f"table {name} differs: {exc}") from None
    return batched


def _discovered(target: Path, tmp_path: Path):
    from tracelens.discover import discover

    return discover(target, tmp_path / "discovered").files


def test_the_real_corpus_reads_the_same_in_batches(tmp_path, monkeypatch):
    corpus = corpus_dir("nccl").parent
    tables = assert_reads_alike(corpus, tmp_path, monkeypatch)
    assert tables["nccl_errors"].height > 50 and tables["inputs"].height > 100
    assert tables["steps"].height > 1000  # the launcher and training logs' DeepSpeed lines, read in their batches


@pytest.mark.parametrize("name", ["scenario-congestion", "ib-retry-exceeded", "lab-hang-kill", "ds-slow-window"])
def test_fixtures_read_the_same_in_batches(name, tmp_path, monkeypatch):
    assert_reads_alike(FIXTURES / name, tmp_path, monkeypatch)


HEAD = "node01:1234:1300 [0] NCCL INFO "
WARN = "node01:1234:1300 [0] transport/net_ib.cc:1234 NCCL WARN "


def _write(folder: Path, name: str, lines: list[str], end: str = "\n") -> None:
    (folder / name).write_text(end.join(lines) + end, newline="")


def test_file_boundaries_do_not_leak(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    comm = "comm 0x7f01 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xabc - Init START"
    # a: a version line without pid, a blank line last, a `Last error:` quote opened on its last line
    _write(run, "a.log", ["NCCL version 2.18.3+cuda12.1", f"{HEAD}{comm}", "", "RuntimeError: NCCL error: Last error:"])
    # b: a WARN first (the line before it is a's, not b's), then a record cut by a terminal's wrap
    _write(
        run,
        "b.log",
        [
            (
                f"{WARN}NET/IB : Got completion from peer 10.0.0.2<54321> "
                "with status=12 opcode=0 len=0 vendor err 129 (Recv)"
            ),
            f"{HEAD}{comm.replace('0x7f01', '0x7f02')}",
            f"{HEAD}NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoC",
        ],
    )
    # c: starts with what looks like the rest of b's wrapped line; no version line of its own; CRLF; no last newline
    _write(
        run,
        "c.log",
        ["E [RO]; OOB eth0:10.0.0.1<0>", f"{HEAD}{comm.replace('0x7f01', '0x7f03')}", f"{HEAD}no such message 42"],
        end="\r\n",
    )
    (run / "d.log").write_bytes(
        f"{HEAD}{comm.replace('0x7f01', '0x7f04')}\n{HEAD}Bad \xff\n".encode("latin-1") + b"no newline"
    )
    # files other line parsers claim: read alone, their rows still in file order
    _write(
        run,
        "e.log",
        [
            "[2024-01-01 00:00:01,000] [INFO] [logging.py:96:log_dist] "
            "[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
        ],
    )
    _write(
        run,
        "f.log",
        ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "RuntimeError: boom"],
    )
    _write(run, "g.log", [f"{HEAD}NCCL_IB_HCA set by environment to mlx5_0"])
    tables = assert_reads_alike(run, tmp_path, monkeypatch)
    comms = tables["nccl_comms"].sort("file")
    assert comms["nccl_version"].to_list() == ["2.18.3", None, None, None], "only a.log's communicator has a's version"
    inputs = {r["file"]: r for r in tables["inputs"].to_dicts()}
    assert [inputs[f"{f}.log"]["lines"] for f in "abcdefg"] == [4, 3, 3, 3, 1, 3, 1]
    # b's last record, cut by a wrap, is not joined with c's first line: another file
    assert (inputs["b.log"]["parsed"], inputs["b.log"]["unrecognized"]) == (2, 1)
    assert [(s["line"], s["text"]) for s in inputs["c.log"]["samples"]][0] == (3, f"{HEAD}no such message 42"), (
        "CR folded, own line numbers"
    )
    # a bad byte in an NCCL line (a near miss, first), then a last line without newline no parser reads
    assert [s["line"] for s in inputs["d.log"]["samples"]] == [2, 3] and inputs["d.log"]["unrecognized"] == 2
    assert tables["steps"].height == 1 and tables["stacks"].height == 1


def test_work_items_batch_runs_of_small_files_in_order(tmp_path):
    from tracelens.ingest import InputFile

    def log(name: str, size: int = 100, fmt: str = "log") -> InputFile:
        return InputFile(path=tmp_path / name, name=name, format=fmt, size=size)

    files = [
        log("a"),
        log("b"),
        log("big", small_files.SMALL_BYTES + 1),
        log("c"),
        log("cap", fmt="pcap"),
        log("d"),
        log("e"),
    ]
    items = [[f.name for f in item] for item in small_files.work_items(files)]
    assert items == [["a", "b"], ["big"], ["c", "cap", "d", "e"]]  # a small capture read alone in the batch


def test_line_start_sniffers_find_what_their_anchored_regex_finds():
    # every sniffer written with LineStart, on the head of every fixture and corpus file, and on edge heads
    import re

    from tracelens.ingest import LineStart, formats

    sniffers = [
        (f.name, v)
        for f in formats()
        for v in vars(sys.modules[f.ingest.__module__]).values()
        if isinstance(v, LineStart)
    ]
    assert len(sniffers) >= 9
    heads = [
        p.read_bytes()[:65536]
        for root in (FIXTURES, CORPUS)
        if root.is_dir()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]
    heads += [b"", b"\n", b"NIC statistics:", b"x\nCA 'mlx5_0'\n\tCA type: MT4123", b"\n\n  rx_bytes: 5\n"]
    for fmt, sniffer in sniffers:
        anchored = re.compile(rb"^(?:" + sniffer.pattern + rb")", sniffer.flags | re.M)
        for head in heads:
            assert sniffer.search(head) == (anchored.search(head) is not None), fmt
            assert sniffer.count(head) == len(anchored.findall(head)), fmt


@pytest.mark.parametrize("name", ["scenario-congestion", "lab-straggler", "ds-slow-window"])
def test_rows_past_the_memory_budget_go_to_disk_and_give_what_memory_gives(name, analysis_of, monkeypatch):
    """A run whose unspilled rows outgrow analyze.HELD_BYTES (a folder of thousands of per-rank logs)
    writes each further unit's rows to its spill folder and reads them lazily: with a budget of 0 every
    unit is on disk, and every aligned table and finding equals the analysis held in memory."""
    memory = analysis_of(name)
    monkeypatch.setattr(analyze, "HELD_BYTES", 0)
    spilled = analyze.analyze(FIXTURES / name)
    lazy = [n for n in SCHEMAS if n != "inputs" and isinstance(spilled.tables.frame(n), pl.LazyFrame)]
    assert "steps" in lazy or "nccl_events" in lazy, lazy  # read from the spill folder, not memory
    for table in SCHEMAS:
        assert spilled.tables[table].equals(memory.tables[table], null_equal=True), table
    assert [f.to_json() for f in spilled.findings] == [f.to_json() for f in memory.findings]


DS = "[2024-01-01 00:00:0{s},000] [INFO] [logging.py:96:log_dist] "


def test_deepspeed_logs_are_read_by_one_parser_per_batch_and_stay_apart(tmp_path, monkeypatch):
    """A folder of thousands of small DeepSpeed logs cost a parser's set-up per file: one parser now
    reads the batch, and each file's records stay its own (steps of the same rank and step number in
    two files, a config echo left open at one file's end, a rank from the file name)."""
    from tracelens.ingest.deepspeed import log

    run = tmp_path / "run"
    run.mkdir()
    step = "step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
    _write(run, "a.log", [DS.format(s=1) + step, DS.format(s=2) + "DeepSpeedEngine configuration:"])
    _write(run, "b.log", ["  train_batch_size ............. 8", DS.format(s=3) + step])  # not a's engine's entry
    _write(run, "train_rank3.log", [DS.format(s=4) + step])
    for i in range(20):
        _write(run, f"x{i:02d}.log", [DS.format(s=5) + step.replace("10", str(100 + i))])
    opened: list[int] = []
    real_init = log.DeepSpeedParser.__init__

    def counted(self, source, spill=None, files=None):
        opened.append(len(files or [source]))
        real_init(self, source, spill, files)

    monkeypatch.setattr(log.DeepSpeedParser, "__init__", counted)
    work = tmp_path / "work"
    discovered = _discovered(run, tmp_path)
    assert [len(item) for item in small_files.work_items(discovered)] == [23]
    tables = _ingest(run, work)
    assert opened == [23]  # one parser for the batch (the NCCL parser reads it once too)
    steps = tables["steps"].sort("file")
    assert steps.filter(pl.col("step") == 10).select("file", "rank").rows() == [
        ("a.log", None), ("b.log", None), ("train_rank3.log", 3)
    ]  # fmt: skip
    settings = tables["deepspeed_settings"]
    assert settings.filter(pl.col("key") == "train_batch_size").height == 0  # b's first line opens no echo
    monkeypatch.setattr(log.DeepSpeedParser, "__init__", real_init)
    assert_reads_alike(run, tmp_path / "alike", monkeypatch)


@pytest.mark.parametrize("files", [1, 2])
def test_a_run_of_one_file_keeps_its_rows_past_the_budget(files, tmp_path, monkeypatch):
    """The rows of a run's only file are what its ingest held anyway: they stay in memory, where a
    second file's would send them to the spill folder."""
    run = tmp_path / "run"
    run.mkdir()
    for rank, text in list(traces(Job(world=2, steps=3)).items())[:files]:
        (run / f"rank-{rank}.pt.trace.json").write_text(text)
    monkeypatch.setattr(analyze, "HELD_BYTES", 0)
    tables, _ = analyze.ingest_run(run, tmp_path / "work", jobs=1)
    spans = tables.frame("trace_spans")
    assert isinstance(spans, pl.DataFrame if files == 1 else pl.LazyFrame)
    assert tables["trace_spans"]["rank"].n_unique() == files


NCCL_TESTS_HEAD = (
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
    "#  Rank  0 Group  0 Pid  10 on     {host} device  0 [0x1b] NVIDIA A100-SXM4-80GB\n"
)
NEW_ROW = "  1048576  262144  float  sum  -1  157  30.00  45.00  0  121  28.00  40.00  0\n"
OLD_ROW = "  1048576  262144  float  sum  157  30.00  45.00  1e-06  121  28.00  40.00  1e-06\n"


def test_stack_dumps_and_nccl_tests_are_read_by_one_parser_per_batch_and_stay_apart(tmp_path, monkeypatch):
    """Thousands of small stack dumps or nccl-tests outputs cost each file its parsers' set-up: one
    parser of each now reads the batch, and what each carries from line to line stays in its file (a
    py-spy process header, the rank a file's name gives, an nccl-tests run's number, test and columns)."""
    from tracelens.ingest.hangs.stacks import StackParser
    from tracelens.ingest.host.nccl_tests import NcclTestsParser

    run = tmp_path / "run"
    run.mkdir()
    _write(run, "a_pyspy_rank1.txt", ["Process 42: python train.py", "Python v3.11.7", "",
                                      'Thread 42 (idle): "MainThread"', "    all_reduce (c10d.py:3252)"])  # fmt: skip
    _write(run, "b_dump.txt", ['Thread 43 (active): "MainThread"', "    train (worker.py:103)"])
    (run / "c_all_reduce_perf.log").write_text(
        "# Collective test starting: all_reduce_perf\n"
        + NCCL_TESTS_HEAD.format(host="node01")
        + "#  size  count  type  redop  time  algbw  busbw  error  time  algbw  busbw  error\n"
        + OLD_ROW
        + NCCL_TESTS_HEAD.format(host="node02")
        + OLD_ROW
    )
    (run / "d_results.log").write_text(NEW_ROW + "# Avg bus bandwidth    : 42.5\n")
    opened: list[str] = []
    for cls in (StackParser, NcclTestsParser):
        monkeypatch.setattr(cls, "__init__", _counted(cls.__init__, opened))
    assert [len(item) for item in small_files.work_items(_discovered(run, tmp_path))] == [4]
    tables = _ingest(run, tmp_path / "work")
    assert sorted(opened) == ["NcclTestsParser", "StackParser"]  # one of each for the batch
    stacks = tables["stacks"].sort("file").select("file", "rank", "pid", "process").rows()
    assert stacks == [("a_pyspy_rank1.txt", 1, 42, "python train.py"), ("b_dump.txt", None, None, None)]
    tests = tables["nccl_tests"].filter(pl.col("placement").ne_missing("in")).sort("file", "line")
    assert tests.select("file", "run", "test", "rank_hosts", "wrong", "error").rows() == [
        ("c_all_reduce_perf.log", 1, "all_reduce_perf", "node01", None, 1e-06),
        ("c_all_reduce_perf.log", 2, "all_reduce_perf", "node02", None, 1e-06),
        ("d_results.log", 0, None, None, 0, None),
        ("d_results.log", 0, None, None, None, None),  # the average
    ]
    monkeypatch.undo()
    assert_reads_alike(run, tmp_path / "alike", monkeypatch)


def _counted(init, opened: list[str]):
    def counted(self, *args, **kwargs):
        opened.append(type(self).__name__)
        init(self, *args, **kwargs)

    return counted


def test_fabric_dumps_are_read_by_one_reader_per_format_and_stay_apart(tmp_path, monkeypatch):
    """Thousands of small counter dumps cost each file its reader's set-up: each dump format now reads
    its small files at once, and what a line takes from the lines around it stays in its file (a
    `date` line's time, a prompt's host, an `ethtool -S` command's device, a headerless block)."""
    from tracelens.ingest.fabric import dumps

    run = tmp_path / "run"
    (run / "node01").mkdir(parents=True)
    (run / "node01" / "pq-a.txt").write_text(
        "root@nodeA:~# perfquery -x\nThu Mar  7 09:00:00 UTC 2024\n"
        "# Port extended counters: Lid 3 port 1 (CapMask: 0x5A00)\nPortXmitData:....................7\n"
    )
    (run / "node01" / "pq-b.txt").write_text("PortSelect:......................2\nSymbolErrorCounter:..............5\n")
    (run / "node01" / "pq-c.txt").write_text(
        "garbage line\nPortSelect:......................1\nPortRcvErrors:...................3\n"
    )
    (run / "node02").mkdir()
    (run / "node02" / "eth-a.txt").write_text("$ ethtool -S ens1f0\nNIC statistics:\n     rx_prio3_bytes: 10\n")
    (run / "node02" / "eth-b.txt").write_text("     rx_prio3_bytes: 20\n")
    (run / "node02" / "sysfs.txt").write_text("/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors:4\n")
    calls: list[int] = []
    real = dumps.read_dumps
    monkeypatch.setattr(dumps, "read_dumps", lambda sources, parse: calls.append(len(sources)) or real(sources, parse))
    assert [len(item) for item in small_files.work_items(_discovered(run, tmp_path))] == [6]
    tables = _ingest(run, tmp_path / "work")
    assert sorted(calls) == [1, 2, 3]  # one read for each format's files: hw_counters, ethtool, perfquery
    counters = tables["ib_counters"].sort("file", "line")
    rows = counters.select("file", "host", "node", "port", "counter", "value", "ts_quality").rows()
    assert rows == [
        ("node01/pq-a.txt", "nodeA", "Lid 3", 1, "PortXmitData", 7, "exact"),
        ("node01/pq-b.txt", "node01", None, 2, "SymbolErrorCounter", 5, "mtime"),  # not a's host nor time
        ("node01/pq-c.txt", "node01", None, 1, "PortRcvErrors", 3, "mtime"),
        ("node02/eth-a.txt", "node02", "ens1f0", None, "rx_prio3_bytes", 10, "mtime"),
        ("node02/eth-b.txt", "node02", None, None, "rx_prio3_bytes", 20, "mtime"),  # not a's device
        ("node02/sysfs.txt", "node02", "mlx5_0", 1, "PortRcvErrors", 4, "mtime"),
    ]
    inputs = {r["file"]: r for r in tables["inputs"].to_dicts()}
    assert inputs["node01/pq-a.txt"]["host"] == "nodeA" and inputs["node01/pq-b.txt"]["host"] == "node01"
    assert [(s["line"], s["text"]) for s in inputs["node01/pq-c.txt"]["samples"]] == [(1, "garbage line")]
    assert [inputs[f"node01/pq-{f}.txt"]["lines"] for f in "abc"] == [4, 2, 3]
    monkeypatch.undo()
    assert_reads_alike(run, tmp_path / "alike", monkeypatch)


def test_a_files_samples_are_the_same_read_alone_or_in_a_batch(tmp_path):
    """The unrecognised lines shown, those a parser came close to first, over the whole file: a last
    line with no newline after it is a chunk of its own when the file is read alone, and its near
    miss still comes before the first chunk's unclaimed line, as in a batch."""
    from tracelens.ingest import ingest_file

    run = tmp_path / "run"
    run.mkdir()
    cut = DS.format(s=2) + "[timer.py:264:stop] epoch=0/micro_step=21/global_step=21, RunningAvgSamplesPerSec=27.1"
    (run / "a.log").write_text(
        f"just some text\n{DS.format(s=1)}step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n{cut}"
    )
    _write(run, "b.log", ["other text"])
    files = _discovered(run, tmp_path)
    alone = ingest_file(files[0]).account
    batched, _ = small_files.ingest(files).accounts["a.log"]
    assert [line for line, _ in alone.samples] == [line for line, _ in batched.samples] == [3, 1]
    assert (
        (alone.lines, alone.parsed, alone.unrecognized)
        == (batched.lines, batched.parsed, batched.unrecognized)
        == (3, 1, 2)
    )


def test_kernel_logs_are_read_by_one_reader_per_batch_and_stay_apart(tmp_path, monkeypatch):
    """Thousands of small kernel-log pieces cost each file its reader's set-up: they are now read as
    one chunk, and what a line takes from its file stays in it (a syslog time's year from the file's
    date, a host line, an indented continuation only under a record of its own file)."""
    import os

    from tracelens.ingest.host import kernel

    run = tmp_path / "run"
    run.mkdir()
    _write(run, "a.log", ["hostname: nodeA", "Mar  7 09:00:01 nodeA kernel: mlx5_core 0000:3b:00.0 ens1f0: Link down"])
    _write(run, "b.log", ["    continued text", "Mar  7 09:00:02 nodeB kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1"])
    _write(run, "c.log", ["[  100.000001] mlx5_core 0000:3b:00.0 ens1f0: Link up", "    indented under c's record"])
    os.utime(run / "b.log", (1_600_000_000, 1_600_000_000))  # 2020: b's syslog times are of 2020
    calls: list[int] = []
    real = kernel._chunk
    monkeypatch.setattr(kernel, "_chunk", lambda sources, *a: calls.append(len(sources)) or real(sources, *a))
    assert [len(item) for item in small_files.work_items(_discovered(run, tmp_path))] == [3]
    tables = _ingest(run, tmp_path / "work")
    assert calls == [3]
    events = tables["kernel_events"].sort("file")
    assert events.select("file", "line", "host", "kind").rows() == [
        ("a.log", 2, "nodeA", "link_down"),
        ("b.log", 2, "nodeB", "xid"),
        ("c.log", 1, None, "link_up"),
    ]
    assert events["ts"].dt.year().to_list()[:2] == [datetime.now(timezone.utc).year, 2020]
    inputs = {r["file"]: r for r in tables["inputs"].to_dicts()}
    assert [s["line"] for s in inputs["b.log"]["samples"]] == [1]  # not a continuation of a.log's record
    assert inputs["c.log"]["unrecognized"] == 0 and inputs["c.log"]["ignored"] == 1
    monkeypatch.undo()
    assert_reads_alike(run, tmp_path / "alike", monkeypatch)


def test_small_files_that_begin_with_zero_bytes_are_read_in_the_batch(tmp_path, monkeypatch):
    """Campaign seed 138 case 154: 5,000 pieces of a log, a third of them led by zero bytes (a file
    truncated under its writer), passed the 60 s CPU limit: each zero-led file was read alone. The batch
    now reads each as the format after its zeros, with the note a file read alone gets."""
    run = tmp_path / "run"
    run.mkdir()
    _write(run, "a.log", [f"{HEAD}NCCL_IB_HCA set by environment to mlx5_0", "some text"])
    (run / "b.log").write_bytes(bytes(4096) + f"{HEAD}NCCL_IB_HCA set by environment to mlx5_1\nother\n".encode())
    (run / "c.log").write_bytes(
        bytes(100) + b"PortSelect:......................1\nPortRcvErrors:...................3\n"
    )
    (run / "d.log").write_bytes(bytes(300))  # only zeros: read alone, its error
    alone: list[str] = []
    read_alone = analyze._ingest_with_host
    monkeypatch.setattr(
        analyze, "_ingest_with_host", lambda source, *a: alone.append(source.name) or read_alone(source, *a)
    )
    assert [len(item) for item in small_files.work_items(_discovered(run, tmp_path))] == [4]
    tables = _ingest(run, tmp_path / "work")
    assert alone == ["d.log"]
    inputs = {r["file"]: r for r in tables["inputs"].to_dicts()}
    (note,) = inputs["b.log"]["notes"]
    assert note.startswith("begins with 4,096 zero bytes") and note.endswith("read from the text after them, as line 1")
    assert (inputs["b.log"]["lines"], inputs["b.log"]["parsed"], inputs["b.log"]["format"]) == (2, 1, "zeros")
    assert tables["ib_counters"]["file"].to_list() == ["c.log"]  # read as the perfquery dump after its zeros
    assert "only 300 zero bytes" in inputs["d.log"]["errors"][0]
    monkeypatch.undo()
    assert_reads_alike(run, tmp_path / "alike", monkeypatch)
