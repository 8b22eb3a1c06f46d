"""One bad value never loses a file or the analysis (issue 11): each malformed value below is
met with a null, an unrecognised line or a one-line error, and the rest of the run is read."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import polars as pl
import pytest

from tracelens.analyze import analyze
from tracelens.derived.step_times import ratio_of_medians
from tracelens.findings import Evidence
from tracelens.ingest import InputFile, ingest_file, sniff_format
from tracelens.ingest.text.lines import long_lines, read_chunks
from tracelens.report.html import render
from tracelens.report.summary import to_json

WATCHDOG = (
    "[rank0]:[E{clock}.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
)
DATED = (
    "[2024-12-06 18:30:00] node01:100:101 [0] misc/socket.cc:50 NCCL "
    "WARN socketProgress: Connection closed by remote peer node02<34567>"
)


def _run(tmp_path: Path, files: dict[str, str | bytes]):
    for name, text in files.items():
        path = tmp_path / "run" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    analysis = analyze(tmp_path / "run")
    json.dumps(to_json(analysis), allow_nan=False, default=str)  # strict JSON
    render(analysis)
    return analysis


def _input(analysis, name: str) -> dict:
    (row,) = [r for r in analysis.tables["inputs"].iter_rows(named=True) if r["file"] == name]
    return row


@pytest.mark.parametrize("clock", ["1206 24:00:00", "1206 25:61:99", "1306 10:00:00", "0231 10:00:00", "0000 00:00:00"])
def test_a_c10_time_that_is_no_time_leaves_the_line_untimed_and_the_analysis_whole(tmp_path: Path, clock: str):
    analysis = _run(tmp_path, {"node01/train.log": f"{DATED}\n{WATCHDOG.format(clock=clock)}\n"})
    assert [f.rule_id for f in analysis.findings if f.rule_id == "TL108"] == ["TL108"]
    errors = analysis.tables["nccl_errors"]
    watchdog = errors.filter(pl.col("kind") == "watchdog_timeout")
    assert watchdog.height == 1 and watchdog["ts_quality"][0] != "exact"  # at most inferred from its neighbour


def test_a_valid_c10_time_still_gets_the_files_year(tmp_path: Path):
    analysis = _run(tmp_path, {"node01/train.log": f"{DATED}\n{WATCHDOG.format(clock='1206 18:44:12')}\n"})
    watchdog = analysis.tables["nccl_errors"].filter(pl.col("kind") == "watchdog_timeout")
    assert str(watchdog["ts"][0]).startswith("2024-12-06 18:44:12")


@pytest.mark.parametrize("year", ["9999", "1600", "0001", "2263"])
def test_years_outside_what_a_timestamp_holds_are_no_time_not_wrapped(tmp_path: Path, year: str):
    nccl = DATED.replace("2024", year)
    deepspeed = (
        f"[{year}-05-01 10:00:05,000] [INFO] [logging.py:96:log_dist] "
        "[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
    )
    analysis = _run(tmp_path, {"node01/train.log": f"{nccl}\n{deepspeed}\n"})
    for table in ("nccl_errors", "steps"):
        frame = analysis.tables[table]
        assert frame.height == 1, table
        assert frame["ts"][0] is None, f"{table}: year {year} read as {frame['ts'][0]}"


def test_a_20_digit_pid_is_one_unrecognised_line_not_a_lost_file(tmp_path: Path):
    lines = [
        "node01:100:100 [0] NCCL INFO Using network IB",
        "node01:12345678901234567890:100 [0] NCCL INFO Using network IB",
        "node01:100:100 [4294967296] NCCL INFO NET/IB : No device found.",
        "node01:100:100 [0] NCCL INFO Channel 99999999999999999999/0 : 0[0] -> 1[1] via NET/IB/18446744073709551616",
    ]
    analysis = _run(tmp_path, {"node01/nccl.log": "\n".join(lines) + "\n"})
    row = _input(analysis, "node01/nccl.log")
    assert not row["errors"]
    assert (row["lines"], row["parsed"], row["unrecognized"]) == (4, 2, 2)
    assert sorted(s["line"] for s in row["samples"]) == [2, 3]
    assert analysis.tables["nccl_channels"]["nic"].to_list() == [None]  # the bad number is null, the row kept


PERFQUERY = """# hostname
node01
Fri Dec  6 18:{minute}:00 UTC 2024
# Port extended counters: Lid 11 port 1 (CapMask: 0x5300)
PortXmitData:....................{xmit}
PortRcvData:.....................{rcv}
SymbolErrorCounter:..............{sym}
LinkDownedCounter:...............0
"""


def test_a_counter_of_2_64_is_one_unrecognised_line_and_huge_deltas_do_not_crash(tmp_path: Path):
    before = PERFQUERY.format(minute=30, xmit=0, rcv=5, sym=0)
    after = PERFQUERY.format(minute=45, xmit=2**64 - 1, rcv=2**64, sym=2**63 + 5)
    analysis = _run(tmp_path, {"node01/perfquery-before.txt": before, "node01/perfquery-after.txt": after})
    row = _input(analysis, "node01/perfquery-after.txt")
    assert not row["errors"] and row["unrecognized"] == 1 and row["samples"][0]["line"] == 6
    values = analysis.tables["ib_counters"].filter(pl.col("file") == "node01/perfquery-after.txt")
    assert set(values["counter"]) >= {"PortXmitData", "SymbolErrorCounter"} and "PortRcvData" not in set(
        values["counter"]
    )
    events = analysis.context.network_events  # deltas of 2^63 and more: counted at the largest count, no error
    assert events.filter(pl.col("what") == "SymbolErrorCounter")["count"].to_list() == [2**63 - 1]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_ds_config_numbers_that_are_no_numbers_fire_no_rule_and_crash_nothing(tmp_path: Path, value: str):
    config = (
        '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": %s, "overlap_comm": false,'  # noqa: UP031
        ' "reduce_bucket_size": %s, "allgather_bucket_size": %s}}'
        % (value, value, value)  # %: the JSON's braces stay as they are
    )
    analysis = _run(tmp_path, {"node01/ds_config.json": config})
    assert {f.rule_id for f in analysis.findings} & {"TL501", "TL502"} == set()
    keys = set(analysis.tables["deepspeed_settings"]["key"])
    assert "zero_optimization.stage" in keys and "zero_optimization.reduce_bucket_size" in keys


def test_a_20000_key_ds_config_on_one_line_is_read_in_well_under_a_second(tmp_path: Path):
    settings = {"zero_optimization": {"stage": 2}, "train_batch_size": 8, **{f"key{i}": i for i in range(20_000)}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(settings))
    started = time.perf_counter()
    result = ingest_file(InputFile(path=path, name="ds_config.json", format=sniff_format(path.read_bytes()[:65536])))
    elapsed = time.perf_counter() - started
    assert result.account.parsed == 20_002 and elapsed < 5  # linear: a quadratic read takes minutes
    lines = result.tables["deepspeed_settings"]["line"]
    assert lines.null_count() == 0 and set(lines) == {1}


def test_json_nested_too_deeply_is_a_one_line_error(tmp_path: Path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"zero_optimization": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = ingest_file(InputFile(path=path, name="ds_config.json", format="ds_config"))
    assert result.account.errors == ["ds_config.json: JSON nested too deeply to be a DeepSpeed config"]


def test_missing_timer_values_give_no_ratio_instead_of_an_error():
    assert ratio_of_medians(pl.Series([None, None], dtype=pl.Float64), pl.Series([1.0, 2.0])) is None
    assert ratio_of_medians(pl.Series([4.0]), pl.Series([None], dtype=pl.Float64)) is None
    assert ratio_of_medians(pl.Series([4.0]), pl.Series([2.0])) == 2.0


def test_one_nul_byte_does_not_make_a_log_binary_but_utf16_is_named(tmp_path: Path):
    text = b"node01:100:100 [0] NCCL INFO Using network IB\n"
    assert sniff_format(text[:10] + b"\x00" + text[10:] * 20) == "log"
    assert sniff_format(b"\x01\x00\x00\x00" * 1024) == "binary"
    assert sniff_format(b"\x00" * 4096) == "zeros"  # what follows them says what the file is (ingest_file)
    utf16 = text.decode().encode("utf-16")
    assert sniff_format(utf16) == "utf16"
    path = tmp_path / "w.log"
    path.write_bytes(utf16)
    (error,) = ingest_file(InputFile(path=path, name="w.log", format="utf16")).account.errors
    assert "UTF-16" in error and "iconv" in error


def test_a_200_mb_line_without_newline_is_read_as_one_bounded_line(tmp_path: Path):
    path = tmp_path / "huge.log"
    with path.open("wb") as fh:
        fh.write(b"node01:100:100 [0] NCCL INFO Using network IB\n")
        block = b"x" * (1 << 20)
        for _ in range(200):
            fh.write(block)
    chunks = list(read_chunks(path, chunk_bytes=8 << 20))
    texts = pl.concat(chunks)["text"]
    assert texts.len() == 2 and len(texts[1]) == 1 << 20  # one line, its first MiB
    result = ingest_file(InputFile(path=path, name="huge.log", format="log", size=path.stat().st_size))
    assert result.account.lines == 2
    assert result.account.notes == [
        "1 line longer than 1 MiB, read as its first MiB: line 2 (209,715,200 bytes)"
    ]  # the cut is said, not silent
    for _, text in result.account.samples:
        assert len(text) < 1000
    assert len(Evidence("f", 1, "y" * 10_000_000).text) < 3000


def test_an_over_long_line_followed_by_more_lines_keeps_the_count(tmp_path: Path):
    path = tmp_path / "mixed.log"
    path.write_bytes(b"a\n" + b"z" * (3 << 20) + b"\nb\nc")
    texts = pl.concat(list(read_chunks(path, chunk_bytes=1 << 20)))["text"].to_list()
    assert [t[:1] for t in texts] == ["a", "z", "b", "c"] and len(texts[1]) == 1 << 20


DS_STEP = (
    "[2024-05-01 10:00:{s:02d},000] [INFO] [logging.py:96:log_dist] [Rank 0] "
    "step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
)
DS_TIMERS = "[Rank 0] time (ms) | fwd: {fwd} | bwd: 240.10 | bwd_inner: 200.00 | bwd_allreduce: 40.10 | step: 30.00"
DS_THROUGHPUT = (
    "[2024-05-01 10:00:{s:02d},001] [INFO] [timer.py:260:stop] epoch=0/micro_step={step}/global_step={step}, "
    "RunningAvgSamplesPerSec=120.5, CurrSamplesPerSec={curr}, MemAllocated=4.1GB, MaxMemAllocated=6.2GB"
)


@pytest.mark.parametrize("value", ["1e309", "99999999999999999999", "-1e400", "nan"])
def test_a_deepspeed_value_out_of_range_is_a_bad_value_of_its_line(tmp_path: Path, value: str):
    """A timer of 1e309 or of 20 digits does not fit the step-start derivation (f64 to i64), a
    throughput of infinity not the chart's axis. Such a value is its line's fault: the line is
    unrecognised and shown, its row left out, the rest read."""
    lines = []
    for i in range(12):
        bad = i == 6
        lines += [
            DS_STEP.format(s=i, step=i + 1),
            DS_TIMERS.format(fwd=value if bad else "120.50"),
            DS_THROUGHPUT.format(s=i, step=i + 1, curr=value if bad else f"{120 + i}.0"),
        ]
    analysis = _run(tmp_path, {"node01/train.log": "\n".join(lines) + "\n"})
    row = _input(analysis, "node01/train.log")
    assert (row["lines"], row["unrecognized"], row["parsed"]) == (36, 2, 34) and not row["errors"]
    assert sorted(s["line"] for s in row["samples"]) == [20, 21]
    steps = analysis.tables["steps"]
    for column in ("fwd_ms", "samples_per_sec"):
        values = steps[column].drop_nulls()
        assert values.len() > 0 and values.is_finite().all() and values.abs().max() < 1e6, column


def test_a_chart_axis_over_infinite_or_huge_values_still_has_ticks():
    from tracelens.report.svg import Scale

    for lo, hi in ((0.0, float("inf")), (-1e308, 1e308), (float("nan"), 1.0)):
        ticks = Scale(lo, hi, 0, 100, zero=True).ticks(4)
        assert ticks and all(math.isfinite(t) for t, _ in ticks)


def test_long_lines_are_found_in_one_pass_whatever_the_block_size(tmp_path: Path):
    path = tmp_path / "mixed.log"
    lengths = [0, 3, 10, 11, 40, 2, 10, 25, 1, 12]
    path.write_bytes(b"\n".join(b"x" * n for n in lengths))  # no newline after the last
    want = [(i + 1, n) for i, n in enumerate(lengths) if n > 10]
    for block in (1, 3, 7, 11, 64, 1 << 20):
        assert long_lines(path, max_line=10, block_bytes=block) == want, block


def test_long_lines_match_a_plain_split_on_random_files(tmp_path: Path):
    # files with no long line are passed over without counting lines: both answers must agree
    rng = random.Random(5)
    path = tmp_path / "random.log"
    for _ in range(400):
        max_line = rng.choice([4, 8, 16])
        lengths = [
            rng.choice([0, max_line - 1, max_line, max_line + 1, rng.randint(0, 3 * max_line)]) for _ in range(12)
        ]
        data = b"\n".join(b"x" * n for n in lengths) + rng.choice([b"", b"\n"])
        path.write_bytes(data)
        want = [(i + 1, len(line)) for i, line in enumerate(data.split(b"\n")) if len(line) > max_line]
        for block in (5, 17, 64):
            assert long_lines(path, max_line=max_line, block_bytes=block) == want, (lengths, block)


def test_a_line_over_a_mib_inside_a_block_is_cut_to_its_head_and_noted(tmp_path: Path):
    path = tmp_path / "nccl.log"
    head = b"node01:100:100 [0] NCCL INFO Using network IB\n"
    path.write_bytes(head + b"y" * (5 << 20) + b"\n" + head)
    texts = pl.concat(list(read_chunks(path)))["text"]
    assert [len(t) for t in texts.to_list()] == [len(head) - 1, 1 << 20, len(head) - 1]
    result = ingest_file(InputFile(path=path, name="nccl.log", format="log", size=path.stat().st_size))
    assert (result.account.lines, result.account.parsed) == (3, 2)
    assert result.account.notes and "line 2 (5,242,880 bytes)" in result.account.notes[0]


def _ingest_timed(path: Path, data: bytes) -> tuple[float, object]:
    path.write_bytes(data)
    started = time.perf_counter()
    result = ingest_file(InputFile(path=path, name=path.name, format=sniff_format(data[:65536]), size=len(data)))
    return time.perf_counter() - started, result


@pytest.mark.parametrize(
    "line",
    [
        b"x" * (100 << 10),
        b"\x00" * (1 << 20),
        b"/sys/class/infiniband/mlx5_0/ports/1/hw_counters/" + b"a" * (100 << 10),
    ],
)
def test_one_long_line_in_a_sysfs_counter_dump_costs_no_more_than_its_bytes(tmp_path: Path, line: bytes):
    """One long line costs what its bytes cost: no regex of the dump's reader backtracks over it."""
    dump = b"".join(
        b"/sys/class/infiniband/mlx5_0/ports/1/counters/%s:%d\n" % (n, i)
        for i, n in enumerate([b"symbol_error", b"link_downed", b"port_xmit_data"])
    )
    elapsed, result = _ingest_timed(tmp_path / "sysfs.txt", dump + line + b"\n" + dump)
    assert elapsed < 5 and result.account.parsed == 6 and result.account.unrecognized == 1


def test_one_long_line_in_an_nvidia_smi_csv_loop_costs_no_more_than_its_bytes(tmp_path: Path):
    """One long line in a query loop costs what its bytes cost: the grammar (Earley) never parses a
    whole line, only its shape."""
    header = b"index, utilization.gpu [%], power.draw [W], clocks.current.sm [MHz]\n"
    row = b"0, 26 %, 83.92 W, 1320 MHz\n"
    elapsed, result = _ingest_timed(
        tmp_path / "smi.csv", header + row * 5 + (row[:-1] + b" ") * (200_000) + b"\n" + row * 5
    )
    assert elapsed < 20 and result.account.parsed == 11 and result.account.unrecognized == 1
    assert result.tables["gpu_samples"].height == 10


def test_a_long_stack_frame_line_in_analyzer_text_costs_no_more_than_its_bytes(tmp_path: Path):
    frame = b" all_reduce at /venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3245"
    text = (
        b"Not all ranks joining collective, sequence number: 6\ngroup info: 0:default_pg\ncollective: nccl:all_reduce\n"
        b"missing ranks: {1}\nexpected ranks: {0, 1}\ncollective state: scheduled\ncollective stack trace:\n"
        + frame * 700
        + b"\n"
        + frame
        + b"\n"
    )
    elapsed, result = _ingest_timed(tmp_path / "frtrace.txt", text)
    assert elapsed < 5
    (frames,) = result.tables["fr_entries"]["frames"].to_list()
    assert [f["line"] for f in frames] == [3245, 3245]


def test_a_pcap_record_claiming_2_31_bytes_is_named_as_such_not_a_byte_order_mismatch(tmp_path: Path):
    """Snaplen 0xFFFFFFFF and a first caplen of 2^31 are not a byte-order mismatch (2^31 read the
    other way round is 128, which looks plausible): the header's own version says its order is right."""
    import struct

    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 0xFFFFFFFF, 1)
    path = tmp_path / "cap.pcap"
    path.write_bytes(header + struct.pack("<IIII", 1, 0, 2**31, 2**31) + b"\0" * 64)
    (error,) = ingest_file(
        InputFile(path=path, name="cap.pcap", format="pcap", size=path.stat().st_size)
    ).account.errors
    assert "claims 2,147,483,648 captured bytes" in error and "byte order" not in error
    rewritten = tmp_path / "swapped.pcap"  # the magic rewritten big-endian, the records still little-endian
    rewritten.write_bytes(struct.pack(">I", 0xA1B2C3D4) + header[4:] + struct.pack("<IIII", 1, 0, 60, 60) + b"\0" * 60)
    errors = ingest_file(InputFile(path=rewritten, name="s.pcap", format="pcap", size=140)).account.errors
    assert "byte order does not match" in errors[0]
