"""PyTorch profiler traces (tracelens.ingest.profiler.kineto): the real traces of ../shared/corpus/kineto read with
their ranks, steps, kernels and collectives; the generated traces of synth/kineto.py measured per rank
and step (tracelens.derived.traces), and TL430/TL431 fired on them or not."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import polars as pl
import pytest

from synth.kineto import Job, step_ms, traces
from tests.helpers import corpus_dir, fire
from tracelens.analyze import analyze
from tracelens.derived import RunContext
from tracelens.derived import traces as derived
from tracelens.findings import Verdict, causes
from tracelens.findings.causes import Candidate
from tracelens.ingest import InputFile, ingest_file, sniff_format
from tracelens.ingest.profiler import kineto
from tracelens.tables import RunTables, conform

# file -> (events, rank, rank source, world size, backend, NCCL version, steps, kernels, NCCL kernels,
#          collective calls by name)
CORPUS = {
    "hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz": (
        220, None, "unknown", None, None, None, (1, 2), 14, 0, {},
    ),
    "hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (
        30, 34, "distributedInfo", 300, "gloo", None, (551, 551), 0, 0, {"gloo:all_reduce": 10},
    ),
    "hta_distributed_info_unavailable_distributed_info_not_found.json.gz": (
        2467, None, "unknown", None, None, None, (1009, 1009), 0, 0, {"nccl:all_to_all": 6},
    ),
    "hta_nccl_parser_config_nccl_data.json.gz": (
        40573, 0, "distributedInfo", 2, "nccl", "2.17.1", (4, 6), 2700, 21,
        {"nccl:all_reduce": 15, "nccl:broadcast": 6},
    ),
    "hta_trace_diff_control_control.json.gz": (
        109123, 3, "distributedInfo", 8, "nccl", None, (1009, 1014), 8568, 60,
        {"nccl:all_reduce": 18, "nccl:all_to_all": 42},
    ),
    "hta_trace_diff_test_test.json.gz": (
        105167, 1, "distributedInfo", 2, "nccl", None, (1009, 1014), 9876, 64,
        {"nccl:all_reduce": 18, "nccl:all_to_all": 42},
    ),
    "hta_trace_filter_sampled_rank-0.json.gz": (
        4855, 0, "distributedInfo", 128, "nccl", None, (551, 552), 1154, 10,
        {"nccl:_all_gather_base": 2, "nccl:all_reduce": 4, "nccl:all_to_all": 4},
    ),
    "hta_trace_filter_sampled_rank-1.json.gz": (
        4720, 1, "distributedInfo", 128, "nccl", None, (551, 552), 1104, 10,
        {"nccl:_all_gather_base": 2, "nccl:all_reduce": 4, "nccl:all_to_all": 4},
    ),
}  # fmt: skip


def unpacked(name: str, folder: Path) -> Path:
    """A corpus trace, gunzipped into `folder` (as tracelens.discover unpacks a single .gz)."""
    out = folder / name.removesuffix(".gz")
    with gzip.open(corpus_dir("kineto") / name) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def read(path: Path, name: str | None = None) -> tuple[pl.DataFrame, dict, kineto.IngestResult]:
    result = kineto.ingest(InputFile(path, name or path.name, "kineto"))
    ranks = conform("trace_ranks", result.tables["trace_ranks"]).row(0, named=True)
    return conform("trace_spans", result.tables["trace_spans"]), ranks, result


def test_the_corpus_holds_the_traces_listed():
    assert sorted(p.name for p in corpus_dir("kineto").glob("*.gz")) == sorted(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_real_trace(name, tmp_path):
    events, rank, source, world, backend, nccl, steps, kernels, nccl_kernels, calls = CORPUS[name]
    path = unpacked(name, tmp_path)
    assert sniff_format(path.read_bytes()[:65536]) == "kineto"
    spans, meta, result = read(path)
    assert result.account.lines == events and result.account.parsed == spans.height
    assert (
        sum(batch.height for batch in kineto._chunked(path, kineto.Trace())) == events
    )  # the fast reader, no fallback
    assert (result.account.errors == []) == (rank is not None)  # an unknown rank is said
    assert (meta["rank"], meta["rank_source"], meta["world_size"], meta["backend"], meta["nccl_version"]) == (
        rank, source, world, backend, nccl,
    )  # fmt: skip
    assert (meta["first_step"], meta["last_step"]) == steps
    assert spans.filter(pl.col("kind") == "kernel").height == kernels
    assert spans.filter(pl.col("category") == "communication").height == nccl_kernels
    called = spans.filter(pl.col("kind") == "collective")["name"].value_counts()
    assert dict(called.iter_rows()) == calls
    # sane spans: wall-clock times of the trace's day, nothing negative, every GPU span in a class
    assert spans["ts_quality"].unique().to_list() == ["exact"]
    assert spans["ts"].dt.year().is_between(2022, 2025).all()
    assert (spans["dur_us"] >= 0).all() and (spans["end_us"] >= spans["start_us"]).all()
    gpu = spans.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
    assert gpu["category"].null_count() == 0 and gpu["stream"].null_count() == 0
    assert spans.filter(pl.col("kind") == "cpu_op")["depth"].max() <= kineto.MAX_DEPTH


def test_base_time_and_collective_arguments(tmp_path):
    spans, _, _ = read(unpacked("hta_nccl_parser_config_nccl_data.json.gz", tmp_path))
    # ts counts from baseTimeNanoseconds: the profiler's own log says 17:15 local (PDT) on 2024-05-22
    assert str(spans["ts"].min()) == "2024-05-23 00:15:22.416787+00:00"
    call = spans.filter(pl.col("kind") == "collective").sort("start_us").row(0, named=True)
    assert (call["name"], call["collective"], call["backend"], call["dtype"]) == (
        "nccl:broadcast", "broadcast", "nccl", "Float",
    )  # fmt: skip
    assert (call["pg_name"], call["pg_desc"], call["pg_ranks"], call["group_size"]) == ("0", "default_pg", "[0, 1]", 2)
    kernel = spans.filter(pl.col("correlation") == 60047).row(0, named=True)
    assert kernel["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert (kernel["category"], kernel["collective"], kernel["in_nelems"], kernel["stream"]) == (
        "communication", "allreduce", 6637568, 40,
    )  # fmt: skip
    # every GPU span is placed in the step whose CPU span launched it (its launch precedes it)
    gpu = spans.filter(pl.col("kind") == "kernel")
    assert gpu["launch_us"].null_count() == 0 and (gpu["launch_us"] <= gpu["start_us"]).all()
    assert gpu["step"].drop_nulls().unique().sort().to_list() == [4, 5, 6]


def test_a_collective_op_alone_keeps_its_own_length(tmp_path):
    # gloo's worker threads run `gloo:all_reduce` with no record_param_comms: the op is the row, its
    # length the trace's to the nanosecond (not rounded where the base time makes its times large)
    spans, _, _ = read(unpacked("hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", tmp_path))
    ops = spans.filter(pl.col("kind") == "collective").sort("start_us")
    assert ops["dur_us"][:2].to_list() == [173209.713, 170471.258]


def test_old_traces_pair_the_call_with_the_op_that_holds_it(tmp_path):
    spans, _, _ = read(unpacked("hta_trace_diff_control_control.json.gz", tmp_path))
    calls = spans.filter(pl.col("kind") == "collective")
    # PyTorch 1.x: `nccl:all_to_all` holds an argument-less record_param_comms; one row per call
    assert calls.filter(pl.col("name") == "nccl:all_to_all")["collective"].unique().to_list() == ["all_to_all"]


def evented(path: Path, monkeypatch: pytest.MonkeyPatch) -> pl.DataFrame:
    """The trace's spans as Python's parser reads them, an event at a time (DuckDB made to refuse every
    chunk but the events Python's parser read, written again with their types)."""
    duck = kineto._duck

    def refuse(con: duckdb.DuckDBPyConnection, path: Path, array: bytes) -> pl.DataFrame:
        if not path.name.endswith("-typed.json"):
            raise duckdb.Error("refused")
        return duck(con, path, array)

    with monkeypatch.context() as patched:
        patched.setattr(kineto, "_duck", refuse)
        return read(path)[0]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_fast_reader_and_the_event_by_event_reader_agree(name, tmp_path, monkeypatch):
    # DuckDB's reader of whole chunks and Python's of one event at a time: every row and column the same
    path = unpacked(name, tmp_path)
    spans, _, _ = read(path)
    assert spans.height > 0 and spans.equals(evented(path, monkeypatch))


def test_chunk_boundaries_do_not_change_the_rows(tmp_path, monkeypatch):
    path = unpacked("hta_trace_filter_sampled_rank-0.json.gz", tmp_path)  # one line: events split mid-line
    whole, _, _ = read(path)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    chunked, _, _ = read(path)
    assert whole.equals(chunked)


def test_a_reader_left_early_waits_for_the_parses_under_way(tmp_path, monkeypatch):
    # chunks are parsed ahead, several at once: closing the reader (an error in the caller) lets them
    # finish before their databases and files go, instead of closing a database in use
    path = unpacked("hta_trace_filter_sampled_rank-0.json.gz", tmp_path)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(kineto, "PARSERS", 2)
    chunks = kineto._chunked(path, kineto.Trace())
    assert next(chunks).height > 0
    chunks.close()


def test_a_span_that_nests_objects_is_read_event_by_event(tmp_path, monkeypatch):
    # a trace on one line (not Kineto's own layout) is cut at `}, {"name": ...`, which is also what
    # lies between objects nested in an event's arrays: DuckDB fails on such a chunk, and the events
    # are read one at a time, the pieces of an event cut inside joined again, across chunks too (the
    # first MiB is read whole, the rest a chunk at a time)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    text = traces(Job(world=2, steps=250))[0]
    nested = json.loads(text)
    for event in nested["traceEvents"]:
        if event["name"] == "record_param_comms":
            event["args"]["frames"] = [{"name": f"frame{i}", "line": i} for i in range(40)]
    plain, nest = tmp_path / "rank-0.json", tmp_path / "nested" / "rank-0.json"
    nest.parent.mkdir()
    plain.write_text(json.dumps(json.loads(text)))
    nest.write_text(json.dumps(nested))
    ours, _, _ = read(plain)
    bodies: list[bytes] = []  # the chunks DuckDB did not read
    events_of = kineto._events_of

    def spied(body: bytes, trace: kineto.Trace, last: bool) -> tuple[list[dict], bytes]:
        bodies.append(body)
        return events_of(body, trace, last)

    monkeypatch.setattr(kineto, "_events_of", spied)
    theirs, _, result = read(nest)
    assert len(bodies) > 10
    columns = ["kind", "name", "start_us", "seq", "pg_name"]
    assert result.account.errors == [] and theirs.filter(pl.col("kind") == "collective").height == 500
    assert ours.select(columns).equals(theirs.select(columns))


KERNEL = b'"name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 100500.0, "dur": 30000.0, '
ARGS = b'{"device": 0, "stream": 7, "correlation": 1000002}'
LAST = b'"name": "multi_tensor_apply_kernel"'
# A damaged or hand-edited trace, value by value: what is in the trace, what replaces it, and what is
# read of the event: its correlation and stream, or None when it is lost. Each made DuckDB's reader,
# ijson's or both fail on the whole trace; none may cost more than its event or argument.
MANGLED = {
    "object-arg": (ARGS, b'{"device": 0, "stream": {"x": [7]}, "correlation": [1000002]}', (None, None)),
    "arg-past-64-bits": (ARGS, ARGS.replace(b"1000002", b"18446744073709551616"), (None, 7)),
    "arg-past-float-range": (ARGS, ARGS.replace(b"1000002", b"1e309"), (None, 7)),
    "base-time-out-of-range": (b'"traceEvents": [', b'"baseTimeNanoseconds": 1e30, "traceEvents": [', (1000002, 7)),
    "name-not-utf8": (KERNEL, KERNEL.replace(b"_tn", b"_\xff\xfe"), (1000002, 7)),
    "name-lone-surrogate": (KERNEL, KERNEL.replace(b"_tn", b"_\\ud800"), (1000002, 7)),
    "name-control-character": (KERNEL, KERNEL.replace(b"_tn", b"_\x01"), (1000002, 7)),
    "name-zero-byte": (KERNEL, KERNEL.replace(b"_tn", b"_\x00"), (1000002, 7)),
    "trailer-bad-escape": (b'"traceName": "', b'"traceName": "\\x', (1000002, 7)),
    "time-out-of-range": (KERNEL, KERNEL.replace(b"100500.0", b"1e300"), None),
    "time-past-64-bits": (KERNEL, KERNEL.replace(b"100500.0", b"18446744073709551616"), None),
    "time-as-text": (KERNEL, KERNEL.replace(b"100500.0", b'"soon"'), None),
    "length-infinite": (KERNEL, KERNEL.replace(b"30000.0", b"1e309"), None),
    "name-bad-escape": (KERNEL, KERNEL.replace(b"_tn", b"_\\x"), None),
    "zero-byte-between-keys": (KERNEL, KERNEL.replace(b'"pid"', b'\x00"pid"'), None),
    "last-event-bad-escape": (LAST, LAST.replace(b"_kernel", b"_\\x"), None),
}  # fmt: skip


@pytest.mark.parametrize("mangle", MANGLED, ids=list(MANGLED))
def test_a_damaged_value_loses_its_event_or_its_argument_not_the_trace(tmp_path, mangle):
    text = traces(Job(world=2, steps=3))[0].encode()
    old, new, kept = MANGLED[mangle]
    assert old in text
    before, _, after = text.rpartition(old) if mangle.startswith("last") else text.partition(old)
    plain, mangled = tmp_path / "rank-0.json", tmp_path / "bad" / "rank-0.json"
    mangled.parent.mkdir()
    plain.write_bytes(text)
    mangled.write_bytes(before + new + after)
    (spans, _, ours), (theirs, _, result) = read(plain), read(mangled)
    account = result.account
    assert account.lines == ours.account.lines == account.parsed + account.ignored + account.unrecognized
    if kept is None:  # the event lost, and said so
        (error,) = account.errors
        assert error.startswith("rank-0.json: 1 event whose ")
        assert account.unrecognized == 1 and theirs.height == spans.height - 1
        return
    assert account.errors == [] and account.unrecognized == 0 and theirs.height == spans.height
    at = spans.filter(pl.col("kind") == "kernel")["correlation"].to_list().index(1000002)  # its place, in time
    first = theirs.filter(pl.col("kind") == "kernel").row(at, named=True)
    assert first["name"].startswith("ampere_sgemm_128x64_") and (first["correlation"], first["stream"]) == kept


def test_trace_values_of_the_wrong_type_are_no_values_and_the_run_goes_on(tmp_path):
    """A mangled trace's distributedInfo (backend `[]`, a rank past 64 bits, a world size `true`)
    beside a sound trace: its values are none, and the traces' rows go in one table."""
    sound, other = traces(Job(world=2, steps=2)).values()
    info = '"distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2,'
    assert info in other
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.pt.trace.json").write_text(sound)
    bad = '"distributedInfo": {"backend": [], "rank": 18446744073709551616, "world_size": true,'
    (run / "b.pt.trace.json").write_text(other.replace(info, bad))
    alone = [
        kineto.ingest(InputFile(path, path.name, "kineto")).tables["trace_ranks"] for path in sorted(run.iterdir())
    ]
    assert pl.concat(alone, how="diagonal_relaxed").height == 2  # as a batch of small files puts them together
    ranks = analyze(run).tables["trace_ranks"].sort("file")
    assert ranks.select("rank", "backend", "world_size", "pg_count", "rank_source").rows() == [
        (0, "nccl", 2, 1, "distributedInfo"),
        (None, None, None, 1, "unknown"),
    ]


def test_zeros_with_text_after_them_are_damage_not_the_end(tmp_path, monkeypatch):
    """A run of zero bytes across several reads with events after it: only zeros to the file's end end
    the trace; these are the damaged text of the one event they precede."""
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 16)
    text = traces(Job(world=2, steps=300))[0].encode()
    plain, holed = tmp_path / "rank-0.json", tmp_path / "holed" / "rank-0.json"
    holed.parent.mkdir()
    plain.write_bytes(text)
    at = text.index(b'"ph": "X", ', (1 << 20) + 1000) + 11  # inside an event past the first MiB (read whole)
    holed.write_bytes(text[:at] + bytes(200_000) + text[at:])
    (spans, _, ours), (theirs, _, result) = read(plain), read(holed)
    assert result.account.notes == [] and result.account.errors == [
        "rank-0.json: 1 event whose text is not JSON, not read"
    ]
    assert result.account.lines == ours.account.lines and theirs.height >= spans.height - 1


def test_an_event_past_the_limit_is_refused_not_held(tmp_path, monkeypatch):
    """An event with no end in sight (a string of gigabytes in a damaged trace) would be held whole."""
    monkeypatch.setattr(kineto, "_EVENT_LIMIT", 1 << 20)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 16)
    text = traces(Job(world=2, steps=3))[0]
    path = tmp_path / "rank-0.json"
    path.write_text(text.replace("ampere_sgemm_128x64_tn", "x" * (2 << 20), 1))
    (error,) = kineto.ingest(InputFile(path, path.name, "kineto")).account.errors
    assert error.startswith("rank-0.json: not a readable profiler trace: an event longer than 1 MiB at byte ")
    path.write_text(text.replace("ampere_sgemm_128x64_tn", "x" * (1 << 19), 1))  # within it: read
    assert read(path)[0].filter(pl.col("name") == "x" * (1 << 19)).height == 1


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut"])
def test_zeros_after_a_trace_end_it_fast(tmp_path, cut):
    """A trace before a hole of 8 GiB (space never written, zero padding) ends at the hole: read as
    JSON, the zeros would be held as the start of an unfinished event."""
    text = traces(Job(world=2, steps=3))[0].encode()
    path = tmp_path / "rank-0.json"
    with path.open("wb") as fh:
        fh.write(text[:3000] if cut else text)
        fh.truncate(8 << 30)
    started = time.process_time()
    result = kineto.ingest(InputFile(path, path.name, "kineto"))
    assert time.process_time() - started < 10
    if cut:
        (error,) = result.account.errors
        assert error.startswith("rank-0.json: not a readable profiler trace: ")
        assert error.endswith("before zero bytes at byte 3,000 (a hole, or space never written)")
        return
    plain = tmp_path / "plain" / "rank-0.json"
    plain.parent.mkdir()
    plain.write_bytes(text)
    assert result.account.notes == [
        f"ends in {(8 << 30) - len(text):,} zero bytes from byte {len(text):,} (a hole, or space never written): "
        "read up to them"
    ]
    assert replace(result.account, notes=[]) == read(plain)[2].account


@pytest.mark.parametrize(
    ("name", "rank", "source"),
    [
        ("run/rank-3.pt.trace.json", 3, "file name"),
        ("run/host1_rank_12.1234.pt.trace.json", 12, "file name"),
        ("run/rank5/worker.pt.trace.json", 5, "folder"),
        ("run/worker.pt.trace.json", None, "unknown"),
    ],
)
def test_rank_without_distributed_info(tmp_path, name, rank, source):
    text = traces(Job(world=2, steps=2))[1]
    start, end = text.index('  "distributedInfo"'), text.index('  "traceEvents"')
    path = tmp_path / "t.json"
    path.write_text(text[:start] + text[end:])
    spans, meta, result = read(path, name)
    assert (meta["rank"], meta["rank_source"]) == (rank, source)
    assert spans["rank"].unique().to_list() == [rank]
    assert bool(result.account.errors) == (rank is None)


def test_not_a_trace_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(traces(Job(world=2, steps=2))[0][:5000])
    result = kineto.ingest(InputFile(path, path.name, "kineto"))
    assert result.tables == {} and "not a readable profiler trace" in result.account.errors[0]


@pytest.mark.parametrize("log", [True, False], ids=["a log names the machine", "only the folders name hosts"])
def test_a_traces_host_is_named_as_the_run_names_it(tmp_path, log):
    """A trace names its machine (`host_name`); the run's per-host folders name the host too. The trace
    takes the folder's name, as the files beside it do, unless another source of the run names the
    machine itself (NCCL prints the machine's name): then the run names hosts as the machines do."""
    for rank, text in traces(Job(world=2, steps=3)).items():
        folder = tmp_path / f"node-{'ab'[rank]}"
        folder.mkdir()
        machine = f"gpu{17 + rank}"
        (folder / f"rank-{rank}.pt.trace.json").write_text(
            text.replace('"schemaVersion": 1,', f'"schemaVersion": 1, "host_name": "{machine}",')
        )
        if log:
            (folder / "nccl.log").write_text(
                f"{machine}:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.{rank}<0>\n"
            )
    with analyze(tmp_path) as analysis:
        ranks = analysis.context.tables["trace_ranks"].sort("rank")
        spans = analysis.context.tables["trace_spans"].group_by("rank").agg(pl.col("host").unique()).sort("rank")
    named = ["gpu17", "gpu18"] if log else ["node-a", "node-b"]
    assert ranks["host_name"].to_list() == ["gpu17", "gpu18"] and ranks["host"].to_list() == named
    assert spans["host"].to_list() == [[h] for h in named]


# -- derived: breakdown and arrivals on generated traces ---------------------------------------------


def context(tmp_path: Path, job: Job) -> RunContext:
    """The generated traces of `job`, two ranks per host (node01, node02 ...), as a run's tables."""
    tables = RunTables()
    for rank, text in traces(job).items():
        host = f"node{rank // 2 + 1:02d}"
        path = tmp_path / host / f"rank-{rank}.pt.trace.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        result = kineto.ingest(InputFile(path, f"{host}/{path.name}", "kineto"))
        for name, frame in result.tables.items():
            tables.add(name, frame.with_columns(host=pl.lit(host)))
    return RunContext(tables)


STRAGGLER = {2: {step: 40.0 for step in range(20, 25)}}  # rank 2's forward 40 ms slower in steps 20-24


def test_breakdown_per_step_adds_up_to_the_window(tmp_path):
    ctx = context(tmp_path, Job())
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null())
    assert steps.height == 4 * 20 and steps["basis"].unique().to_list() == ["gpu"]
    parts = steps["computation_us"] + steps["exposed_comm_us"] + steps["memory_us"] + steps["idle_us"]
    assert ((parts - steps["window_us"]).abs() < 0.01).all()
    # the generator's step: 0.5 + 30 + 60 ms of kernels, buckets of 12 ms (half hidden by the backward
    # pass: 30 ms remain) and 6 ms after it, 8 ms optimizer, a 0.3 ms copy under the forward kernels' gap
    step = steps.filter(pl.col("rank") == 0, pl.col("step") == 12).row(0, named=True)
    assert step["window_us"] == pytest.approx(105_500)
    assert step["computation_us"] == pytest.approx(98_000)
    assert (step["communication_us"], step["overlapped_comm_us"], step["exposed_comm_us"]) == pytest.approx(
        (18_000, 12_000, 6_000)
    )
    whole = ctx.trace_breakdown.filter(pl.col("step").is_null(), pl.col("rank") == 0).row(0, named=True)
    mine = steps.filter(pl.col("rank") == 0)
    assert whole["computation_us"] == pytest.approx(mine["computation_us"].sum())
    assert whole["window_us"] == pytest.approx(mine["window_us"].sum())  # the steps' windows tile the whole


def test_a_kernel_running_over_several_windows_counts_in_each():
    # steps 1-3 launch a 10 us computation kernel at 0, 100 and 200; step 1 also an NCCL kernel that
    # runs from 50 to 250, past the last window's end (210)
    spans = pl.DataFrame(
        {
            "rank": [0] * 4,
            "kind": ["kernel"] * 4,
            "step": [1, 2, 3, 1],
            "category": ["computation"] * 3 + ["communication"],
            "start_us": [0.0, 100.0, 200.0, 50.0],
            "end_us": [10.0, 110.0, 210.0, 250.0],
            "dur_us": [10.0, 10.0, 10.0, 200.0],
            "depth": [None] * 4,
        },
        schema_overrides={"depth": pl.Int32},
    )
    out = derived.breakdown(spans.lazy())
    steps = out.filter(pl.col("step").is_not_null()).sort("step")
    assert steps["window_us"].to_list() == [100, 100, 10]
    assert steps["communication_us"].to_list() == [50, 100, 10]
    assert steps["overlapped_comm_us"].to_list() == [0, 10, 10]
    assert steps["idle_us"].to_list() == [40, 0, 0]
    whole = out.filter(pl.col("step").is_null()).row(0, named=True)
    assert (whole["window_us"], whole["communication_us"], whole["exposed_comm_us"]) == (250, 200, 180)
    assert (whole["computation_us"], whole["idle_us"]) == (30, 40)


def test_who_arrived_last_and_each_ranks_wait(tmp_path):
    ctx = context(tmp_path, Job(late=STRAGGLER))
    arrived = ctx.collective_arrivals
    assert arrived.height == 4 * 20 * 2 and arrived["ranks"].unique().to_list() == [4]
    assert arrived["key"].n_unique() == 40  # matched by Seq
    late = arrived.filter(pl.col("step").is_between(20, 24))
    assert late.filter("last")["rank"].unique().to_list() == [2]
    assert late.filter(pl.col("rank") != 2)["wait_us"].to_list() == pytest.approx([40_000] * 30)
    assert late.filter(pl.col("rank") == 2)["wait_us"].to_list() == [0.0] * 10
    assert (late["wait_us"] - late["wait_by_duration_us"]).abs().max() < 0.01
    # healthy steps: every rank arrives together, nobody is last
    assert arrived.filter(~pl.col("step").is_between(20, 24))["last"].sum() == 0
    waits = ctx.trace_waits.filter(pl.col("step") == 21).sort("rank")
    assert waits["wait_us"].to_list() == pytest.approx([80_000, 80_000, 0, 80_000])
    assert waits["last"].to_list() == [0, 0, 2, 0]


def test_clock_offsets_between_hosts_are_measured_and_removed(tmp_path):
    ahead = {rank: 2_500.0 for rank in (2, 3)}  # node02's clock runs 2.5 s ahead
    ctx = context(tmp_path, Job(late=STRAGGLER, clock_ms=ahead, sequence_numbers=False))
    arrived = ctx.collective_arrivals
    offsets = dict(arrived.group_by("host").agg(pl.col("clock_offset_us").first()).iter_rows())
    assert offsets["node02"] - offsets["node01"] == pytest.approx(2_500_000, abs=1)
    late = arrived.filter(pl.col("step").is_between(20, 24))
    assert late.filter("last")["rank"].unique().to_list() == [2]
    assert late.filter(pl.col("rank") != 2)["wait_us"].to_list() == pytest.approx([40_000] * 30, abs=1)


def test_cpu_only_gloo_traces(tmp_path):
    ctx = context(tmp_path, Job(gpu=False, late=STRAGGLER))
    steps = ctx.trace_breakdown
    assert steps["basis"].unique().to_list() == ["cpu"] and steps["step"].null_count() == 0
    late = ctx.collective_arrivals.filter(pl.col("step").is_between(20, 24))
    assert late.filter("last")["rank"].unique().to_list() == [2]
    assert [f.ranks for f in fire(ctx.tables, "TL431")] == [[2]]


def test_real_pair_of_ranks_matches_its_collectives(tmp_path):
    tables = RunTables()
    for name in ("hta_trace_filter_sampled_rank-0.json.gz", "hta_trace_filter_sampled_rank-1.json.gz"):
        _, _, result = read(unpacked(name, tmp_path))
        for table, frame in result.tables.items():
            tables.add(table, frame)
    arrived = RunContext(tables).collective_arrivals
    # the same 10 NCCL kernels on both ranks, matched by stream and position in the step
    assert arrived.height == 20 and arrived.group_by("pg", "step", "key").len()["len"].to_list() == [2] * 10
    assert (arrived["wait_us"] >= 0).all()


def test_the_whole_corpus_as_one_run(tmp_path):
    # each file's rows are a chunk of their own: polars's pl.format panicked on such a table once a
    # filter emptied a chunk between others (the GPU traces' collectives, after the CPU-only trace's)
    tables = RunTables()
    for name in sorted(CORPUS):
        _, _, result = read(unpacked(name, tmp_path))
        for table, frame in result.tables.items():
            tables.add(table, frame)
    ctx = RunContext(tables)
    assert tables.frame("trace_spans").n_chunks() > 2
    assert ctx.collective_arrivals.filter(pl.col("ranks") > 1)["rank"].unique().sort().to_list() == [0, 1]
    (finding,) = fire(tables, "TL431")
    assert finding.ranks == [1] and "8 of 10" in finding.title


def test_a_trace_on_one_line_is_not_said_to_be_cut(tmp_path):
    path = unpacked("hta_trace_filter_sampled_rank-0.json.gz", tmp_path)  # one line of 1.7 MB
    result = ingest_file(InputFile(path, path.name, "kineto", size=path.stat().st_size))
    assert result.account.notes == [] and result.account.lines == CORPUS[path.name + ".gz"][0]


def verdict_of(tmp_path: Path, job: Job, steps: range) -> tuple[Verdict, Candidate | None]:
    """The slow-window verdict from the traces alone, for the window of `steps`."""
    ctx = context(tmp_path, job)
    base = datetime.fromtimestamp(job.base_ns / 1e9, timezone.utc)
    begin, end = (base + timedelta(milliseconds=step_ms(job, s)[i]) for s, i in ((steps[0], 0), (steps[-1], 1)))
    return causes.verdict(list(ctx.trace_signals(begin, end)), "steps", [])


def test_traces_name_the_straggler_in_the_verdict(tmp_path):
    verdict, best = verdict_of(tmp_path, Job(late=STRAGGLER), range(20, 25))
    assert best is not None and (best.cause, best.ranks, best.hosts) == ("straggler", [2], ["node02"])
    assert verdict.confidence == "high"
    assert any("longer than rank 2 (node02), which arrived last at the collectives" in b for b in verdict.because)


def test_traces_tell_a_slow_network_from_a_straggler(tmp_path):
    # every transfer 30 ms slower in steps 20-24: every rank spends longer in its collectives, none
    # works longer and none arrives last
    verdict, best = verdict_of(tmp_path, Job(slow_transfer=dict.fromkeys(range(20, 25), 30.0)), range(20, 25))
    assert best is not None and (best.cause, best.ranks) == ("comm", [])


# -- rules -------------------------------------------------------------------------------------------


def test_tl431_names_the_last_arriving_rank(tmp_path):
    (finding,) = fire(context(tmp_path, Job(late=STRAGGLER)).tables, "TL431")
    assert finding.ranks == [2] and finding.hosts == ["node02"]
    assert "slow steps 20-24" in finding.title and "10 of 10 collectives, 100% of the others" in finding.title
    assert "100% of the time the other ranks waited at them was for it, 80.00 ms per step" in finding.summary


def test_tl431_stays_quiet_when_ranks_arrive_together(tmp_path):
    assert fire(context(tmp_path, Job()).tables, "TL431") == []


def test_tl431_stays_quiet_when_the_wait_is_small(tmp_path):
    slightly = {2: {step: 0.5 for step in range(10, 30)}}  # rank 2 always last, by 0.5 ms of 105 ms steps
    assert fire(context(tmp_path, Job(late=slightly)).tables, "TL431") == []
    (finding,) = fire(context(tmp_path, Job(late=slightly)).tables, "TL431", min_wait_share=0.001)
    assert finding.ranks == [2] and "whole trace" in finding.summary


def test_tl430_fires_on_exposed_communication(tmp_path):
    # the first bucket's 40 ms run 30 ms beside the backward pass, the second's 45 ms after it: 55 of 154.5 ms
    slow_network = Job(transfer_ms=(40.0, 45.0))
    (finding,) = fire(context(tmp_path, slow_network).tables, "TL430")
    assert finding.ranks == [0, 1, 2, 3]
    assert finding.title.startswith("Exposed communication: 36% of the median step")


def test_tl430_stays_quiet_when_communication_overlaps(tmp_path):
    assert fire(context(tmp_path, Job()).tables, "TL430") == []  # 6 of 105.5 ms exposed


def test_tl432_fires_when_the_gpu_waits_for_the_data_loader(tmp_path):
    # every step first waits 30 ms for its batch, the GPU idle: 31.2 of 135.5 ms
    (finding,) = fire(context(tmp_path, Job(loader_ms=30.0)).tables, "TL432")
    assert finding.ranks == [0, 1, 2, 3] and finding.hosts == ["node01", "node02"]
    assert finding.title == "GPU idle waiting for the host: 23% of the median step on rank 0 (data loader)"
    assert "96% of it while the data loader ran" in finding.summary


def test_tl432_stays_quiet_when_the_host_keeps_the_gpu_busy(tmp_path):
    assert fire(context(tmp_path, Job()).tables, "TL432") == []  # 1.2 of 105.5 ms between steps


# -- report ------------------------------------------------------------------------------------------


def test_report_section_has_a_row_and_a_lane_per_rank(tmp_path):
    from tests.helpers import NO_FINDINGS
    from tracelens.report.sections import traces as section

    data = section.context(context(tmp_path, Job(late=STRAGGLER)), NO_FINDINGS)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert [lane["rank"] for lane in data["lanes"]] == [0, 1, 2, 3]
    rank2 = data["lanes"][2]["bars"]
    assert [bar["step"] for bar in rank2 if bar["last"]] == [20, 21, 22, 23, 24]
    assert data["ranks"][0]["last"] == 0 and data["ranks"][2]["last"] == 10
    assert section.context(RunContext(RunTables()), NO_FINDINGS) is None


def test_timeline_has_a_lane_per_rank_of_its_traced_steps(tmp_path):
    from tests.helpers import NO_FINDINGS
    from tracelens.report.sections import timeline

    ctx = context(tmp_path, Job(late=STRAGGLER, loader_ms=30.0, base_ns=1_733_509_800 * 10**9))
    lanes = timeline._trace_steps(ctx)
    assert lanes["lane"].unique(maintain_order=True).to_list() == [f"rank {r} · trace" for r in range(4)]
    marked = lanes.group_by("lane", "colour").len().sort("lane", "colour")
    last, waited, _ = timeline.TRACE_STATES.values()
    # rank 2 came last in steps 20-24; in every other step every rank's GPU waited 30 ms for its loader
    # (but in the first: no GPU span before it went idle)
    assert marked.filter(pl.col("colour") == last).rows() == [("rank 2 · trace", last, 5)]
    assert marked.filter(pl.col("colour") == waited)["len"].to_list() == [19, 19, 14, 19]
    chart = timeline.context(ctx, NO_FINDINGS)["chart"]
    assert "rank 2 · trace" in chart and "arrived last at most of its collectives" in chart
    assert timeline._trace_steps(RunContext(RunTables())).height == 0


def test_derived_tables_are_empty_without_traces():
    ctx = RunContext(RunTables())
    assert ctx.trace_breakdown.height == 0 and ctx.collective_arrivals.height == 0
    assert fire(RunTables(), "TL431") == [] and derived.rank_waits(ctx.collective_arrivals).height == 0
    assert json.dumps(list(ctx.trace_breakdown.columns))


def test_straggler_fixture_report(analysis_of):
    from datetime import datetime, timedelta

    from tracelens.report.html import render

    analysis = analysis_of("profiler-straggler")
    top = json.loads((Path(__file__).resolve().parents[1] / "fixtures/profiler-straggler/expected.json").read_text())[
        "top"
    ]
    (finding,) = analysis.findings
    assert (finding.rule_id, finding.ranks, finding.hosts) == (top["rule"], top["ranks"], top["hosts"])
    begin, end = (datetime.fromisoformat(t) for t in top["window"])
    slack = timedelta(seconds=top["tolerance_s"])
    assert finding.window is not None
    assert begin - slack <= finding.window[0] and finding.window[1] <= end + slack
    html = render(analysis)
    assert '<section id="traces">' in html and html.count('class="trace-lane"') == 4
    assert html.count("trace-bar trace-last") == 3  # rank 2 arrived last in steps 15-17
