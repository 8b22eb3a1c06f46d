"""Event rates of one run (packet-level trouble per second of capture, counter movement per second of
dumps), to be tested against the other run's rate of the same event."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.counters import KINDS, kind_of

# Packet events that mean trouble on the wire (capture duplicates are an artefact, not the network).
PACKET_KINDS = (
    "TCP retransmission",
    "NAK (PSN sequence error)",
    "PSN gap",
    "RoCE retransmission",
    "RNR NAK",
    "CNP",
    "ECN-CE",
)
# Counts of events (PortXmitWait counts clock ticks, not events: a count test does not apply to it).
COUNTER_KINDS = tuple(k for k in KINDS if k != "blocked time")


@dataclass(frozen=True)
class Rate:
    """`count` events over `exposure_s` seconds of observation, in `area` (packets or counters)."""

    area: str
    what: str
    count: int
    exposure_s: float

    @property
    def per_s(self) -> float:
        return self.count / self.exposure_s if self.exposure_s else 0.0


def run_rates(ctx: RunContext) -> dict[tuple[str, str], Rate]:
    """Every packet and counter rate the run can give, keyed by (area, what)."""
    return {(r.area, r.what): r for r in [*_packet_rates(ctx), *_counter_rates(ctx)]}


def _packet_rates(ctx: RunContext) -> list[Rate]:
    if ctx.packets is None:
        return []
    spans = ctx.captures.select(span=(pl.col("last") - pl.col("first")).dt.total_microseconds() / 1e6)
    exposure = float(spans["span"].sum() or 0.0)
    events = ctx.packets.events
    counts = dict(events.group_by("kind").len().iter_rows())
    return [Rate("packets", kind, int(counts.get(kind, 0)), exposure) for kind in PACKET_KINDS]


def _counter_rates(ctx: RunContext) -> list[Rate]:
    deltas = ctx.counter_deltas.filter(pl.col("status") == "delta", pl.col("interval_s").is_not_null())
    if deltas.height == 0:
        return []
    kinds = deltas.with_columns(kind=kind_of(pl.col("counter"))).filter(pl.col("kind").is_in(COUNTER_KINDS))
    # exposure: port-seconds watched (each port's intervals once, not once per counter)
    exposure = float(deltas.unique(["host", "node", "port", "start", "end"])["interval_s"].sum())
    counts = dict(kinds.group_by("kind").agg(pl.col("delta").sum()).iter_rows())
    return [Rate("counters", kind, int(counts.get(kind, 0) or 0), exposure) for kind in COUNTER_KINDS]
