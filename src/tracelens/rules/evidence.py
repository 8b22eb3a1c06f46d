"""Helpers the rules share: turning table rows into Evidence, and small run facts."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from tracelens.derived import RunContext
from tracelens.findings import Evidence
from tracelens.tables import Frame


def evidence(rows: pl.DataFrame) -> list[Evidence]:
    """Evidence for each row (columns file, line, host, message), in file and line order."""
    rows = rows.unique(["file", "line"]).sort("file", "line")
    return [
        Evidence(file=r["file"], line=r["line"], text=r.get("message") or "", host=r.get("host"))
        for r in rows.iter_rows(named=True)
    ]


def hosts_of(*frames: Frame) -> list[str]:
    """Distinct non-null hosts over the given frames (a lazy one is read for its hosts only)."""
    found: set[str] = set()
    for frame in frames:
        if "host" in frame.collect_schema().names():
            found.update(
                h
                for h in frame.lazy().select(pl.col("host").unique()).collect(engine="streaming")["host"].to_list()
                if h
            )
    return sorted(found)


def any_row(rows: pl.LazyFrame, *predicates: pl.Expr) -> bool:
    """Whether any row of a table (a scan, read until the first row found) matches the predicates."""
    return rows.filter(*predicates).head(1).collect().height > 0


def ranks_of(ctx: RunContext, rows: pl.DataFrame) -> list[int]:
    """Ranks of the processes (host, pid) behind `rows`, from the communicator lines (read for them only)."""
    if "pid" not in rows.columns:
        return []
    processes = rows.select("host", "pid").unique().lazy()
    comms = ctx.scan("nccl_comms").select("host", "pid", "rank").drop_nulls()
    hit = comms.join(processes, on=["host", "pid"], how="inner").collect(engine="streaming")
    return sorted(set(hit["rank"].to_list()))


def time_window(rows: pl.DataFrame) -> tuple[datetime, datetime] | None:
    """The first and last time of `rows`, when any of them carries a time."""
    ts = rows["ts"].drop_nulls()
    return (ts.min(), ts.max()) if ts.len() else None


def step_evidence(ctx: RunContext, file: str, lines) -> list[Evidence]:
    """Evidence for the `steps` rows at `lines` of `file`: the step, timer and throughput lines (read by
    a filter the scan of a big run's steps pushes down)."""
    lines = list(lines)
    if not lines:
        return []
    near = pl.col("line").is_between(min(lines), max(lines))  # the row groups that can hold them, by statistics
    rows = ctx.scan("steps").filter(near, pl.col("file") == file, pl.col("line").is_in(lines))
    rows = rows.select("file", "line", "host", "message").collect(engine="streaming").sort("line")
    return [
        Evidence(file=r["file"], line=r["line"], text=r["message"] or "", host=r["host"])
        for r in rows.iter_rows(named=True)
    ]


def row_evidence(rows, limit: int) -> list[Evidence]:
    """Evidence for the first `limit` rows a window signal kept (dicts with file, line or frame, text, host)."""
    return [
        Evidence(file=r["file"], line=r.get("line"), frame=r.get("frame"), text=r.get("text") or "", host=r.get("host"))
        for r in list(rows)[:limit]
    ]
