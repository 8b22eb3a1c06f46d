"""One time model for the run: every row of every table gets a UTC `ts` and a `ts_quality`.

`align(tables, tz)` runs three steps over the ingested tables and returns new, aligned
tables (those it was given stay as ingest read them) with the `Timeline` it decided on
(the report shows it). Each row keeps the time it was read with in `ts_read` (written
out as `ts_text`, tables.RunTables.write_parquet), so the aligned `ts` loses nothing:

1. **Inferred times.** Log lines without a time of their own (NCCL INFO lines before
   2.26, or with the default NCCL_DEBUG_TIMESTAMP_LEVELS=WARN) take the bracket of the
   nearest timestamped lines around them in the same file, from the same process
   where it has some (`ts_lo` = the last time before, `ts_hi` = the next one after;
   `ts` = the middle, or the one side known), and `ts_quality` "inferred". PyTorch's
   c10 times (`[E1206 18:41:33.676 ...`, no year, and a fraction that comes from the
   monotonic clock) take the year of the nearest dated line and a one-second bracket.
   Exact rows get `ts_lo` = `ts_hi` = `ts`, so any row can be tested against a window
   by its bracket. tracelens.inferred does it, a big file a range of lines at a time.
2. **Zone.** Logs print local wall time without a zone; ingest read it as UTC. `--tz`
   names the zone (zoneinfo, daylight saving included). Without it, the log times are
   compared with the sources that carry real UTC (capture timestamps, counter dumps
   stamped with a zone): if they overlap only when the logs are shifted by a whole or
   half number of hours, that shift is applied and said; otherwise UTC is assumed and
   the report says it assumed it. A long log fits a short capture at several shifts:
   those are told apart by events (NCCL errors against the capture's NAKs and
   retransmissions); if the events cannot, UTC is assumed and the candidates are named.
   Which packets are such events is packet-flow analysis, a later stage
   (tracelens.derived.flows): the pipeline passes it in as `capture_events`.
3. **Clock offsets.** Hosts' clocks disagree. Where one event is seen on several hosts
   (the same training step logged on several hosts, the same watchdog timeout SeqNum,
   whose start is its time minus `ran for` ms; the same packet in captures taken at
   both ends), each host's median deviation from the event times is its offset from
   the reference host (the capturing host, else the host with most evidence). Offsets
   above the evidence's resolution are subtracted from that host's rows.

Everything is polars over sorted frames (forward/backward fills per file and process,
joins on file and line); nothing loops over rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from tracelens.inferred import LOG_TABLES, inferred_log_times
from tracelens.prose import count, listing, number_runs
from tracelens.tables import Frame, RunTables

# The UTC times of a capture's loss and congestion events (NAKs, retransmissions ...), from its packets table.
CaptureEvents = Callable[[pl.DataFrame], pl.Series]

DUMP_TABLES = ("ib_counters", "ib_ports")
# Host tools' outputs (nvidia-smi, dmesg, perftest): printed local wall time like the logs,
# except rows whose printed time carried a zone (`zoned`, e.g. dmesg --time-format iso).
HOST_TABLES = ("gpu_samples", "kernel_events", "perftest", "interfaces")
TIME_COLUMNS = ("ts", "ts_lo", "ts_hi", "dump_ts")

SHIFT_STEP_MIN = 30  # candidate zone shifts: whole and half hours ...
SHIFT_RANGE_H = 14  # ... up to UTC-14 / UTC+14
OVERLAP_MARGIN_S = 60.0  # a capture or dump this close to the logs' span still counts as overlapping
SHIFT_TIE = 0.05  # shifts whose overlap score is within this share of the best fit the spans as well
EVENT_MARGIN_S = 60.0  # an NCCL error this close to a packet event lines up with it
EVENT_LEAD = 2  # a shift wins on events when it lines up this many times more errors than any other

# Clock offsets: the time resolution of each kind of shared event, below which an offset is not applied.
OFFSET_RESOLUTION_S = {"packets": 0.001, "steps": 0.1, "watchdog": 1.0}
MIN_OFFSET_EVENTS = 3  # rows of shared events a host needs for its offset to be estimated
CONCURRENT_SHARE = 0.5  # two clocks' logs, corrected, must overlap in time over this share of the shorter one ...
CONCURRENT_MIN_S = 60.0  # ... when it spans this long (shorter logs say too little to tell)


OFFSET_SCHEMA = {
    "host": pl.String,
    "file": pl.String,
    "clock": pl.String,
    "offset_s": pl.Float64,
    "uncertainty_s": pl.Float64,
    "events": pl.UInt32,
    "basis": pl.String,
    "applied": pl.Boolean,
}


@dataclass
class Timeline:
    """What the time model decided: the logs' zone and the per-host clock offsets."""

    zone: str = "UTC"  # the zone the log times were read in: a zone name or "UTC+03:00"
    basis: str = (
        "assumed"  # "--tz", "capture" (a shift found against UTC sources), "agrees" (UTC matched them), "assumed"
    )
    shift_hours: float = 0.0  # for basis "capture": local = UTC + shift_hours
    offsets: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=OFFSET_SCHEMA))
    notes: list[str] = field(default_factory=list)


def align(
    read: RunTables, tz: str | None = None, capture_events: CaptureEvents | None = None, workdir: Path | None = None
) -> tuple[RunTables, Timeline]:
    """New tables where every row has a UTC time, and how it was decided; `read` is left as it was.
    `capture_events` lets NCCL errors tell apart zone shifts that fit the capture equally well
    (without it, such a tie leaves the logs in UTC, assumed). `workdir`: where a big file's lines are
    placed range by range (tracelens.inferred); without it, every table is placed in memory."""
    tables = read.with_frames(
        {name: read.frame(name).with_columns(ts_read="ts") for name in _all_timed_tables() if name in read}
    )
    tables = tables.with_frames(inferred_log_times(tables, workdir))
    timeline, shifted = _zone(tables, tz, capture_events, _log_span(tables))
    tables = tables.with_frames(shifted)
    timeline.offsets = _clock_offsets(tables)
    applied = timeline.offsets.filter("applied")
    if applied.height:
        # a host measured as one clock moves whole (its dumps and captures too); a host whose files
        # disagree, file by file
        whole = timeline.offsets.group_by("host").len().filter(pl.col("len") == 1)["host"].to_list()
        by_host, by_file = applied.filter(pl.col("host").is_in(whole)), applied.filter(~pl.col("host").is_in(whole))
        with_offsets = {
            name: _with_offsets(tables.frame(name), by_host, by_file) for name in _all_timed_tables() if name in tables
        }
        tables = tables.with_frames(with_offsets)
        offset = pl.coalesce("_file_offset_s", "_host_offset_s").fill_null(0.0)
        shifted = _shifted(tables, _all_timed_tables(), offset)
        tables = tables.with_frames(
            {name: frame.drop("_file_offset_s", "_host_offset_s") for name, frame in shifted.items()}
        )
        said = ", ".join(
            f"{r['clock']} {r['offset_s']:+.3f} s (± {r['uncertainty_s']:.3f} s, on {r['events']} {r['basis']} rows)"
            for r in applied.iter_rows(named=True)
        )
        timeline.notes.append(f"Clock offsets estimated from events seen on several hosts and subtracted: {said}.")
    return tables, timeline


def _with_offsets(frame: Frame, by_host: pl.DataFrame, by_file: pl.DataFrame) -> Frame:
    """`frame` with the clock offsets of its rows' file (`_file_offset_s`) and host (`_host_offset_s`),
    joined: a big spilled table streams through a join, where a lookup expression (replace_strict) over
    it would read it whole into memory."""
    host = pl.col("host").cast(pl.String)
    keys = {"_host": host, "_file": pl.col("file").cast(pl.String)}
    files = by_file.lazy().select(_host="host", _file="file", _file_offset_s="offset_s")
    hosts = by_host.lazy().select(_host="host", _host_offset_s="offset_s")
    joined = (
        frame.lazy()
        .with_columns(**keys)
        .join(files, on=["_host", "_file"], how="left", maintain_order="left")
        .join(hosts, on="_host", how="left", maintain_order="left")
        .drop("_host", "_file")
    )
    return joined.collect() if isinstance(frame, pl.DataFrame) else joined


# -- 2. zone --------------------------------------------------------------------------------------


def _zone(
    tables: RunTables, tz: str | None, capture_events: CaptureEvents | None, span: tuple | None
) -> tuple[Timeline, dict[str, Frame]]:
    """The logs' zone, and the tables whose local times it moved to UTC (`span`: of the logs' exact times)."""
    if tz:
        zone = ZoneInfo(tz)  # raises on an unknown zone name: the CLI checks it first
        shifted = _shifted(tables, _local_tables(tables), zone=zone)
        return Timeline(
            zone=tz, basis="--tz", notes=[f"Log times were read in {tz} (--tz) and converted to UTC."]
        ), shifted
    if span is None:
        return Timeline(), {}  # no log printed a time: nothing to place in a zone
    zoned = _zoned_intervals(tables)
    if zoned.height == 0:
        return Timeline(
            notes=[
                "Log times carry no zone and the run has no capture or zoned counter dump to compare "
                "them with: read as UTC (assumed; use --tz ZONE if the hosts ran on local time)."
            ]
        ), {}
    scores = shift_scores(span, zoned)
    best = scores["score"][0]
    what = _zoned_sources(zoned)
    if best == 0:
        return Timeline(
            notes=[
                f"Log times read as UTC (assumed): they overlap {what} at no whole or half hour "
                "shift; use --tz ZONE if the hosts ran on local time."
            ]
        ), {}
    fitting = scores.filter(pl.col("score") >= best * (1 - SHIFT_TIE))["minutes"].to_list()
    by_events = len(fitting) > 1
    if by_events:
        fitting = _told_apart_by_events(tables, fitting, capture_events)
    if len(fitting) > 1:
        return Timeline(
            notes=[
                f"Log times read as UTC (assumed): their zone is ambiguous, they overlap {what} "
                f"equally well read as {listing(_shift_labels(fitting), 'or')}, and no NCCL error lines up with a "
                "packet event to tell these apart; use --tz ZONE if the hosts ran on local time."
            ]
        ), {}
    minutes = fitting[0]
    if minutes == 0:
        return Timeline(basis="agrees", notes=[f"Log times read as UTC: they overlap {what} without a shift."]), {}
    shifted = _shifted(tables, _local_tables(tables), minutes * 60.0)
    label = _utc_label(minutes)
    why = (
        f"at several shifts, but their NCCL errors line up with the capture's packet events only when read as {label}"
        if by_events
        else f"only when read as {label}"
    )
    return Timeline(
        zone=label,
        basis="capture",
        shift_hours=minutes / 60,
        notes=[f"Log times were shifted by {-minutes / 60:+g} h to UTC: they overlap {what} {why} (no --tz given)."],
    ), shifted


def shift_scores(span: tuple, zoned: pl.DataFrame) -> pl.DataFrame:
    """For each candidate shift (local = UTC + minutes), how well the logs' span, read at that
    shift, overlaps the UTC-timed intervals (columns start, end): the sum over intervals of
    the overlap over the shorter of the two, best first (ties: the smallest shift)."""
    first, last = span
    margin = pl.duration(seconds=OVERLAP_MARGIN_S)
    candidates = pl.DataFrame({"minutes": range(-SHIFT_RANGE_H * 60, SHIFT_RANGE_H * 60 + 1, SHIFT_STEP_MIN)})
    log_len = (last - first).total_seconds()
    shifted = pl.duration(minutes=pl.col("minutes"))
    overlap = pl.min_horizontal(pl.lit(last) - shifted, pl.col("end") + margin) - pl.max_horizontal(
        pl.lit(first) - shifted, pl.col("start") - margin
    )
    shorter = (
        pl.min_horizontal((pl.col("end") - pl.col("start")).dt.total_seconds(), pl.lit(log_len)) + 2 * OVERLAP_MARGIN_S
    )
    return (
        candidates.join(zoned, how="cross")
        .with_columns(share=(overlap.dt.total_milliseconds() / 1000 / shorter).clip(0.0, 1.0))
        .group_by("minutes")
        .agg(score=pl.col("share").sum().round(6))
        .sort(pl.col("score"), pl.col("minutes").abs(), descending=[True, False])
    )


def _event_matches(errors: pl.DataFrame, packet_times: pl.Series, minutes: list[int]) -> pl.DataFrame:
    """For each candidate shift, how many NCCL errors (columns ts_lo, ts_hi: their time
    bracket as read) have a packet event (UTC times) within EVENT_MARGIN_S once shifted."""
    margin = pl.duration(seconds=EVENT_MARGIN_S)
    shifted = pl.duration(minutes=pl.col("minutes"))
    windows = (
        pl.DataFrame({"minutes": minutes})
        .join(errors.select("ts_lo", "ts_hi"), how="cross")
        .select("minutes", lo=pl.col("ts_lo") - shifted - margin, hi=pl.col("ts_hi") - shifted + margin)
    )
    times = packet_times.sort()
    inside = times.search_sorted(windows["hi"], side="right") - times.search_sorted(windows["lo"], side="left")
    return windows.with_columns(matched=inside > 0).group_by("minutes").agg(pl.col("matched").sum())


def _told_apart_by_events(tables: RunTables, minutes: list[int], capture_events: CaptureEvents | None) -> list[int]:
    """The shifts, of those that fit the spans equally well, that the events cannot tell apart:
    the one that lines up EVENT_LEAD times more NCCL errors with packet events than any other, or all."""
    errors = (
        tables.frame("nccl_errors")
        .lazy()
        .filter(pl.col("ts_lo").is_not_null(), pl.col("ts_hi").is_not_null())
        .collect()
    )
    if errors.height == 0 or tables.height("packets") == 0 or capture_events is None:
        return minutes
    matches = _event_matches(errors, capture_events(tables.frame("packets")), minutes)
    top = matches["matched"].max()
    if not top:
        return minutes
    return matches.filter(pl.col("matched") * EVENT_LEAD > top)["minutes"].to_list()


def _log_span(tables: RunTables) -> tuple | None:
    exact = [tables.scan(n).filter(pl.col("ts_quality") == "exact", pl.col("ts").is_not_null()) for n in LOG_TABLES]
    first, last = (
        pl.concat([frame.select("ts") for frame in exact])
        .select(first=pl.col("ts").min(), last=pl.col("ts").max())
        .collect()
        .row(0)
    )
    return (first, last) if first is not None else None


def _zoned_intervals(tables: RunTables) -> pl.DataFrame:
    """Spans of the sources timed in UTC: each capture file, and each host's exact-stamped dumps."""
    captures = (
        tables.frame("packets")
        .lazy()
        .select("file", "ts")
        .filter(pl.col("ts").is_not_null())
        .group_by("file")
        .agg(pl.lit("capture").alias("source"), start=pl.col("ts").min(), end=pl.col("ts").max())
        .collect()
    )
    dumps = (
        pl.concat([tables.frame(n).lazy().select("host", "ts", "ts_quality") for n in DUMP_TABLES])
        .collect()
        .filter(pl.col("ts_quality") == "exact", pl.col("ts").is_not_null())
    )
    dumps = dumps.group_by("host").agg(
        pl.lit("dumps").alias("source"), start=pl.col("ts").min(), end=pl.col("ts").max()
    )
    return pl.concat([captures.select("source", "start", "end"), dumps.select("source", "start", "end")])


def _zoned_sources(zoned: pl.DataFrame) -> str:
    """`the capture and the counter dumps of 2 hosts`: what the log times were compared with."""
    counts = dict(zoned.group_by("source").len().iter_rows())
    parts = []
    if n := counts.get("capture"):
        parts.append("the capture" if n == 1 else f"{n} captures")
    if n := counts.get("dumps"):
        parts.append(f"the zoned counter dumps of {count(n, 'host')}")
    return " and ".join(parts)


def _shift_labels(minutes: list[int], run: int = 5) -> list[str]:
    """The shifts as labels, `run` or more half hours in a row as one ("any half-hour shift from UTC-14:00
    to UTC+14:00": a log that overlaps a capture equally at every shift is not 57 zones to read)."""
    labels = []
    for steps in number_runs([m // SHIFT_STEP_MIN for m in minutes], shortest=run):  # candidates are whole steps
        lo, hi = (_utc_label(step * SHIFT_STEP_MIN) for step in (steps[0], steps[-1]))
        labels.append(f"any half-hour shift from {lo} to {hi}" if len(steps) > 1 else lo)
    return labels


def _utc_label(minutes: int) -> str:
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _local_tables(tables: RunTables) -> dict[str, pl.Expr]:
    """The tables whose rows carry local wall time, with which of their rows do: every log row,
    and dumps timed by their file name (perfquery-0915.txt)."""
    local = {name: pl.lit(True) for name in LOG_TABLES}
    local.update({name: pl.col("ts_quality") == "filename" for name in DUMP_TABLES})
    local.update(
        {
            name: ~pl.col("zoned").fill_null(False)
            if "zoned" in tables.frame(name).collect_schema().names()
            else pl.lit(True)
            for name in HOST_TABLES
            if name != "interfaces"
        }
    )
    local["interfaces"] = pl.col("ts_quality") == "filename"  # listings are timed like dumps: by `date -u` lines
    return local


def _all_timed_tables() -> dict[str, pl.Expr]:
    return {name: pl.lit(True) for name in (*LOG_TABLES, *DUMP_TABLES, *HOST_TABLES, "packets")}


def _shifted(
    tables: RunTables, which: dict[str, pl.Expr], seconds: float | pl.Expr = 0.0, zone: ZoneInfo | None = None
) -> dict[str, Frame]:
    """The chosen tables with the time columns of the chosen rows moved: read in `zone`, or `seconds` earlier."""
    out = {}
    for name, rows in which.items():
        if name not in tables:
            continue
        frame = tables.frame(name)

        def moved(col: str) -> pl.Expr:
            c = pl.col(col)
            if zone is not None:
                new = (
                    c.dt.replace_time_zone(None)
                    .dt.replace_time_zone(zone.key, ambiguous="earliest", non_existent="null")
                    .dt.convert_time_zone("UTC")
                )
            else:
                micros = (seconds if isinstance(seconds, pl.Expr) else pl.lit(seconds)) * 1e6
                new = c - pl.duration(microseconds=micros.round().cast(pl.Int64), time_unit="ns")
            return pl.when(rows).then(new).otherwise(c).alias(col)  # noqa: B023 (used within this iteration)

        out[name] = frame.with_columns(moved(c) for c in TIME_COLUMNS if c in frame.collect_schema().names())
    return out


# -- 3. clock offsets -----------------------------------------------------------------------------


def shared_sightings(tables: RunTables) -> pl.DataFrame:
    """Events seen by several clocks, per event and clock: columns basis, key, host, file, ns (the
    median of that clock's sightings, in ns after the event's first sighting by any clock: medians of
    raw datetimes lose microseconds) and rows (its sightings).

    A clock is a host, or a log file of a host when its files disagree: ranks in separate
    network namespaces of one machine print the same host name, and one of them may run under
    a shifted clock (libfaketime), so a file is measured on its own and the host's files that
    agree are not shifted. Only a row per event and clock is kept, and events are aggregated a share
    at a time: a 3 GB DeepSpeed log has 9.6M step rows (held whole, with their clock names: 2.2 GB)."""
    steps = (
        tables.frame("steps")
        .lazy()
        .filter(pl.col("ts_quality") == "exact", pl.col("step").is_not_null())
        .select(
            pl.lit("steps").alias("basis"),
            pl.struct(pl.col("engine").fill_null(""), "step").hash().alias("key"),
            "host",
            "file",
            "ts",
        )
    )
    watchdog = (
        tables.frame("nccl_errors")
        .lazy()
        .filter(pl.col("kind") == "watchdog_timeout", pl.col("ts_quality") == "exact", pl.col("ran_ms").is_not_null())
        .select(
            pl.lit("watchdog").alias("basis"),
            pl.struct(pl.col("op_type").fill_null(""), "seq").hash().alias("key"),
            "host",
            "file",
            (pl.col("ts") - pl.duration(milliseconds=pl.col("ran_ms"), time_unit="ns")).alias("ts"),
        )
    )
    events = pl.concat([steps, watchdog, _packets_both_ends(tables.frame("packets")).lazy()])
    # a share of the events at a time (all sightings of an event in one share): the medians hold
    # every value of their group (9.6M step rows at once: 1.9 GB)
    shares = -(-events.select(pl.len()).collect(engine="streaming").item() // SIGHTINGS) or 1
    return pl.concat([_sightings(events.filter(pl.col("key") % shares == share)) for share in range(shares)])


SIGHTINGS = 2_000_000  # event sightings aggregated at once


def _sightings(events: pl.LazyFrame) -> pl.DataFrame:
    """shared_sightings of some events (every sighting of each)."""
    event = ["basis", "key"]
    seen = pl.col("host").is_not_null()
    # the shared events first, on their own (one row each): in one plan with the pass below, the
    # events read by both would be held whole
    shared = (
        events.group_by(event)
        .agg(clocks=pl.format("{}\x1f{}", "host", "file").n_unique(), first=pl.col("ts").filter(seen).min())
        .filter(pl.col("clocks") >= 2)
        .drop("clocks")
        .collect(engine="streaming")
    )
    since_first = (pl.col("ts") - pl.col("first")).dt.total_nanoseconds()
    return (
        events.filter(seen)
        .join(shared.lazy(), on=event)
        .group_by(*event, "host", "file")
        .agg(ns=since_first.median(), rows=pl.len())
        .collect(engine="streaming")
    )


MATCHED_FRAMES = 2_000_000  # frames of the captures matched at once (about 100 bytes each while matched)


def _packets_both_ends(packets: Frame) -> pl.DataFrame:
    """The same frame in captures taken on different hosts (same addresses, IP id and bytes). Frames
    are matched a share of their digests at a time (one frame's copies share its digest), so memory
    follows MATCHED_FRAMES, not the captures; only the matches are kept."""
    identity = ["src", "dst", "proto", "ip_id", "digest"]
    packets = packets.lazy()
    out = {"basis": pl.String, "key": pl.UInt64, "host": pl.String, "file": pl.String}
    out["ts"] = packets.collect_schema()["ts"]
    hosts, frames = packets.select(pl.col("host").drop_nulls().n_unique(), pl.len()).collect().row(0)
    if hosts < 2:  # one capturing host: nothing to match, at any size
        return pl.DataFrame(schema=out)
    candidates = packets.select("file", "host", "ts", *identity).filter(
        pl.col("digest").is_not_null(), pl.col("host").is_not_null()
    )
    shares = -(-frames // MATCHED_FRAMES)
    matched = []
    for share in range(shares):
        some = candidates.filter(pl.col("digest").hash() % shares == share)
        once = some.filter(pl.len().over("file", *identity) == 1)  # a frame repeated within a capture is ambiguous
        matched.append(
            once.filter(pl.col("host").n_unique().over(identity) >= 2)
            .select(
                pl.lit("packets").alias("basis"),
                pl.struct(identity).hash().alias("key"),
                pl.col("host", "file").cast(pl.String),
                "ts",
            )
            .collect()
        )
    return pl.concat(matched)


def _file_spans(tables: RunTables) -> pl.DataFrame:
    """Per (host, file): the first and last time of its rows (each table's spans first: a capture has millions)."""
    spans = [
        tables.frame(n).lazy().select("host", "file", "ts").filter(pl.col("ts").is_not_null())
        .group_by("host", "file").agg(first=pl.col("ts").min(), last=pl.col("ts").max())
        .with_columns(pl.col("host", "file").cast(pl.String)).collect()
        for n in ("steps", "nccl_events", "nccl_errors", "packets")
    ]  # fmt: skip
    return pl.concat(spans).group_by("host", "file").agg(pl.col("first").min(), pl.col("last").max())


def _clock_offsets(tables: RunTables) -> pl.DataFrame:
    # the median per clock and event first, so that a clock with more ranks does not outvote the others
    per_clock = shared_sightings(tables)
    if per_clock.height == 0:
        return pl.DataFrame(schema=OFFSET_SCHEMA)
    clocks = (
        per_clock.with_columns(dev=(pl.col("ns") - pl.col("ns").median().over("basis", "key")) / 1e9)
        .group_by("host", "file")
        .agg(
            dev=pl.col("dev").median(),
            spread=(pl.col("dev") - pl.col("dev").median()).abs().median() * 1.4826,
            shared=pl.len(),
            events=pl.col("rows").sum(),
            basis=pl.col("basis").unique().sort().str.join(", "),
            resolution=pl.col("basis").replace_strict(OFFSET_RESOLUTION_S, return_dtype=pl.Float64).max(),
        )
        .filter(pl.col("events") >= MIN_OFFSET_EVENTS)
        .join(_file_spans(tables), on=["host", "file"])
    )
    if clocks.height < 2:
        return pl.DataFrame(schema=OFFSET_SCHEMA)
    captured = set(tables.frame("packets").lazy().select(pl.col("host").drop_nulls().unique()).collect()["host"])
    reference = clocks.sort(
        pl.col("host").is_in(list(captured)), "events", "host", "file", descending=[True, True, False, False]
    ).row(0, named=True)
    offset = pl.col("dev") - reference["dev"]
    # the uncertainty of a median offset: the spread of the per-event deviations over sqrt(n), at
    # least the evidence's resolution
    uncertainty = pl.max_horizontal("resolution", 1.2533 * pl.col("spread") / pl.col("shared").cast(pl.Float64).sqrt())
    is_reference = (pl.col("host") == reference["host"]) & (pl.col("file") == reference["file"])
    # the same step numbers in logs that ran one after the other (a relaunch resumed from a checkpoint)
    # are not one event: a clock counts only when, corrected, its shared events overlap the reference's in time
    shift = pl.duration(microseconds=(offset * 1e6).round().cast(pl.Int64))
    seconds = lambda d: d.dt.total_microseconds() / 1e6  # noqa: E731
    overlap = seconds(
        pl.min_horizontal(pl.col("last") - shift, pl.lit(reference["last"]))
        - pl.max_horizontal(pl.col("first") - shift, pl.lit(reference["first"]))
    )
    shorter = pl.min_horizontal(
        seconds(pl.col("last") - pl.col("first")), pl.lit((reference["last"] - reference["first"]).total_seconds())
    )
    clocks = clocks.filter(is_reference | (shorter < CONCURRENT_MIN_S) | (overlap >= CONCURRENT_SHARE * shorter))
    if clocks.height < 2:
        return pl.DataFrame(schema=OFFSET_SCHEMA)
    several = pl.col("file").n_unique().over("host") > 1
    return (
        clocks.with_columns(offset_s=offset, uncertainty_s=uncertainty)
        .with_columns(
            applied=~is_reference & (offset.abs() >= pl.max_horizontal("resolution", 2 * pl.col("spread"))),
            clock=pl.when(several).then(pl.format("{} ({})", "host", "file")).otherwise("host"),
        )
        .select(list(OFFSET_SCHEMA))
        .cast(OFFSET_SCHEMA)
        .sort("clock")
    )
