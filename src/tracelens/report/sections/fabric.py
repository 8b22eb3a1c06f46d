"""The fabric per host and port: state, rate, and the counters that moved (worst first),
with a chart of error and blocked-time rates over the dump times."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.counters import PORT_KEY, describe, kind_of, movements
from tracelens.derived.ports import port_label
from tracelens.report import svg

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 50
TITLE = "Fabric ports and counters"
TEMPLATE = "sections/fabric.html.j2"

_IDENT = ["host", "ident", "port"]  # a port: its CA when known, else what the dump called it (Lid 2052)


def _with_ident(frame: pl.DataFrame) -> pl.DataFrame:
    node = pl.col("node") if "node" in frame.columns else pl.lit(None, pl.String)
    return frame.with_columns(ident=pl.coalesce("ca", node))


def _chart(deltas: pl.DataFrame):
    """Error and blocked-time rates per port and interval, or None when no port was dumped twice."""
    points = deltas.filter(
        pl.col("start").is_not_null()
        & pl.col("rate_per_s").is_not_null()
        & (pl.col("delta") > 0)
        & ~kind_of(pl.col("counter")).is_in(["traffic", "other"])
    )
    if points.height == 0:
        return None
    labels = pl.struct(PORT_KEY).map_elements(lambda p: port_label(**p), return_dtype=pl.String)
    data = points.select(
        pl.col("end").alias("time"),
        pl.col("rate_per_s").alias("per_second"),
        pl.format("{} {}", labels, "counter").alias("series"),
    ).sort("time")
    lo, hi = svg.epoch_seconds([data["time"].min(), data["time"].max()])
    fig = svg.Figure(
        lo - 30,
        hi + 30,
        "dump time (UTC)",
        time=True,
        width=640 + svg.LEFT,
        title="Error and wait counters per second, per interval between dumps",
    )
    panel = fig.panel(220, "per second", y_range=(0.0, float(data["per_second"].max())))
    groups = data.group_by("series", maintain_order=True)
    svg.lines(panel, ((s[0], rows["time"].to_list(), rows["per_second"].to_list()) for s, rows in groups), points=True)
    return svg.render(fig)


def _port_row(key: dict, state: dict, moves: pl.DataFrame) -> dict:
    first = moves.row(0, named=True) if moves.height else {}
    node = first.get("node", None if state else key["ident"])
    label = port_label(key["host"], node, state.get("ca") or first.get("ca"), key["port"])
    return {
        "label": label or key["ident"] or "(unnamed port)",
        "state": " / ".join(v for v in (state.get("state"), state.get("phys_state")) if v),
        "rate": f"{state['rate_gbps']:g} Gb/s" if state.get("rate_gbps") else "",
        "link": " ".join(str(v) for v in (state.get("width"), state.get("link_layer")) if v),
        "mtu": state.get("active_mtu") or "",
        "counters": [
            {"kind": m["kind"], "counter": m["counter"], "change": describe(m)} for m in moves.iter_rows(named=True)
        ],
        "worst": int(moves["rank"].min()) if moves.height else 99,
    }


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """Ports and counter deltas per host, worst first, and the error/wait-rate chart; None without fabric dumps."""
    deltas, ports = ctx.counter_deltas, ctx.latest_ports
    if deltas.height == 0 and ports.height == 0:
        return None
    moves, states = _with_ident(movements(deltas)), _with_ident(ports)
    keys = pl.concat([moves.select(_IDENT), states.select(_IDENT), _with_ident(deltas).select(_IDENT)]).unique()
    rows = []
    for key in keys.sort(_IDENT, nulls_last=True).iter_rows(named=True):
        match = pl.all_horizontal(pl.col(c).eq_missing(key[c]) for c in _IDENT)
        state = states.filter(match)
        rows.append(_port_row(key, state.row(0, named=True) if state.height else {}, moves.filter(match)))
    rows.sort(key=lambda r: r["worst"])
    return {
        "ports": rows,
        "chart": _chart(deltas),
        "untied": deltas.filter(pl.col("start").is_null()).height > 0,
    }
