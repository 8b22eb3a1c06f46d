"""Packet captures: per RoCE QP and per TCP flow (worst first), and a timeline of NAKs, retransmissions and CNPs."""

from __future__ import annotations

import altair as alt
import polars as pl

from tracelens.packets.flows import analyze
from tracelens.packets.hosts import describe, host_names
from tracelens.report.charts import to_svg

ORDER = 60
TITLE = "Packet captures"
TEMPLATE = "sections/packets.html.j2"
MAX_ROWS = 50  # flows listed; the rest are counted
TIMELINE_KINDS = ("NAK (PSN sequence error)", "NAK (other)", "RNR NAK", "CNP", "RoCE retransmission",
                  "TCP retransmission", "PSN gap", "zero window")


def context(analysis) -> dict | None:
    """Per-QP and per-flow tables worst first and the event timeline; None without captures."""
    packets = analysis.tables["packets"]
    if packets.height == 0:
        return None
    result = analyze(packets)
    hosts = host_names(analysis.tables)
    named = [pl.col(c).replace({ip: describe(ip, hosts) for ip in hosts}) for c in ("src", "dst")]
    qps = result.qps.with_columns(named)
    tcp = result.tcp.with_columns(named).filter(pl.col("segments") > 0)
    return {
        "captures": packets.group_by("file").agg(frames=pl.len(), first=pl.col("ts").min(), last=pl.col("ts").max())
        .sort("file").rows(named=True),
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
        shown.with_columns(pl.col("ts").dt.truncate(every).dt.replace_time_zone(None))
        .group_by("ts", "kind")
        .len()
        .sort("ts")
    )
    values = binned.with_columns(pl.col("ts").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f")).rows(named=True)
    chart = (
        alt.Chart(alt.Data(values=values))
        .mark_bar()
        .encode(
            x=alt.X("ts:T", title=f"time (UTC, {every} bins)"),
            y=alt.Y("len:Q", title="events"),
            color=alt.Color("kind:N", title=None, sort=list(TIMELINE_KINDS)),
            tooltip=["ts:T", "kind:N", "len:Q"],
        )
        .properties(width=720, height=180)
    )
    return to_svg(chart)
