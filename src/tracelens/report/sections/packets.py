"""Packet captures: per RoCE QP and per TCP flow (worst first), and a timeline of NAKs, retransmissions and CNPs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.hosts import describe
from tracelens.report import svg

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 60
TITLE = "Packet captures"
TEMPLATE = "sections/packets.html.j2"
MAX_ROWS = 50  # flows listed; the rest are counted
TIMELINE_KINDS = (
    "NAK (PSN sequence error)",
    "NAK (other)",
    "RNR NAK",
    "CNP",
    "RoCE retransmission",
    "TCP retransmission",
    "PSN gap",
    "zero window",
)


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """Per-QP and per-flow tables worst first and the event timeline; None without captures."""
    result = ctx.packets
    if result is None:
        return None
    hosts = ctx.host_names
    named = [pl.col(c).replace({ip: describe(ip, hosts) for ip in hosts}) for c in ("src", "dst")]
    qps = result.qps.with_columns(named)
    tcp = result.tcp.with_columns(named).filter(pl.col("segments") > 0)
    return {
        "captures": ctx.captures.rows(named=True),
        "qps": qps.head(MAX_ROWS).rows(named=True),
        "qps_more": max(qps.height - MAX_ROWS, 0),
        "tcp": tcp.head(MAX_ROWS).rows(named=True),
        "tcp_more": max(tcp.height - MAX_ROWS, 0),
        "duplicates": result.events.filter(pl.col("kind") == "capture duplicate").height,
        "timeline": _timeline(result.events),
    }


def _timeline(events: pl.DataFrame):
    """Events per kind over time (1 s or finer bins), as inline SVG; None when there is nothing to draw."""
    shown = events.filter(pl.col("kind").is_in(TIMELINE_KINDS), pl.col("ts").is_not_null())
    if shown.height == 0:
        return None
    span = (shown["ts"].max() - shown["ts"].min()).total_seconds()
    every = "1s" if span > 60 else "10ms" if span > 0.5 else "100us"
    binned = (
        shown.with_columns(pl.col("ts").dt.truncate(every))
        .group_by("ts", "kind")
        .len()
        .sort("ts", pl.col("kind").cast(pl.String))  # the stacking order within a bin: by kind, the same every run
    )
    step_s = {"1s": 1.0, "10ms": 0.01, "100us": 0.0001}[every]
    lo, hi = svg.epoch_seconds([binned["ts"].min(), binned["ts"].max()])
    fig = svg.Figure(lo - step_s, hi + 2 * step_s, f"time (UTC, {every} bins)", time=True, width=720 + svg.LEFT)
    per_bin = binned.group_by("ts").agg(pl.col("len").sum())
    panel = fig.panel(180, "events", y_range=(0.0, float(per_bin["len"].max())))
    stacked = binned.with_columns(below=pl.col("len").cum_sum().over("ts") - pl.col("len"))
    for n, kind in enumerate(k for k in TIMELINE_KINDS if k in set(binned["kind"].to_list())):
        rows = stacked.filter(pl.col("kind") == kind)
        svg.bars(
            panel,
            [x + step_s / 2 for x in svg.epoch_seconds(rows["ts"].to_list())],
            rows["len"].cast(pl.Float64).to_list(),
            svg.PALETTE[n % len(svg.PALETTE)],
            label=kind,
            width_x=step_s,
            bottoms=rows["below"].cast(pl.Float64).to_list(),
        )
    return svg.render(fig)
