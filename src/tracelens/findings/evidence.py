"""Helpers the rules share: turning table rows into Evidence, and small run facts."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import polars as pl

from tracelens.derived import RunContext
from tracelens.findings import Evidence
from tracelens.tables import Frame

Text = str | Callable[[Mapping[str, Any]], str]  # the column holding a row's text, or how to write it from the row


def _from_row(row: Mapping[str, Any], text: Text) -> Evidence:
    """The one piece of evidence a row (a line, or a capture's frame) gives."""
    said = row.get(text) if isinstance(text, str) else text(row)
    return Evidence(
        file=row["file"], line=row.get("line"), frame=row.get("frame"), text=str(said or ""), host=row.get("host")
    )


def evidence(rows: pl.DataFrame, text: Text = "message") -> list[Evidence]:
    """Evidence for the rows (columns file, line, host and the text's), in file and line order, once per
    distinct line and text."""
    found: dict[tuple, Evidence] = {}
    for row in rows.sort("file", "line", maintain_order=True).iter_rows(named=True):
        one = _from_row(row, text)
        found.setdefault((one.file, one.line, one.text), one)
    return list(found.values())


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
    return evidence(rows)


def row_evidence(rows: Iterable[Mapping[str, Any]], limit: int | None = None, text: Text = "text") -> list[Evidence]:
    """Evidence for the rows (dicts with file, and line, frame or host when they have them, and the text's),
    the first `limit` of them (None: all), in the order given: ranked or picked by whoever kept them."""
    return [_from_row(row, text) for row in itertools.islice(rows, limit)]
