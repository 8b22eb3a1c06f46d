"""GPU utilisation and clocks into gpu_samples: `nvidia-smi --query-gpu=... --format=csv`
(any field subset, with or without header, units and timestamp, `-l N` loops), `nvidia-smi
dmon` (plain, `-o T`, `-o DT`), `dcgmi dmon`, and the plain `nvidia-smi` table (drivers 396
to 610, MIG mode).

grammars/nvsmi.lark is the spec of every line kind. A line's shape (its numbers masked
to 0) is parsed once with it to learn the kind; a loop prints thousands of lines of a few
shapes, and the values of every line of a kind are then taken with vectorized splits.
A headerless CSV takes its fields from the `--query-gpu=` command when the file shows it;
without one its rows are counted as unrecognized.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import polars as pl

from tracelens.ingest import IngestResult, InputFile, LineStart, input_format
from tracelens.ingest.host.hostlines import (
    IGNORED,
    PARSED,
    ShapeGrammar,
    account,
    local_time,
    provenance,
)
from tracelens.ingest.text.lines import number, read_lines
from tracelens.ingest.text.shell_context import context

_SNIFF = LineStart(
    rb"\|\s*NVIDIA-SMI \d|#\s*(?:Date\s+)?(?:Time\s+)?gpu\s+\w|#Entity\s|"
    rb"(?:timestamp|index|name|pci\.bus_id|uuid|utilization\.gpu)(?: \[[^\]\n]*\])?, [a-z]"
)

ROW_KINDS = {"csv_row", "dmon_row", "dcgmi_row", "gpu_head", "gpu_stats"}
KNOWN_KINDS = {
    "banner",
    "gpu_extra",
    "process",
    "mig_row",
    "no_process",
    "csv_header",
    "dmon_header",
    "dcgmi_header",
    "failure",
}
DECOR_KINDS = {"border", "label", "dmon_units", "dcgmi_units"}

# --query-gpu field -> gpu_samples column
CSV_FIELDS = {
    "index": "gpu", "pci.bus_id": "bus_id", "name": "name", "utilization.gpu": "util_gpu",
    "utilization.memory": "util_mem", "power.draw": "power_w", "power.draw.instant": "power_w",
    "power.limit": "power_cap_w", "enforced.power.limit": "power_cap_w", "temperature.gpu": "temp_c",
    "memory.used": "mem_used_mib", "memory.total": "mem_total_mib", "clocks.current.sm": "sm_clock_mhz",
    "clocks.sm": "sm_clock_mhz", "clocks.current.memory": "mem_clock_mhz", "clocks.mem": "mem_clock_mhz",
    "pstate": "pstate", "clocks_throttle_reasons.active": "throttle", "clocks_event_reasons.active": "throttle",
}  # fmt: skip
DMON_FIELDS = {
    "gpu": "gpu",
    "pwr": "power_w",
    "gtemp": "temp_c",
    "sm": "util_gpu",
    "mem": "util_mem",
    "mclk": "mem_clock_mhz",
    "pclk": "sm_clock_mhz",
    "fb": "mem_used_mib",
}
# dcgmi dmon short names; activity ratios (0..1) are scaled to percent
DCGMI_FIELDS = {
    "GPUTL": "util_gpu",
    "MCUTL": "util_mem",
    "POWER": "power_w",
    "GTEMP": "temp_c",
    "SMCLK": "sm_clock_mhz",
    "MMCLK": "mem_clock_mhz",
    "FBUSD": "mem_used_mib",
    "FBTTL": "mem_total_mib",
    "XIDER": "xid",
}
DCGMI_RATIOS = {"GRACT": "util_gpu", "SMACT": "util_gpu"}
TEXT_COLUMNS = {"bus_id", "name", "pstate", "throttle"}

# clocks_throttle_reasons.active bits (nvml.h nvmlClocksThrottleReason*)
THROTTLE_BITS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}

_NUMBER = r"^\s*\[?(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)\]?\s*(?:%|W|MHz|MiB|C)?\s*$"
_HEAD = (
    r"^\|\s*(?P<gpu>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s*\|\s*"
    r"(?P<bus_id>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)"
)
_STATS = (
    r"^\|\s*\S+\s+(?P<temp_c>\d+|N/A|ERR!)C?\s+(?P<pstate>P\d+|N/A|ERR!)\s+(?P<power_w>[\d.]+|N/A|ERR!)W?\s*/\s*"
    r"(?P<power_cap_w>[\d.]+|N/A|ERR!)W?\s*\|\s*(?P<mem_used_mib>\d+|N/A)(?:MiB)?\s*/\s*(?P<mem_total_mib>\d+|N/A)(?:MiB)?\s*\|"
    r"\s*(?P<util_gpu>\d+|N/A|ERR!)%?"
)


GRAMMAR = ShapeGrammar("nvsmi")


def sniff(head: bytes) -> bool:
    return b"--query-gpu=" in head or _SNIFF.search(head)


def _number(col: pl.Expr) -> pl.Expr:
    return number(col.str.extract(_NUMBER, 1))


def _throttle(col: pl.Expr) -> pl.Expr:
    mask = col.str.strip_chars().str.replace("^0x", "").str.to_integer(base=16, strict=False)
    names = [pl.when((mask & bit) > 0).then(pl.lit(name)) for bit, name in THROTTLE_BITS.items()]
    return pl.concat_str(names, separator=",", ignore_nulls=True).replace("", None)


def _typed(frame: pl.DataFrame, values: dict[str, pl.Expr]) -> pl.DataFrame:
    """Columns of gpu_samples from raw text values: numbers without units, N/A as null."""
    exprs = []
    for column, raw in values.items():
        if column == "throttle":
            exprs.append(_throttle(raw).alias(column))
        elif column in TEXT_COLUMNS:
            exprs.append(raw.str.strip_chars().replace({"[N/A]": None, "N/A": None}).alias(column))
        else:
            exprs.append(_number(raw).alias(column))
    return frame.with_columns(exprs)


def _header_blocks(lines: pl.DataFrame, header_kind: str, fields: pl.Expr | None = None) -> pl.DataFrame:
    """Each line with the text of the last header of `header_kind` above it (`block`)."""
    header = pl.when(pl.col("kind") == header_kind).then(pl.col("text"))
    if fields is not None:
        header = pl.coalesce(header, fields)
    return lines.with_columns(block=header.forward_fill())


def _csv(lines: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """--query-gpu rows; returns the rows and the lines whose row did not fit its header."""
    command = pl.col("text").str.extract(r"--query-gpu[= ](\S+)", 1).str.replace_all(",", ", ")
    blocks = _header_blocks(
        lines.with_columns(cmd=pl.when(pl.col("ctx").is_not_null()).then(command)), "csv_header", pl.col("cmd")
    )
    rows = blocks.filter(pl.col("kind") == "csv_row", pl.col("block").is_not_null())
    frames, bad = [], []
    for header in rows["block"].unique(maintain_order=True).to_list():
        names = [re.sub(r"\s*\[.*\]$", "", f.strip()) for f in header.split(",")]
        mine = rows.filter(pl.col("block") == header).with_columns(cells=pl.col("text").str.split(","))
        fits = mine["cells"].list.len() == len(names)
        bad.extend(mine.filter(~fits)["line"].to_list())
        mine = mine.filter(fits)
        cells = {name: pl.col("cells").list.get(i) for i, name in enumerate(names)}
        values = {CSV_FIELDS[n]: cells[n] for n in names if n in CSV_FIELDS}
        typed = _typed(mine, values)
        if "timestamp" in cells:
            stamp = cells["timestamp"]
            typed = typed.with_columns(
                ts=local_time(stamp, "%Y/%m/%d %H:%M:%S%.f"),
                ts_text=stamp.str.strip_chars(),  # as printed
            )
        frames.append(typed.with_columns(source=pl.lit("query_csv")))
    orphans = blocks.filter(pl.col("kind") == "csv_row", pl.col("block").is_null())["line"].to_list()
    return _concat(frames), pl.Series(bad + orphans, dtype=pl.Int64)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _dmon(lines: pl.DataFrame, file_day: datetime) -> tuple[pl.DataFrame, pl.Series]:
    """dmon rows (the header names the columns, `-o T`/`-o DT` add Time / Date)."""
    blocks = _header_blocks(lines, "dmon_header")
    rows = blocks.filter(pl.col("kind") == "dmon_row", pl.col("block").is_not_null())
    frames, bad = [], []
    for header in rows["block"].unique(maintain_order=True).to_list():
        names = header.lstrip("#").split()
        mine = rows.filter(pl.col("block") == header).with_columns(parts=pl.col("text").str.extract_all(r"\S+"))
        fits = mine["parts"].list.len() == len(names)
        bad.extend(mine.filter(~fits)["line"].to_list())
        mine = mine.filter(fits)
        cells = {name: pl.col("parts").list.get(i) for i, name in enumerate(names)}
        typed = _typed(mine, {DMON_FIELDS[n]: cells[n] for n in names if n in DMON_FIELDS})
        if "Date" in cells and "Time" in cells:
            printed = pl.concat_str([cells["Date"], cells["Time"]], separator=" ")  # the two cells as printed
            typed = typed.with_columns(ts=local_time(printed, "%Y%m%d %H:%M:%S"), ts_text=printed)
        elif "Time" in cells:
            typed = _on_day(typed, cells["Time"], file_day).with_columns(ts_text=cells["Time"])  # a time of day
        frames.append(typed.with_columns(source=pl.lit("dmon")))
    orphans = blocks.filter(pl.col("kind") == "dmon_row", pl.col("block").is_null())["line"].to_list()
    return _concat(frames), pl.Series(bad + orphans, dtype=pl.Int64)


def _on_day(frame: pl.DataFrame, clock: pl.Expr, file_day: datetime) -> pl.DataFrame:
    """`-o T` prints a time of day only: the date is the `date` line's, else the file's, and a
    time earlier than the one before it is on the next day."""
    day = pl.coalesce(pl.col("stamp").dt.date(), pl.lit(file_day.date()))
    at = (
        (day.cast(pl.String) + " " + clock)
        .str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="ns")
        .dt.replace_time_zone("UTC")
    )
    frame = frame.with_columns(_at=at)
    wrapped = (frame["_at"].diff() < pl.duration(hours=-12)).fill_null(False).cum_sum()
    return frame.with_columns(
        ts=pl.col("_at") + pl.duration(days=wrapped), inferred_day=pl.col("stamp").is_null()
    ).drop("_at")


def _dcgmi(lines: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    blocks = _header_blocks(lines, "dcgmi_header")
    rows = blocks.filter(pl.col("kind") == "dcgmi_row", pl.col("block").is_not_null())
    frames, bad = [], []
    for header in rows["block"].unique(maintain_order=True).to_list():
        names = ["_entity", "gpu", *header.split()[1:]]
        mine = rows.filter(pl.col("block") == header).with_columns(parts=pl.col("text").str.extract_all(r"\S+"))
        fits = mine["parts"].list.len() == len(names)
        bad.extend(mine.filter(~fits)["line"].to_list())
        mine = mine.filter(fits & (pl.col("parts").list.first() == "GPU"))
        cells = {name: pl.col("parts").list.get(i) for i, name in enumerate(names)}
        values = {"gpu": cells["gpu"]} | {DCGMI_FIELDS[n]: cells[n] for n in names if n in DCGMI_FIELDS}
        typed = _typed(mine, values)
        for name, column in DCGMI_RATIOS.items():
            if name in cells and column not in values:
                typed = typed.with_columns((_number(cells[name]) * 100).alias(column))
                values[column] = cells[name]
        frames.append(typed.with_columns(source=pl.lit("dcgmi")))
    return _concat(frames), pl.Series(bad, dtype=pl.Int64)


def _table(lines: pl.DataFrame) -> pl.DataFrame:
    """The plain table: a GPU's head row names it, the row under it holds its numbers."""
    head = pl.col("text").str.extract_groups(_HEAD)
    named = (
        lines.filter(pl.col("kind").is_in(["gpu_head", "gpu_stats"]))
        .with_columns(head=pl.when(pl.col("kind") == "gpu_head").then(head))
        .with_columns(pl.col("head").forward_fill())
    )
    stats = named.filter(pl.col("kind") == "gpu_stats")
    if stats.height == 0:
        return pl.DataFrame()
    groups = stats.with_columns(s=pl.col("text").str.extract_groups(_STATS)).unnest("s")
    values = {
        c: pl.col(c)
        for c in ("temp_c", "pstate", "power_w", "power_cap_w", "mem_used_mib", "mem_total_mib", "util_gpu")
    }
    typed = _typed(groups, values).with_columns(
        gpu=pl.col("head").struct.field("gpu").cast(pl.Int32, strict=False),
        name=pl.col("head").struct.field("name").str.strip_chars(),
        bus_id=pl.col("head").struct.field("bus_id"),
        source=pl.lit("table"),
    )
    return typed.drop("head")


@input_format("nvidia_smi", priority=90, sniff=sniff)
def ingest(source: InputFile) -> IngestResult:
    lines = GRAMMAR.kinds(context(read_lines(source)))
    file_day = datetime.fromtimestamp(source.path.stat().st_mtime, timezone.utc)
    csv, bad_csv = _csv(lines)
    dmon, bad_dmon = _dmon(lines, file_day)
    dcgmi, bad_dcgmi = _dcgmi(lines)
    table = _table(lines)
    bad = pl.concat([bad_csv, bad_dmon, bad_dcgmi])
    kind = pl.col("kind")
    status = lines.select(
        pl.when(pl.col("ctx").is_not_null())
        .then(pl.col("ctx"))
        .when(pl.col("line").is_in(bad.implode()))
        .then(pl.lit(None, pl.UInt8))
        .when(kind.is_in(list(ROW_KINDS | KNOWN_KINDS)))
        .then(pl.lit(PARSED, pl.UInt8))
        .when(kind.is_in(list(DECOR_KINDS)))
        .then(pl.lit(IGNORED, pl.UInt8))
    ).to_series()
    result = IngestResult(account=account(lines, status))
    samples = _concat([f for f in (csv, dmon, dcgmi, table) if f.height])
    if samples.height:
        when = pl.col("ts") if "ts" in samples.columns else None
        frame = provenance(source, samples, when)
        if "inferred_day" in frame.columns:
            frame = frame.with_columns(
                ts_quality=pl.when(pl.col("inferred_day") & pl.col("ts").is_not_null())
                .then(pl.lit("inferred"))
                .otherwise("ts_quality")
            )
        keep = [
            c
            for c in frame.columns
            if c
            not in {
                "text",
                "ctx",
                "kind",
                "stamp",
                "is_date",
                "prompt_host",
                "block",
                "cells",
                "parts",
                "cmd",
                "_",
                "inferred_day",
                "head",
            }
        ]
        result.add("gpu_samples", frame.select(keep))
    return result
