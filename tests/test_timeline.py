"""The time model: inferred times and their brackets, c10 dates, the logs' zone, per-host clock offsets."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.helpers import FIXTURES, corpus_dir, fire, tables_from
from tests.helpers.steps import steps as correlate_steps
from tracelens import inferred
from tracelens.cli import app
from tracelens.derived.flows import event_times
from tracelens.tables import RunTables, conform
from tracelens.timeline import Timeline, align

T0 = datetime(2024, 12, 6, 18, 30, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def nccl(line: int, ts: datetime | None = None, pid: int = 100, **more) -> dict:
    return {"line": line, "host": "node01", "pid": pid, "ts": ts, "level": "INFO", "message": f"line {line}", **more}


def aligned(tables: RunTables, tz: str | None = None) -> tuple[RunTables, Timeline]:
    """The tables aligned as the pipeline aligns them (capture events telling zone shifts apart)."""
    return align(tables, tz, capture_events=event_times)


def by_line(frame: pl.DataFrame) -> dict[int, dict]:
    return {r["line"]: r for r in frame.iter_rows(named=True)}


def test_untimed_lines_are_bracketed_by_their_timestamped_neighbours():
    t = tables_from(nccl_events=[nccl(1, at(0)), nccl(2), nccl(3), nccl(4, at(10)), nccl(5)])
    t, _ = aligned(t)
    rows = by_line(t["nccl_events"])
    assert rows[1]["ts_quality"] == "exact" and rows[1]["ts_lo"] == rows[1]["ts_hi"] == at(0)
    for line in (2, 3):
        assert rows[line]["ts_quality"] == "inferred"
        assert (rows[line]["ts_lo"], rows[line]["ts_hi"], rows[line]["ts"]) == (at(0), at(10), at(5))
    # after the last timestamp: only a lower bound
    assert (rows[5]["ts_quality"], rows[5]["ts_lo"], rows[5]["ts_hi"], rows[5]["ts"]) == (
        "inferred",
        at(10),
        None,
        at(10),
    )


def test_a_line_takes_its_own_process_bracket_before_the_files():
    t = tables_from(
        nccl_events=[
            nccl(1, at(0), pid=1),
            nccl(2, at(4), pid=2),
            nccl(3, pid=1),
            nccl(4, pid=2),
            nccl(5, at(10), pid=1),
        ]
    )
    t, _ = aligned(t)
    rows = by_line(t["nccl_events"])
    assert (rows[3]["ts_lo"], rows[3]["ts_hi"]) == (at(0), at(10))  # pid 1's own lines, not pid 2's line 2
    assert (rows[4]["ts_lo"], rows[4]["ts_hi"]) == (at(4), at(10))  # pid 2 has nothing after: the file's next line


def test_other_tables_share_the_time_of_their_line():
    t = tables_from(
        nccl_events=[nccl(1, at(0)), nccl(2), nccl(3, at(2))],
        nccl_errors=[{"line": 2, "host": "node01", "kind": "ib_completion"}],
    )
    t, _ = aligned(t)
    error = t["nccl_errors"].row(0, named=True)
    assert (error["ts_quality"], error["ts"], error["ts_lo"], error["ts_hi"]) == ("inferred", at(1), at(0), at(2))


def test_a_file_without_any_time_stays_without():
    t = tables_from(nccl_events=[nccl(1), nccl(2)])
    t, _ = aligned(t)
    assert t["nccl_events"]["ts_quality"].to_list() == ["none", "none"]
    assert t["nccl_events"]["ts"].null_count() == 2


def test_pytorch_clock_is_dated_from_the_file_with_a_one_second_bracket():
    t = tables_from(nccl_events=[nccl(1, at(0)), nccl(2, clock="1206 18:41:33", level="ERROR")])
    t, _ = aligned(t)
    row = by_line(t["nccl_events"])[2]
    assert row["ts_quality"] == "exact"
    assert (row["ts"], row["ts_hi"] - row["ts_lo"]) == (
        datetime(2024, 12, 6, 18, 41, 33, tzinfo=timezone.utc),
        timedelta(seconds=1),
    )


def test_pytorch_clock_across_the_new_year_takes_the_year_before():
    january = datetime(2025, 1, 1, 0, 5, tzinfo=timezone.utc)
    t = tables_from(nccl_events=[nccl(1, january), nccl(2, clock="1231 23:59:58", level="ERROR")])
    t, _ = aligned(t)
    assert by_line(t["nccl_events"])[2]["ts"] == datetime(2024, 12, 31, 23, 59, 58, tzinfo=timezone.utc)


def _steps(first: datetime, count: int = 60, host: str = "node01", every: float = 10.0) -> list[dict]:
    return [
        {
            "file": f"{host}/train.log",
            "line": i + 1,
            "host": host,
            "rank": 0,
            "step": i + 1,
            "ts": first + timedelta(seconds=every * i),
        }
        for i in range(count)
    ]


def _capture(first: datetime, seconds: int = 120) -> list[dict]:
    return [{"file": "capture.pcap", "frame": i, "ts": first + timedelta(seconds=i)} for i in range(seconds)]


def test_logs_three_hours_ahead_of_a_capture_are_shifted_to_it():
    local = T0 + timedelta(hours=3)  # the logs' wall clock in UTC+3, read as if UTC
    t = tables_from(steps=_steps(local), packets=_capture(T0 + timedelta(minutes=2)))
    t, timeline = aligned(t)
    assert (timeline.basis, timeline.shift_hours, timeline.zone) == ("capture", 3.0, "UTC+03:00")
    assert t["steps"]["ts"].min() == T0
    assert "-3 h" in timeline.notes[0] and "UTC+03:00" in timeline.notes[0]


def test_half_hour_zones_are_found_too():
    t = tables_from(steps=_steps(T0 + timedelta(hours=5, minutes=30)), packets=_capture(T0 + timedelta(minutes=2)))
    assert aligned(t)[1].shift_hours == 5.5


def test_an_unrelated_offset_is_not_taken_for_a_zone():
    local = T0 + timedelta(hours=3, minutes=17)
    t = tables_from(steps=_steps(local, count=12), packets=_capture(T0 + timedelta(minutes=2)))
    t, timeline = aligned(t)
    assert (timeline.basis, timeline.shift_hours) == ("assumed", 0.0)
    assert t["steps"]["ts"].min() == local  # left as read
    assert "assumed" in timeline.notes[0]


def test_logs_that_already_match_the_capture_stay():
    t = tables_from(steps=_steps(T0), packets=_capture(T0 + timedelta(minutes=2)))
    t, timeline = aligned(t)
    assert (timeline.basis, timeline.shift_hours) == ("agrees", 0.0)


def test_without_any_utc_source_utc_is_assumed_and_said():
    t = tables_from(steps=_steps(T0))
    t, timeline = aligned(t)
    assert timeline.basis == "assumed" and "--tz" in timeline.notes[0]


def test_tz_option_reads_logs_in_that_zone_with_daylight_saving():
    t = tables_from(
        steps=[
            {"host": "node01", "step": 1, "ts": datetime(2024, 12, 6, 19, 30, tzinfo=timezone.utc)},
            {"host": "node01", "step": 2, "ts": datetime(2024, 7, 6, 20, 30, tzinfo=timezone.utc)},
        ]
    )
    t, timeline = aligned(t, tz="Europe/Berlin")
    assert timeline.basis == "--tz"
    assert t["steps"]["ts"].to_list() == [
        datetime(2024, 12, 6, 18, 30, tzinfo=timezone.utc),
        datetime(2024, 7, 6, 18, 30, tzinfo=timezone.utc),
    ]


def test_counter_dumps_named_by_local_time_move_with_the_logs_but_zoned_ones_do_not():
    stamped = {"host": "node01", "counter": "SymbolErrorCounter", "value": 0}
    t = tables_from(
        steps=_steps(T0),
        ib_counters=[
            {**stamped, "ts": at(0), "dump_ts": at(0), "ts_quality": "exact"},
            {**stamped, "ts": at(600), "dump_ts": at(600), "ts_quality": "filename"},
        ],
    )
    t, _ = aligned(t, tz="Asia/Tokyo")
    assert t["ib_counters"]["dump_ts"].to_list() == [at(0), at(600) - timedelta(hours=9)]


def test_a_host_whose_clock_runs_ahead_is_measured_on_shared_steps_and_corrected():
    t = tables_from(steps=_steps(T0) + _steps(T0 + timedelta(seconds=2.5), host="node02"))
    t, timeline = aligned(t)
    offsets = {r["host"]: r for r in timeline.offsets.iter_rows(named=True)}
    assert abs(offsets["node02"]["offset_s"] - 2.5) < 1e-3 and offsets["node02"]["applied"]
    assert offsets["node01"]["offset_s"] == 0.0 and not offsets["node01"]["applied"]
    node02 = t["steps"].filter(pl.col("host") == "node02")
    assert node02["ts"].min() == T0
    assert any("node02 +2.500 s" in n for n in timeline.notes)


def test_two_logs_of_one_host_name_with_different_clocks_are_measured_apart():
    """Issue 10's lab run: two ranks in network namespaces of one machine print the same host name,
    and one runs under libfaketime 2.5 s ahead, a slow window in both logs."""
    slow = range(100, 140)
    rank0 = [
        {**r, "host": "lab", "ts": r["ts"] + timedelta(milliseconds=30 * (r["step"] % 3))}
        for r in correlate_steps(slow=slow, file="rank0.log")
    ]
    rank1 = [
        {**r, "host": "lab", "rank": 1, "ts": r["ts"] + timedelta(seconds=2.5, milliseconds=20 * (r["step"] % 4))}
        for r in correlate_steps(slow=slow, file="rank1.log")
    ]
    t = tables_from(steps=rank0 + rank1)
    t, timeline = aligned(t)
    rank1 = timeline.offsets.filter(pl.col("file") == "rank1.log").row(0, named=True)
    assert abs(rank1["offset_s"] - 2.5) < 0.5 and rank1["applied"] and rank1["uncertainty_s"] < 0.5
    assert any("lab (rank1.log) +2.500 s (± 0.100 s" in n for n in timeline.notes), timeline.notes
    (window,) = fire(t, "TL410")  # one window, at the true time: step 100 starts 99 s after T0 by rank 0's clock
    assert (
        abs(window.window[0] - (T0 + timedelta(seconds=99))) < timedelta(seconds=2)
        and "seen in the logs of 2 ranks" in window.summary
    )


def test_an_offset_below_the_evidence_resolution_is_not_applied():
    t = tables_from(steps=_steps(T0) + _steps(T0 + timedelta(seconds=0.05), host="node02"))
    t, timeline = aligned(t)
    assert not timeline.offsets["applied"].any()
    assert t["steps"].filter(pl.col("host") == "node02")["ts"].min() == T0 + timedelta(seconds=0.05)


def test_watchdog_timeouts_of_one_collective_give_the_offset_by_their_start():
    def timeout(host: str, fired: datetime, ran_ms: int) -> dict:
        return {
            "host": host,
            "kind": "watchdog_timeout",
            "seq": 1583,
            "op_type": "ALLREDUCE",
            "ran_ms": ran_ms,
            "ts": fired,
            "ts_quality": "exact",
        }

    # both started the collective at T0; node02's clock is 4 s ahead and its watchdog fired later
    rows = [timeout("node01", at(600), 600_000)] * 3 + [timeout("node02", at(604 + 2), 602_000)] * 3
    _, timeline = aligned(tables_from(nccl_errors=rows))
    node02 = timeline.offsets.filter(pl.col("host") == "node02").row(0, named=True)
    assert (node02["offset_s"], node02["basis"], node02["applied"]) == (4.0, "watchdog", True)


def test_packets_captured_at_both_ends_give_the_capturing_hosts_offset():
    frames = [
        {"src": "10.0.0.1", "dst": "10.0.0.2", "proto": "roce", "ip_id": i, "digest": 1000 + i} for i in range(20)
    ]
    a = [{"file": "a.pcap", "frame": i, "host": "node01", "ts": at(i * 0.01), **f} for i, f in enumerate(frames)]
    b = [{"file": "b.pcap", "frame": i, "host": "node02", "ts": at(i * 0.01 + 0.2), **f} for i, f in enumerate(frames)]
    _, timeline = aligned(tables_from(packets=a + b))
    node02 = timeline.offsets.filter(pl.col("host") == "node02").row(0, named=True)
    assert abs(node02["offset_s"] - 0.2) < 1e-3 and node02["basis"] == "packets" and node02["applied"]


def test_cli_rejects_an_unknown_zone():
    result = CliRunner().invoke(app, ["analyze", str(FIXTURES / "healthy-2node-ib"), "--tz", "Mars/Olympus"])
    assert result.exit_code == 2
    assert "not a time zone" in result.output


def _long_run_in_utc_plus_3(errors_at: list[float]) -> dict:
    """Two hours of steps printed in UTC+3, a five-minute capture in its middle (UTC), and NCCL
    completion errors at `errors_at` seconds into the capture, as the logs print them."""
    capture_start = T0 + timedelta(hours=1)
    local = timedelta(hours=3)
    nak = {
        "proto": "roce",
        "src": "10.0.0.2",
        "dst": "10.0.0.1",
        "opcode": 17,
        "dest_qp": 7,
        "psn": 0x60,
        "syndrome": 0x60,
    }
    packets = _capture(capture_start, seconds=300) + [
        {"file": "capture.pcap", "frame": 1000 + i, "ts": capture_start + timedelta(seconds=s), **nak}
        for i, s in enumerate(errors_at)
    ]
    errors = [
        {
            "file": "node01/train.log",
            "line": 10_000 + i,
            "host": "node01",
            "kind": "ib_completion",
            "ts": capture_start + local + timedelta(seconds=s),
            "ts_quality": "exact",
        }
        for i, s in enumerate(errors_at)
    ]
    return {"steps": _steps(T0 + local, count=720), "packets": packets, "nccl_errors": errors}


def test_a_long_log_around_a_short_capture_takes_the_shift_its_errors_line_up_at():
    t = tables_from(**_long_run_in_utc_plus_3(errors_at=[40, 130, 250]))
    t, timeline = aligned(t)
    assert (timeline.basis, timeline.shift_hours) == ("capture", 3.0)
    assert "line up" in timeline.notes[0] and "UTC+03:00" in timeline.notes[0]


def test_a_long_log_around_a_short_capture_without_events_is_ambiguous_not_guessed():
    t = tables_from(**_long_run_in_utc_plus_3(errors_at=[]))
    t, timeline = aligned(t)
    assert (timeline.basis, timeline.shift_hours) == ("assumed", 0.0)
    note = timeline.notes[0]
    assert "ambiguous" in note and "UTC+03:00" in note and "UTC+02:30" in note and "--tz" in note
    assert t["steps"]["ts"].min() == T0 + timedelta(hours=3)  # left as read


def test_a_capture_of_another_day_overlaps_at_no_shift_and_utc_is_assumed():
    run = _long_run_in_utc_plus_3(errors_at=[40, 130, 250])
    run["packets"] = _capture(T0 + timedelta(days=1))
    _, timeline = aligned(tables_from(**run))
    assert (timeline.basis, timeline.shift_hours) == ("assumed", 0.0)
    assert "at no whole or half hour shift" in timeline.notes[0]


def test_alignment_gives_new_tables_and_leaves_the_read_ones_as_they_were():
    read = tables_from(steps=[{"host": "node01", "step": 1, "ts": at(3600)}])
    tables, _ = aligned(read, tz="Europe/Berlin")
    assert read["steps"]["ts"].to_list() == [at(3600)] and "ts_read" not in read["steps"].columns
    assert tables["steps"]["ts"].to_list() == [at(0)]  # 19:30 in Berlin in December is 18:30 UTC
    assert tables["steps"]["ts_read"].to_list() == [at(3600)]


def test_tables_writes_the_aligned_tables_of_analyze_with_the_printed_times_beside(tmp_path):
    """`tracelens tables` and `analyze --tables` write the same tables: `ts` in UTC as the time model
    placed it (here 3 h earlier than printed, the shift found against the capture), `ts_text` as printed."""
    run = FIXTURES / "scenario-tz-shift"
    runner = CliRunner()
    alone, beside = tmp_path / "tables", tmp_path / "analyze-tables"
    assert runner.invoke(app, ["tables", str(run), "-o", str(alone), "-j", "1"]).exit_code == 0
    analysed = runner.invoke(
        app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), "--tables", str(beside), "-j", "1"]
    )
    assert analysed.exit_code == 0
    names = sorted(p.name for p in alone.glob("*.parquet"))
    assert names == sorted(p.name for p in beside.glob("*.parquet")) and "steps.parquet" in names
    for name in names:
        assert pl.read_parquet(alone / name).equals(pl.read_parquet(beside / name), null_equal=True), name
    steps = pl.read_parquet(alone / "steps.parquet").filter(pl.col("ts_text").is_not_null())
    assert steps.height > 100
    # DeepSpeed's logger prints `2024-12-06 21:30:09,638`: the text is that, comma and all
    printed = steps["ts_text"].str.to_datetime("%Y-%m-%d %H:%M:%S,%3f", time_unit="ns", time_zone="UTC")
    assert ((printed - steps["ts"]) == timedelta(hours=3)).all()
    for row in steps.head(20).iter_rows(named=True):
        text = (run / row["file"]).read_text().splitlines()[row["line"] - 1]
        assert row["ts_text"] in text  # the time exactly as the log printed it
    captured = pl.read_parquet(alone / "packets.parquet")
    # UTC already
    assert captured.height and (captured["ts_text"] == captured["ts"].dt.to_string("%Y-%m-%d %H:%M:%S%.f")).all()


def test_tables_held_as_lazy_scans_are_aligned_lazily_to_the_same_rows():
    """Spilled tables reach the timeline as lazy scans: a zone found against the capture and a host's
    clock offset are applied to them as lazy expressions (nothing read until asked), with the rows
    the same tables aligned in memory get."""
    local = T0 + timedelta(hours=3)
    t = tables_from(
        steps=_steps(local) + _steps(local + timedelta(seconds=2.5), host="node02"),
        nccl_events=[nccl(1, local), nccl(2), nccl(3, local + timedelta(seconds=4))],
        packets=_capture(T0 + timedelta(minutes=2)),
    )
    lazy = RunTables()
    for name in ("steps", "nccl_events"):
        lazy.add(name, t[name].lazy())
    lazy.add("packets", t["packets"])
    in_memory, timeline = aligned(t)
    streamed, lazy_timeline = aligned(lazy)
    assert (lazy_timeline.basis, lazy_timeline.zone) == (timeline.basis, timeline.zone) == ("capture", "UTC+03:00")
    assert lazy_timeline.offsets.equals(timeline.offsets) and timeline.offsets["applied"].any()
    for name in ("steps", "nccl_events"):
        assert isinstance(streamed.frame(name), pl.LazyFrame), name
        assert streamed[name].equals(in_memory[name], null_equal=True), name
    assert streamed["steps"].filter(pl.col("host") == "node02")["ts"].min() == T0
    assert by_line(streamed["nccl_events"])[2]["ts_quality"] == "inferred"


# Real lines whose times are printed in odd ways: (corpus file, table, the first row's ts_text).
PRINTED_TIMES = [
    # a Ray actor's prefix stamp, then NCCL 2.27's own `[... .007]`: the NCCL one is the record's
    ("nccl/062_nccl2039_v2277_ray_actor_prefix_timestamps_all_levels.log", "nccl_events", "2026-04-14 21:28:19.007"),
    ("deepspeed/gh_accelerate_issue1589_2023_rank0_time_ms.log", "steps", "2023-06-21 07:39:09,443"),
    ("host/kernel/akash209_dmesg_T_grep_nvrm_xid79_fallen_off_bus.txt", "kernel_events", "Thu Apr  4 18:03:56 2024"),
    ("host/kernel/mptcp61_syslog_netdev_watchdog_igb_calltrace_partial.txt", "kernel_events", "Oct 15 19:26:35"),
    ("host/nvsmi/gpuexp_querygpu_csv_590_h200_wide.txt", "gpu_samples", "2026/07/03 22:11:09.763"),
    # CloudWatch's time on a line of its own: the NCCL lines print none, their time is inferred
    ("nccl/076_awsofinccl715_cloudwatch_timestamp_interleaved.log", "nccl_events", None),
]


@pytest.mark.parametrize(
    ("name", "table", "first"), PRINTED_TIMES, ids=[p[0].split("/")[-1][:24] for p in PRINTED_TIMES]
)
def test_ts_text_is_the_time_exactly_as_the_line_printed_it(tmp_path, name, table, first):
    """`tracelens tables` writes each row's time as its line printed it: a slice of that line (spacing,
    separators, comma and precision kept), not the parsed time written back; null where the line
    printed none (an inferred time)."""
    kind, _, rest = name.partition("/")
    path = corpus_dir(kind) / rest
    assert CliRunner().invoke(app, ["tables", str(path), "-o", str(tmp_path), "-j", "1"]).exit_code == 0
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = pl.read_parquet(tmp_path / f"{table}.parquet").sort("line")
    assert rows.height and rows["ts_text"][0] == first
    for row in rows.filter(pl.col("ts_text").is_not_null()).iter_rows(named=True):
        assert row["ts_text"] in lines[row["line"] - 1], row
    assert rows.filter(pl.col("ts_quality").is_in(["inferred", "none"]))["ts_text"].drop_nulls().len() == 0


def _small_files_tables(lazy: bool) -> RunTables:
    """Five small logs in an input order that is not their names' (c, a, e, b, d): lines with and without
    times from two processes, c10 clocks, one file (e) with c10 clocks and no dated line (its year is the
    run's median's), and a row with no file."""
    rand = random.Random(11)
    stamp = datetime(2026, 12, 31, 23, 59, 0, tzinfo=timezone.utc)
    order = ["c.log", "a.log", "e.log", "b.log", "d.log"]
    events, steps = [], []
    for file in order:
        for line in range(1, rand.randint(4, 30)):
            dated = file != "e.log" and rand.random() < 0.3
            ts = stamp + timedelta(seconds=line) if dated else None
            row = {"file": file, "line": line, "pid": rand.choice([100, 200, None]), "ts": ts}
            clock = "1231 23:58:59" if rand.random() < 0.15 else None
            if line % 5 == 0:
                steps.append(row | {"step": line, "ts": stamp + timedelta(seconds=line)})
            else:
                events.append(row | {"clock": clock, "message": f"{file} {line}"})
    events.append({"file": None, "line": None, "pid": None, "ts": None, "clock": None, "message": "no file"})
    tables = RunTables()
    for name, rows in (("nccl_events", events), ("steps", steps)):
        frame = conform(name, pl.DataFrame(rows, infer_schema_length=None)).lazy()
        tables.add(name, frame if lazy else frame.collect())
    tables.add("inputs", conform("inputs", pl.DataFrame({"file": order})))
    return tables


@pytest.mark.parametrize("group_lines", [1, 20, 60])
@pytest.mark.parametrize("lazy", [True, False])
def test_small_files_placed_in_groups_get_the_times_of_one_frame(tmp_path, monkeypatch, group_lines, lazy):
    """Small files whose lines outnumber GROUP_LINES (thousands of per-rank logs) are placed a group of
    whole files at a time (tracelens.inferred): every row gets the time, bracket and quality it gets in
    one frame, in the same order, the row with no file included."""
    tables = _small_files_tables(lazy)
    whole = inferred.inferred_log_times(tables)
    monkeypatch.setattr(inferred, "GROUP_LINES", group_lines)
    grouped = inferred.inferred_log_times(tables, tmp_path)
    assert len(list((tmp_path).rglob("_times-*.parquet"))) > 1, "placed in several groups"
    for name in ("nccl_events", "steps"):
        expected, got = whole[name].lazy().collect(), grouped[name].lazy().collect()
        assert got.select(expected.columns).equals(expected, null_equal=True), name
    assert set(whole["nccl_events"].lazy().collect()["ts_quality"]) >= {"exact", "inferred"}


def test_the_corpus_logs_placed_in_groups_get_the_times_of_one_frame(tmp_path, monkeypatch):
    """The real NCCL logs (61 files: launcher prefixes, c10 clocks, files without a dated line) placed in
    groups of about 100 of their rows' lines, read from Parquet as a big folder's are: the times of one frame."""
    from tracelens.analyze import ingest_run

    read, _ = ingest_run(corpus_dir("nccl"), tmp_path / "work", jobs=1)
    spilled = RunTables()
    for name in [*inferred.LOG_TABLES, "inputs"]:
        read[name].write_parquet(tmp_path / f"{name}.parquet")
        spilled.add(name, pl.scan_parquet(tmp_path / f"{name}.parquet"))
    whole = inferred.inferred_log_times(read)
    monkeypatch.setattr(inferred, "GROUP_LINES", 100)
    grouped = inferred.inferred_log_times(spilled, tmp_path / "placed")
    assert len(list((tmp_path / "placed").rglob("_times-*.parquet"))) > 3
    for name in whole:
        expected, got = whole[name].lazy().collect(), grouped[name].lazy().collect()
        assert got.select(expected.columns).equals(expected, null_equal=True), name


@pytest.mark.parametrize("range_lines", [1, 3, 8, 1000])
@pytest.mark.parametrize("lazy", [True, False])
def test_a_big_file_placed_range_by_range_gets_the_times_of_one_frame(tmp_path, monkeypatch, range_lines, lazy):
    """A file placed a slice of lines at a time (tracelens.inferred) gets exactly the times, brackets and
    qualities it gets in one frame: fills reach across ranges per process and per file, a c10 clock
    before the first dated line takes its year from a later range, and rows keep their order."""
    rand = random.Random(7)
    stamp = datetime(2026, 12, 31, 23, 59, 0, tzinfo=timezone.utc)
    events, steps = [], []
    for line in range(1, 60):
        dated = rand.random() < 0.2 and line > 9  # nothing dated before line 10: the anchor comes from later
        pid = rand.choice([100, 200, None])
        clock = "1231 23:58:59" if line in (3, 30) else None
        row = {"file": "big.log", "line": line, "pid": pid, "ts": stamp + timedelta(seconds=line) if dated else None}
        if line % 7 == 0:
            steps.append(row | {"step": line, "ts": stamp + timedelta(seconds=line)})
        else:
            events.append(row | {"clock": clock, "message": f"line {line}"})
    events += [{"file": "small.log", "line": n, "pid": 5, "ts": stamp if n == 2 else None} for n in (1, 2, 3)]
    tables = RunTables()
    for name, rows in (("nccl_events", events), ("steps", steps)):
        frame = conform(name, pl.DataFrame(rows, infer_schema_length=None)).lazy()
        tables.add(name, frame if lazy else frame.collect())
    whole = inferred.inferred_log_times(tables)
    monkeypatch.setattr(inferred, "RANGE_LINES", range_lines)
    ranged = inferred.inferred_log_times(tables, tmp_path)
    assert whole.keys() == ranged.keys() == {"nccl_events", "steps"}
    for name in whole:
        expected, got = whole[name].lazy().collect(), ranged[name].lazy().collect()
        assert got.select(expected.columns).equals(expected, null_equal=True), name
    placed = whole["nccl_events"].lazy().collect()
    assert (
        set(placed["ts_quality"]) == {"exact", "inferred"} and placed.filter(pl.col("line") == 3)["ts"][0].year == 2026
    )


def test_shifts_that_fit_equally_are_named_as_runs_of_half_hours():
    from tracelens.timeline import _shift_labels

    every = list(range(-840, 841, 30))  # a log that overlaps a capture at every shift (corpus: 9 captures)
    assert _shift_labels(every) == ["any half-hour shift from UTC-14:00 to UTC+14:00"]
    assert _shift_labels([150, 180, 210]) == ["UTC+02:30", "UTC+03:00", "UTC+03:30"]  # a few are each named
    assert _shift_labels([-300, *range(60, 241, 30)]) == [
        "UTC-05:00",
        "any half-hour shift from UTC+01:00 to UTC+04:00",
    ]


@pytest.mark.parametrize("shares_of", [3, 37])
def test_clock_offsets_aggregated_a_share_of_the_events_at_a_time_are_those_of_all_at_once(monkeypatch, shares_of):
    """The real lab run with a host 2.5 s ahead (steps), plus watchdog timeouts and both-ends packets:
    however few sightings a share holds, each event's sightings stay together and the offsets are the same."""
    from tracelens import timeline as time_model
    from tracelens.analyze import aligned_run

    def offsets() -> tuple[pl.DataFrame, list[str]]:
        with aligned_run(FIXTURES / "lab-clock-skew", jobs=1) as (_, timeline, _):
            return timeline.offsets, timeline.notes

    whole, notes = offsets()
    assert whole["applied"].any() and time_model.SIGHTINGS > 1_000
    monkeypatch.setattr(time_model, "SIGHTINGS", shares_of)
    shared, shared_notes = offsets()
    assert shared.equals(whole) and shared_notes == notes
    mixed = tables_from(
        steps=_steps(T0) + _steps(T0 + timedelta(seconds=2.5), host="node02"),
        packets=[
            {"file": f"{host}.pcap", "frame": i, "host": host, "ts": at(i * 0.01 + lag), "src": "10.0.0.1",
             "dst": "10.0.0.2", "proto": "roce", "ip_id": i, "digest": 1000 + i}
            for host, lag in (("node01", 0.0), ("node02", 2.5)) for i in range(20)
        ],
    )  # fmt: skip
    _, in_shares = aligned(mixed)
    monkeypatch.setattr(time_model, "SIGHTINGS", 2_000_000)
    _, at_once = aligned(mixed)
    assert in_shares.offsets.equals(at_once.offsets) and set(in_shares.offsets["basis"]) == {"steps", "packets"}
    assert in_shares.offsets["applied"].sum() == 2
