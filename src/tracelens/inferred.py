"""Step 1 of the timeline (tracelens.timeline): a time, a bracket and a quality for every log line,
in memory that follows a slice of a file's lines, not the file.

A line without a time of its own takes the times of the nearest timestamped lines around it in the
same file, from the same process where it has some; PyTorch's yearless c10 clock takes the year of
the nearest dated line. Over one frame of lines that is a forward and a backward fill.

A big file (more than a quarter of RANGE_LINES lines, when the run has a working folder) is placed RANGE_LINES
lines at a time. A forward pass over its ranges carries into each the earlier lines its fills reach
(per process, the last line with a time; the last dated line; the file's first dated line when it
comes later) and writes each range's partial times to Parquet; a backward pass from the end carries
the first lines with a time after each range the same way and writes the range's times. Each log
table's rows of that file are then joined with them range by range and written again: no step
holds more than one range. The other files are placed together in memory; when their lines are more
than GROUP_LINES (a folder of thousands of per-rank logs), in groups of whole files of about
GROUP_LINES lines, taken in the run's input order, each group's times written to Parquet and each log
table's rows of the group joined with them and written again, group by group.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from tracelens.ingest.text.lines import within_datetime_range
from tracelens.tables import Frame, RunTables, Spill

# Tables whose times come from log lines: local wall time, naive, as printed.
LOG_TABLES = (
    "nccl_events",
    "nccl_comms",
    "nccl_channels",
    "nccl_net",
    "nccl_env",
    "nccl_errors",
    "steps",
    "comm_ops",
    "deepspeed_settings",
)
C10_RESOLUTION = timedelta(seconds=1)
RANGE_LINES = 1 << 18  # lines of a big file placed at a time: what memory follows
GROUP_LINES = RANGE_LINES  # lines of small files placed together: what memory follows for a folder of them

KEY = ["file", "line"]
TIMES = ["_ts", "_quality", "_lo", "_hi"]  # what a table's rows are joined with
PARTIAL = ["file", "line", "pid", "ts", "_dated", "_c10_lo", "_c10_hi", "_lo"]  # the forward pass's output


def inferred_log_times(tables: RunTables, workdir: Path | None = None) -> dict[str, Frame]:
    """The log tables with a time and bracket for every line that has neighbours with one. With a
    `workdir`, big files are placed range by range there, and a spilled table's rows of them are
    written there joined with their times (the table: a lazy scan of its parts, its rows in order)."""
    present = [name for name in LOG_TABLES if name in tables]
    if not present:
        return {}
    columns = [_time_columns(tables.frame(name)) for name in present]
    files = _files(columns)
    # a file of more than a quarter range is placed on its own; the others together: in one frame, or in
    # groups of whole files when they have more than GROUP_LINES lines
    big = files.filter(pl.col("last") > RANGE_LINES // 4) if workdir is not None else files.clear()
    rest = files.filter(~pl.col("file").is_in(big["file"].to_list()))
    groups = _groups(rest, tables) if workdir is not None and (rest["last"].sum() or 0) > GROUP_LINES else []
    held = big["file"].to_list() + [file for group in groups for file in group]
    small = _lines(pl.concat(columns).filter(~pl.col("file").is_in(held)).collect())
    orphans = files.filter(pl.col("clocked") & ~pl.col("dated")).height > 0
    median = _run_median(columns) if orphans else None
    small_times = _placed(_forward(small, median=median)).select(*KEY, *TIMES)
    if small_times.height == 0 and big.height == 0 and not groups:
        return {}
    spill = Spill(workdir) if (big.height or groups) and workdir is not None else None
    ranges: dict[str, list[tuple[int, Path]]] = {}  # a big file -> its ranges' first lines and times
    group_times: dict[Path, list[str]] = {}  # a group's times -> its files
    if spill is not None:
        for row in big.iter_rows(named=True):
            ranges[row["file"]] = _place_file(columns, row, spill, median)
        if groups:
            grouped = _split_by_group(pl.concat(columns), groups, spill)
            for i, group in enumerate(groups):
                if (path := _place_group(grouped, i, spill, median)) is not None:
                    group_times[path] = group
            grouped.unlink()
    out: dict[str, Frame] = {}
    spilled: dict[str, pl.LazyFrame] = {}
    for name in present:
        frame = tables.frame(name)
        if isinstance(frame, pl.DataFrame):
            out[name] = _joined(frame, _times_for(frame, small_times, ranges, group_times))
        else:
            spilled[name] = frame
    return out | _joined_by_range(spilled, small_times, ranges, group_times, spill)


# -- lines ------------------------------------------------------------------------------------------


def _time_columns(frame: Frame) -> pl.LazyFrame:
    """A log table's time columns (file, line, pid, ts, clock): the only ones placing reads."""
    names = frame.collect_schema().names()
    pid = pl.col("pid") if "pid" in names else pl.lit(None, pl.Int64)
    clock = pl.col("clock") if "clock" in names else pl.lit(None, pl.String)
    return frame.lazy().select("file", "line", pid.alias("pid"), "ts", clock.alias("clock"))


def _files(columns: list[pl.LazyFrame]) -> pl.DataFrame:
    """Per file: its last line, whether it has dated lines, whether it has c10 clocks; and its first
    dated line (first_line, first_ts). Streamed: aggregates of the time columns, never the columns."""
    rows = pl.concat(columns).filter(pl.col("file").is_not_null() & pl.col("line").is_not_null())
    files = rows.group_by("file").agg(
        last=pl.col("line").max(), dated=pl.col("ts").is_not_null().any(), clocked=pl.col("clock").is_not_null().any()
    )
    dated = rows.filter(pl.col("ts").is_not_null())
    first = dated.group_by("file").agg(pl.col("line").min())
    first = dated.join(first, on=KEY, how="semi").group_by(KEY).agg(pl.col("ts").min())
    first = first.select("file", first_line="line", first_ts="ts")
    return files.join(first, on="file", how="left").collect(engine="streaming")


def _lines(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per (file, line), in file and line order: a line in several tables keeps its time
    where one of them has it. `_dated`: the line printed a dated time (a c10 clock is not one);
    `_context`: a line carried in from another range (none here)."""
    # the earliest time of each line: one stable sort, then the first row of each (file, line) run (a hash
    # `unique` and a second sort would cost several times more)
    rows = rows.filter(pl.col("file").is_not_null() & pl.col("line").is_not_null())
    rows = rows.sort("file", "line", "ts", nulls_last=True, maintain_order=True)
    first_of_line = pl.any_horizontal(pl.col(KEY) != pl.col(KEY).shift()).fill_null(True)
    return rows.filter(first_of_line).with_columns(_dated=pl.col("ts").is_not_null(), _context=pl.lit(False))


def _run_median(columns: list[pl.LazyFrame]) -> datetime | None:
    """The median dated time of the run's lines: the year of c10 clocks in a file without a dated line."""
    rows = pl.concat(columns).filter(
        pl.col("file").is_not_null(), pl.col("line").is_not_null(), pl.col("ts").is_not_null()
    )
    return rows.group_by(KEY).agg(pl.col("ts").min()).select(pl.col("ts").median()).collect(engine="streaming").item()


# -- times ------------------------------------------------------------------------------------------


def _forward(lines: pl.DataFrame, context: pl.DataFrame | None = None, median: datetime | None = None) -> pl.DataFrame:
    """c10 times and each line's `_lo` (the last time up to it, from its process, else its file).
    `context`: lines of other ranges the fills reach (see the module doc), dropped from the result."""
    if context is not None and context.height:
        lines = pl.concat([lines, context.select(lines.columns)]).sort(KEY)
    lines = _with_c10_times(lines, median)
    before = pl.col("ts").forward_fill()
    lo = pl.coalesce(before.over("file", "pid"), before.over("file"))
    return lines.with_columns(_lo=lo).filter(~pl.col("_context"))


def _placed(lines: pl.DataFrame, context: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each line's `_hi` (the next time from it on), then its time `_ts`, bracket `_lo`/`_hi` and
    `_quality`. `context`: the first lines with a time after these (per process), dropped."""
    if context is not None and context.height:
        lines = pl.concat([lines, context], how="diagonal_relaxed").sort(KEY)
    after = pl.col("ts").backward_fill()
    lines = lines.with_columns(_hi=pl.coalesce(after.over("file", "pid"), after.over("file")))
    exact = pl.col("ts").is_not_null()
    middle = pl.when(pl.col("_lo").is_not_null() & pl.col("_hi").is_not_null()).then(
        pl.col("_lo") + (pl.col("_hi") - pl.col("_lo")) / 2
    )
    quality = (
        pl.when(exact)
        .then(pl.lit("exact"))
        .when(pl.col("_ts").is_not_null())
        .then(pl.lit("inferred"))
        .otherwise(pl.lit("none"))
    )
    return (
        lines.filter(~pl.col("_context"))
        .with_columns(
            _ts=pl.when(exact).then("ts").otherwise(pl.coalesce(middle, "_lo", "_hi")),
            ts_lo=pl.when(exact).then(pl.coalesce("_c10_lo", "ts")).otherwise("_lo"),
            ts_hi=pl.when(exact).then(pl.coalesce("_c10_hi", "ts")).otherwise("_hi"),
        )
        .with_columns(_quality=quality, _lo="ts_lo", _hi="ts_hi")
    )


def _with_c10_times(lines: pl.DataFrame, median: datetime | None) -> pl.DataFrame:
    """Fill `ts` from PyTorch's `MMDD HH:MM:SS` clock where the line has no dated time, with the
    year of the nearest dated line of the file (else the run's median), corrected across a new year."""
    if lines["clock"].null_count() == lines.height:  # no PyTorch clock (most logs): nothing to date
        c10 = pl.lit(None, pl.Datetime("ns", "UTC"))
    else:
        anchor = pl.when("_dated").then("ts").forward_fill().backward_fill().over("file")
        parts = pl.col("clock").str.extract_groups(r"^(?P<mo>\d{1,2})(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)")
        lines = lines.with_columns(_anchor=pl.coalesce(anchor, pl.lit(median, pl.Datetime("ns", "UTC"))), _parts=parts)
        c10 = pl.when(pl.col("ts").is_null() & pl.col("clock").is_not_null()).then(_c10_time())
    return (
        lines.with_columns(_c10_lo=c10)
        .with_columns(ts=pl.coalesce("ts", "_c10_lo"), _c10_hi=pl.col("_c10_lo") + C10_RESOLUTION)
        .drop("_anchor", "_parts", strict=False)
    )


def _c10_time() -> pl.Expr:
    """The time of a line's c10 clock (`_parts`) in the year of its `_anchor`, or the year before or
    after when that puts it within half a year of the anchor."""

    def on_year(offset: int) -> pl.Expr:
        # from text, so a clock that is no time (hour 24, second 60, month 13, Feb 31) gives null, not an error
        p = pl.col("_parts").struct
        text = pl.format(
            "{}-{}-{} {}:{}:{}", pl.col("_anchor").dt.year() + offset, p.field("mo").str.zfill(2), p.field("d"),
            p.field("h"), p.field("mi"), p.field("s"),
        )  # fmt: skip
        return within_datetime_range(text).str.to_datetime(
            "%Y-%m-%d %H:%M:%S", time_unit="ns", time_zone="UTC", strict=False
        )

    half_year = pl.duration(days=183)
    same = on_year(0)
    return (
        pl.when(same - pl.col("_anchor") > half_year)
        .then(on_year(-1))  # a January anchor, a December clock
        .when(pl.col("_anchor") - same > half_year)
        .then(on_year(1))
        .otherwise(same)
    )


# -- a big file range by range, small files in groups ------------------------------------------------------


def _groups(files: pl.DataFrame, tables: RunTables) -> list[list[str]]:
    """The small files as runs of whole files of about GROUP_LINES lines, in the run's input order (the
    order of `inputs`, in which every table holds its files' rows), so a group's rows are one run of
    each table's rows."""
    lines = dict(zip(files["file"].to_list(), files["last"].to_list(), strict=True))
    order = tables["inputs"]["file"].to_list() if "inputs" in tables else []
    groups: list[list[str]] = []
    size = 0
    for file in [f for f in dict.fromkeys(order) if f in lines] + sorted(set(lines) - set(order)):
        if not groups or size + lines[file] > GROUP_LINES:
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += lines[file]
    return groups


def _split_by_group(rows: pl.LazyFrame, groups: list[list[str]], spill: Spill) -> Path:
    """`rows` of the grouped files, with their group (`_group`), streamed to one Parquet file in their
    order. The groups are runs of the input order, which the rows follow, so `_group` only grows down
    the file, and a group's rows are read back from its own row groups (their statistics), not by a
    scan of the whole table per group."""
    owner = pl.DataFrame(
        {
            "file": [f for group in groups for f in group],
            "_group": [i for i, group in enumerate(groups) for _ in group],
        },
        schema={"file": pl.String, "_group": pl.Int64},
    )
    return spill.sink("_grouped", rows.join(owner.lazy(), on="file", how="inner", maintain_order="left"), 1 << 16)


def _of_group(grouped: Path, index: int) -> pl.DataFrame:
    return pl.scan_parquet(grouped).filter(pl.col("_group") == index).drop("_group").collect(engine="streaming")


def _place_group(grouped: Path, index: int, spill: Spill, median: datetime | None) -> Path | None:
    """Place a group of small files' lines together (each file's fills stay inside it): the path of
    the group's times."""
    times = _placed(_forward(_lines(_of_group(grouped, index)), median=median)).select(*KEY, *TIMES)
    return spill.write("_times", times)


def _range(start: int, first: bool = False) -> pl.Expr:
    """The rows of the range that starts at line `start` (with `first`, also the rows without a line)."""
    inside = pl.col("line").is_between(start, start + RANGE_LINES, closed="left")
    return inside | pl.col("line").is_null() if first else inside


def _place_file(
    columns: list[pl.LazyFrame], file: dict, spill: Spill, median: datetime | None
) -> list[tuple[int, Path]]:
    """Place a big file's lines range by range (module doc): each range's first line and the path of its times."""
    name = file["file"]
    starts = range(0, file["last"] + 1, RANGE_LINES)
    first_dated = pl.DataFrame(
        {"file": [name], "line": [file["first_line"]], "pid": [None], "ts": [file["first_ts"]]},
        schema={"file": pl.String, "line": pl.Int64, "pid": pl.Int64, "ts": pl.Datetime("ns", "UTC")},
    ).filter(pl.col("line").is_not_null())
    carried = pl.DataFrame()
    partial = []
    for start in starts:
        rows = pl.concat([c.filter(pl.col("file") == name, _range(start)) for c in columns]).collect(engine="streaming")
        lines = _lines(rows)
        later = first_dated.filter(pl.col("line") >= start + RANGE_LINES)
        context = _context(pl.concat([carried, later.with_columns(_dated=pl.lit(True))], how="diagonal_relaxed"))
        done = _forward(lines, _as_lines(context, lines), median)
        timed = done.filter(pl.col("ts").is_not_null()).select("file", "line", "pid", "ts", "_dated")
        known = pl.concat([carried, timed], how="diagonal_relaxed") if carried.height else timed
        # what the next ranges' fills reach back to: per process its last time, and the last dated line
        carried = (
            pl.concat(
                [known.group_by("pid").agg(pl.all().sort_by("line").last()), known.filter("_dated").tail(1)],
                how="diagonal_relaxed",
            )
            .unique("line")
            .sort("line")
        )
        partial.append((start, spill.write("_partial", done.select(PARTIAL))))
    times: list[tuple[int, Path]] = []
    following = pl.DataFrame()
    for start, path in reversed(partial):
        if path is None:
            continue
        done = pl.read_parquet(path).with_columns(_context=pl.lit(False))
        context = following.with_columns(_context=pl.lit(True)) if following.height else None
        placed = _placed(done, context)
        written = spill.write("_times", placed.select(*KEY, *TIMES))
        if written is not None:
            times.append((start, written))
        timed = done.filter(pl.col("ts").is_not_null()).select("file", "line", "pid", "ts")
        known = pl.concat([timed, following.select(timed.columns)]) if following.height else timed
        following = known.group_by("pid").agg(pl.all().sort_by("line").first())  # the first time after, per process
        path.unlink()
    return times[::-1]


def _context(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.unique("line").sort("line") if rows.height else rows


def _as_lines(context: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame | None:
    """Context rows with the columns of `lines` (no clock: their times are placed already)."""
    if not context.height:
        return None
    return context.with_columns(clock=pl.lit(None, pl.String), _context=pl.lit(True)).select(lines.columns)


# -- joining the times into the tables --------------------------------------------------------------

PLACED = (
    pl.coalesce("_ts", "ts").alias("ts"),
    pl.coalesce("_quality", "ts_quality").alias("ts_quality"),
    pl.coalesce("_lo", "ts").alias("ts_lo"),
    pl.coalesce("_hi", "ts").alias("ts_hi"),
)


def _joined(frame: Frame, times: pl.DataFrame) -> Frame:
    """`frame` with its time columns placed: only they are joined and replaced (`times` has one row
    per file and line, so the rows keep their order; in memory, the other columns stay shared; a lazy
    frame is joined as it is read)."""
    if isinstance(frame, pl.LazyFrame):
        placed = frame.join(times.lazy(), on=KEY, how="left", maintain_order="left")
        return placed.with_columns(*PLACED).drop(TIMES)
    joined = frame.select("file", "line", "ts", "ts_quality").join(times, on=KEY, how="left", maintain_order="left")
    return frame.with_columns(joined.select(*PLACED).get_columns())


def _times_for(
    frame: Frame, small: pl.DataFrame, ranges: dict[str, list[tuple[int, Path]]], groups: dict[Path, list[str]]
) -> pl.DataFrame:
    """The times of a table's lines: the small files' and, for its rows of big files and of groups,
    theirs from disk."""
    paths = [path for times in ranges.values() for _, path in times] + list(groups)
    if not paths:
        return small
    on_disk = [*ranges, *(file for files in groups.values() for file in files)]
    keys = frame.lazy().select(KEY).filter(pl.col("file").is_in(on_disk)).unique()
    return pl.concat([small, pl.scan_parquet(paths).join(keys, on=KEY, how="semi").collect()])


def _joined_by_range(
    frames: dict[str, pl.LazyFrame],
    small: pl.DataFrame,
    ranges: dict[str, list[tuple[int, Path]]],
    groups: dict[Path, list[str]],
    spill: Spill | None,
) -> dict[str, Frame]:
    """Spilled tables placed in their rows' order: each run of small files' rows joined lazily, each big
    file's rows range by range, given that range's times (read once for every table) and written to `spill`,
    each group of small files' rows at once, given the group's times."""
    if not (ranges or groups) or spill is None:
        return {name: _joined(frame, small) for name, frame in frames.items()}
    orders = {
        name: frame.select(pl.col("file").unique(maintain_order=True)).collect()["file"].to_list()
        for name, frame in frames.items()
    }
    written: dict[tuple[str, Path], pl.LazyFrame] = {}  # (table, a range's or group's times) -> its rows, placed
    for file, file_ranges in ranges.items():
        for i, (start, path) in enumerate(file_ranges):
            times = _by_position(pl.read_parquet(path), start)
            for name, frame in frames.items():
                if file not in orders[name]:
                    continue
                rows = frame.filter(pl.col("file") == file, _range(start, first=i == 0)).collect(engine="streaming")
                found = times.select(pl.all().gather(rows["line"] - start))
                placed = pl.concat([rows.select("ts", "ts_quality"), found], how="horizontal").select(*PLACED)
                if (part := spill.write(name, rows.with_columns(placed.get_columns()))) is not None:
                    written[name, path] = pl.scan_parquet(part)
    members = list(groups.values())
    for name, frame in frames.items():
        if not {f for files in members for f in files}.intersection(orders[name]):
            continue
        grouped = _split_by_group(frame, members, spill)
        for index, path in enumerate(groups):
            rows = _of_group(grouped, index)
            if rows.height and (part := spill.write(name, _joined(rows, pl.read_parquet(path)))) is not None:
                written[name, path] = pl.scan_parquet(part)
        grouped.unlink()
    units = {file: [path for _, path in times] for file, times in ranges.items()}
    units |= {file: [path] for path, files in groups.items() for file in files}
    return {name: _in_order(frame, orders[name], small, units, written, name) for name, frame in frames.items()}


def _in_order(
    frame: pl.LazyFrame,
    order: list[str | None],
    small: pl.DataFrame,
    units: dict[str, list[Path]],
    written: dict[tuple[str, Path], pl.LazyFrame],
    name: str,
) -> Frame:
    """A spilled table placed, in its rows' order (`order`: its files, as they come): each run of small
    files' rows joined lazily; the files placed on disk (`units`: each file's ranges, or its group, by
    the path of their times) as their rows were written, a group's where its first file comes (the input
    order, which every table's rows follow)."""
    parts: list[pl.LazyFrame] = []
    run: list[str | None] = []
    taken: set[Path] = set()

    def flush() -> None:
        if run:
            files = pl.col("file").is_in([f for f in run if f is not None])
            parts.append(
                _joined(frame.filter(files | pl.col("file").is_null() if None in run else files), small).lazy()
            )
            run.clear()

    for file in order:
        if file not in units:
            run.append(file)
            continue
        flush()
        for path in units[file]:
            if (name, path) in written and path not in taken:
                taken.add(path)
                parts.append(written[name, path])
    flush()
    return pl.concat(parts, how="diagonal_relaxed") if parts else _joined(frame, small)


def _by_position(times: pl.DataFrame, start: int) -> pl.DataFrame:
    """A range's times (one row per line) as RANGE_LINES rows, row i that of line start + i (nulls where
    no table has the line): a table's rows take theirs by gathering at their line, not by a join."""
    at = times["line"] - start
    return pl.DataFrame(
        [pl.repeat(None, RANGE_LINES, dtype=times[c].dtype, eager=True).alias(c).scatter(at, times[c]) for c in TIMES]
    )
