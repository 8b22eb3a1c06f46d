"""Profiler traces: per rank, where its time went (the temporal breakdown of tracelens.derived.traces)
and how long it waited for later ranks at the collectives; and a lane per rank, one bar per step, split
into computation, exposed communication, memory and idle time, with the steps where it arrived last."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 42
TITLE = "Profiler traces"
TEMPLATE = "sections/traces.html.j2"

MAX_RANKS = 64
MAX_STEPS = 200  # steps drawn per lane (the first ones)
PARTS = ("computation", "exposed_comm", "memory", "idle")  # the bar's parts, left to right


def _share(row: dict, part: str) -> float:
    return 100 * (row[f"{part}_us"] or 0.0) / row["window_us"] if row["window_us"] else 0.0


def _ranks(ctx: RunContext) -> list[dict]:
    whole = ctx.trace_breakdown.filter(pl.col("step").is_null() | (pl.col("basis") == "cpu"))
    whole = whole.drop("start_us").group_by("rank", "basis").agg(pl.col("^.*_us$").sum()).sort("rank")
    waits = ctx.trace_waits.group_by("rank").agg(
        pl.col("collectives").sum(), pl.col("wait_us").sum(), pl.col("last").sum()
    )
    rows = whole.join(waits, on="rank", how="left").join(
        ctx["trace_ranks"].select("rank", "file", "host", "world_size", "backend", "steps"), on="rank", how="left"
    )
    return [
        r | {"shares": {part: _share(r, part) for part in PARTS}, "overlapped": _share(r, "overlapped_comm")}
        for r in rows.head(MAX_RANKS).iter_rows(named=True)
    ]


def _lanes(ctx: RunContext) -> list[dict]:
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null(), pl.col("window_us") > 0)
    if steps.height == 0:
        return []
    lasts = ctx.trace_waits.select("rank", "step", "last", "wait_us")
    steps = steps.join(lasts, on=["rank", "step"], how="left")
    longest = steps["window_us"].max() or 1.0
    lanes = []
    for rank in sorted(steps["rank"].unique().to_list())[:MAX_RANKS]:
        mine = steps.filter(pl.col("rank") == rank).sort("step").head(MAX_STEPS)
        bars = [
            {
                "step": r["step"],
                "height": 100 * r["window_us"] / longest,
                "parts": [(part, _share(r, part)) for part in PARTS],
                "last": bool(r["last"]),
                "title": f"step {r['step']}: {r['window_us'] / 1e3:,.1f} ms, "
                + ", ".join(f"{part.replace('_', ' ')} {_share(r, part):.0f}%" for part in PARTS)
                + (f", waited {r['wait_us'] / 1e3:,.1f} ms" if r["wait_us"] else "")
                + (", arrived last" if r["last"] else ""),
            }
            for r in mine.iter_rows(named=True)
        ]
        lanes.append({"rank": rank, "bars": bars})
    return lanes


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """The per-rank breakdown table and lanes; None when the run has no profiler trace."""
    if ctx.tables.height("trace_spans") == 0:
        return None
    ranks = _ranks(ctx)
    if not ranks:
        return None
    return {"ranks": ranks, "lanes": _lanes(ctx), "parts": PARTS, "traces": ctx.tables.height("trace_ranks")}
