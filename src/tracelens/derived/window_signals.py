"""Every signal that can be evidence for a slow window, measured inside the window and in the same
run before and after it (tests: derived.baseline).

Count signals, each per place (host pair, port, host) with its own exposure (the seconds its
source watched: the capture's span, the dump intervals, the host's log span):
- packets: loss-driven TCP retransmissions (tail-loss probes and spurious resends set apart,
  packets.flows), TCP retransmissions of any kind (what tshark counts), RoCE NAKs, PSN gaps and
  resends, CNPs and ECN-CE marks, RNR NAKs;
- counters: every error or congestion counter that moved during the run, per port, by the dump
  intervals that overlap the window against those that do not;
- NCCL: warnings and errors per host (hangs are TL411's).

Level signals, per step stream (one rank's engine in one log): compute time (forward, backward
without the all-reduce, the optimizer step), communication time (the all-reduce and ZeRO's
all-gather), and the wall time between step lines that the timers do not cover (data loading,
checkpoints, evaluation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracelens.derived import step_times
from tracelens.derived.baseline import Baseline, LevelComparison, RateComparison
from tracelens.derived.counters import kind_of
from tracelens.derived.events import _COUNTER_CAUSE, kernel_network_events
from tracelens.derived.flows import TCP_LOSS, TCP_PROBE, TCP_SPURIOUS
from tracelens.derived.imbalance import STEP_SHARE
from tracelens.derived.stream_groups import StreamGroups
from tracelens.prose import count, listing

if TYPE_CHECKING:
    from tracelens.derived import RunContext
    from tracelens.tables import RunTables

COARSE = timedelta(seconds=5)  # log lines with inferred times and counter dumps are placed this loosely
EVIDENCE_ROWS = 5

PACKET_SIGNALS: dict[str, list[tuple[str, str | None, tuple[str, ...]]]] = {  # what, cause, event kinds
    "tcp": [("loss-driven TCP retransmissions", "link", (TCP_LOSS,)),
            ("TCP retransmissions of any kind", None, (TCP_LOSS, TCP_PROBE, TCP_SPURIOUS))],
    "roce": [("RoCE NAKs, PSN gaps and resends", "link",
              ("NAK (PSN sequence error)", "PSN gap", "RoCE retransmission")),
             ("CNPs and ECN-CE marks", "congestion", ("CNP", "ECN-CE")),
             ("RNR NAKs", "receiver", ("RNR NAK",))],
}  # fmt: skip


@dataclass(frozen=True)
class Signal:
    """One signal in one place, inside a window against outside it."""

    source: str  # packets, counters, NCCL, steps
    cause: str | None  # what its rise would be a sign of (events.CAUSES); for steps and traces a level (LEVELS)
    what: str
    where: str
    rose: bool
    comparable: bool
    text: str  # both sides, e.g. "... 3.4/s in the window vs 4.8/s before and 4.1/s after: no rise"
    hosts: tuple[str, ...] = ()
    rank: int | None = None
    ratio: float | None = None  # inside over outside (rates or medians)
    change: float | None = None  # a level's inside minus outside (ms per step)
    port: str | None = None  # `mlx5_1:1` for a counter signal
    locating: bool = False  # the signal belongs to one place (a port's own physical errors), not to both ends of a path
    extent: tuple[datetime, datetime] | None = (
        None  # for a count that rose: when its events ran dense (see dense_extent)
    )
    evidence: tuple[dict, ...] = field(default=(), compare=False)  # file, line, frame, text, host


Spans = Sequence[tuple[datetime, datetime]]


def measure(ctx: RunContext, begin: datetime, end: datetime, apart: Spans = ()) -> list[Signal]:
    """Every signal of the run for the window [begin, end] (packet analysis, counter deltas, host
    names and the steps' signals from the run's context, computed once for every window). `apart`:
    the run's other slow stretches, left out of the counts' baseline: the baseline is the run's
    ordinary time, and a fault that slowed two stretches (random loss stalls some steps, not all)
    would otherwise be its own baseline."""
    names = ctx.host_names
    apart = [(lo, hi) for lo, hi in apart if hi < begin or lo > end]
    return [
        *_packet_signals(ctx, names, begin, end, apart),
        *_counter_signals(ctx, begin, end, apart),
        *_nccl_signals(ctx, begin, end, apart),
        *_kernel_signals(ctx, ctx.step_series, begin, end, apart),
        *ctx.step_signals(begin, end),
        *ctx.trace_signals(begin, end),  # profiler traces: each rank's exact arrivals (derived.traces)
    ]


# -- counts ---------------------------------------------------------------------------------------


def _seconds(lo: datetime, hi: datetime) -> float:
    return max((hi - lo).total_seconds(), 0.0)


def _exposure(
    span: tuple[datetime, datetime], begin: datetime, end: datetime, apart: Spans = ()
) -> tuple[float, float, float]:
    """Seconds of `span` before, inside and after the window, the `apart` spans (outside the window)
    left out."""
    first, last = span

    def watched(lo: datetime, hi: datetime) -> float:
        return _seconds(lo, hi) - sum(_seconds(max(lo, a), min(hi, b)) for a, b in apart)

    return (
        watched(first, min(last, begin)),
        _seconds(max(first, begin), min(last, end)),
        watched(max(first, end), last),
    )


def _within(times: pl.Series, spans: Spans) -> pl.Series:
    """Which of `times` fall in any of `spans`."""
    hit = pl.Series([False] * times.len(), dtype=pl.Boolean)
    for lo, hi in spans:
        hit = hit | times.is_between(lo, hi).fill_null(False)
    return hit


def rate_text(count: int, seconds: float) -> str:
    """`3.4/s`, `12/min` or `0/s`: a rate in the unit that shows it."""
    if seconds <= 0:
        return "n/a"
    rate = count / seconds
    if rate == 0 or rate >= 0.1:
        return f"{rate:.3g}/s"
    return f"{rate * 60:.2g}/min"


def count_signal(
    source: str,
    cause: str | None,
    what: str,
    where: str,
    times: pl.Series,
    span: tuple[datetime, datetime],
    begin: datetime,
    end: datetime,
    hosts: tuple[str, ...] = (),
    evidence: tuple[dict, ...] = (),
    watched: pl.Series | None = None,
    limits: Baseline = Baseline(),
    apart: Spans = (),
) -> Signal:
    """A count signal from event times (one event per time) and the span its source watched;
    `watched`: the times its source saw anything at all (a capture's packets), which say whether the
    events' stretch has edges the source could see (see blind_edge); `apart`: spans outside the
    window left out of the baseline (measure)."""
    t_before, t_in, t_after = _exposure(span, begin, end, apart)
    counted = times.filter(~_within(times, apart) | times.is_between(begin, end))  # the window's own are its own
    n_before = int((counted < begin).sum())
    n_after = int((counted > end).sum())
    n_in = counted.len() - n_before - n_after
    signal = _rate_signal(
        source, cause, what, where, (n_before, t_before), (n_in, t_in), (n_after, t_after), hosts, evidence, limits
    )
    if not signal.rose:
        return signal
    extent = dense_extent(times, begin, end)
    if (
        extent is not None
        and watched is not None
        and (blind_edge(watched, extent[0], -1) or blind_edge(watched, extent[1], 1))
    ):
        extent = None
    return replace(signal, extent=extent)


DENSE_REACH = timedelta(seconds=60)  # how far outside the slow steps the events may say the cause began or ended
DENSE_RESOLUTION_S = 1.0  # a stretch of events lasts at least this long (a burst of resends shares one millisecond)
SAMPLED_GAP = timedelta(seconds=2)  # a source silent this long was not watching (a capture sampled in bursts)
DENSE_MAX_EDGES = 1000  # candidate edges of the stretch (event times; quantiles of them beyond this many)


def dense_extent(times: pl.Series, begin: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    """From the first to the last event of the stretch, around [begin, end], where the events ran at a
    rate of their own: the time the cause's evidence says it lasted, which the slow steps only
    approximate (their edges blur on a noisy machine). The stretch is the maximum-likelihood epidemic
    change of a Poisson rate (one rate inside a stretch, another outside it, within DENSE_REACH of the
    window): it weighs the whole stretch's count against its length, so 4% loss on slow steps, whose
    resends come a few seconds apart, is one stretch rather than its densest few seconds."""
    near = times.filter(times.is_between(begin - DENSE_REACH, end + DENSE_REACH)).drop_nulls().sort()
    if near.len() == 0:
        return None
    origin = begin - DENSE_REACH
    at = ((near - origin).dt.total_microseconds() / 1e6).to_numpy().astype(float)
    span = (end + DENSE_REACH - origin).total_seconds()
    edges = np.unique(at if at.size <= DENSE_MAX_EDGES else np.quantile(at, np.linspace(0, 1, DENSE_MAX_EDGES)))
    i, j = np.triu_indices(edges.size)  # every stretch from edge i to edge j
    first, last = edges[i], edges[j]
    k = (np.searchsorted(at, last, side="right") - np.searchsorted(at, first, side="left")).astype(float)
    length = np.minimum(last - first + DENSE_RESOLUTION_S, span)
    rest, rest_length = at.size - k, np.maximum(span - length, DENSE_RESOLUTION_S)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.nan_to_num(rest * np.log(rest / rest_length))
        gain = k * np.log(k / length) + ratio
    window = ((begin - origin).total_seconds(), (end - origin).total_seconds())
    usable = (k / length > rest / rest_length) & (last >= window[0]) & (first <= window[1])
    if not usable.any():
        return None
    best = int(np.argmax(np.where(usable, gain, -np.inf)))
    inside = near.filter(
        near.is_between(origin + timedelta(seconds=float(first[best])), origin + timedelta(seconds=float(last[best])))
    )
    if inside.len() < 2 or (inside.max() - inside.min()) / (inside.len() - 1) > SAMPLED_GAP:
        # events this far apart (a dozen kernel records in minutes) place its edges no better than their spacing
        return None
    return inside.min(), inside.max()


# how long before a stretch's first event (after its last) the source must have watched
EDGE_LOOK = timedelta(seconds=5)


def blind_edge(watched: pl.Series, edge: datetime, side: int) -> bool:
    """Whether the source was blind just before (`side` -1) or after (+1) an edge of the events'
    stretch: a gap of SAMPLED_GAP or more in what it saw during EDGE_LOOK there. A capture sampled
    in bursts every few seconds puts the stretch's edges on its bursts, not where the cause began
    or ended (its first burst after the start), so such a stretch gives no window."""
    lo, hi = (edge - EDGE_LOOK, edge) if side < 0 else (edge, edge + EDGE_LOOK)
    seen = watched.filter(watched.is_between(lo, hi)).sort()
    edges = pl.concat([pl.Series([lo], dtype=watched.dtype), seen, pl.Series([hi], dtype=watched.dtype)])
    return bool(edges.diff().drop_nulls().max() >= SAMPLED_GAP)


def _rate_signal(
    source: str,
    cause: str | None,
    what: str,
    where: str,
    before: tuple[int, float],
    inside: tuple[int, float],
    after: tuple[int, float],
    hosts: tuple[str, ...],
    evidence: tuple[dict, ...] = (),
    limits: Baseline = Baseline(),
    **extra,
) -> Signal:
    test = RateComparison(inside[0], inside[1], before[0] + after[0], before[1] + after[1], limits)
    sides = [
        f"{rate_text(*before)} before" if before[1] > 0 else "",
        f"{rate_text(*after)} after" if after[1] > 0 else "",
    ]
    outside = " and ".join(s for s in sides if s) or "nothing outside it to compare with"
    if not test.comparable:
        outcome = "cannot tell (no time outside the window)" if inside[1] > 0 else "not seen in the window"
    elif test.rose:
        outcome = f"rose (at least {test.ratio_lower:.3g}x, {limits.confidence:.0%} confidence)"
    else:
        outcome = "no rise"
    text = f"{where}: {what} {rate_text(*inside)} in the window ({inside[0]:,}) vs {outside}: {outcome}"
    ratio = test.rate_in / test.rate_out if test.rate_out else None
    return Signal(
        source, cause, what, where, test.rose, test.comparable, text, hosts, ratio=ratio, evidence=evidence, **extra
    )


def _rows(frame: pl.DataFrame, begin: datetime, end: datetime, time: str = "ts") -> tuple[dict, ...]:
    inside = frame.filter(pl.col(time).is_between(begin, end)).head(EVIDENCE_ROWS)
    return tuple(inside.to_dicts())


def _packet_signals(
    ctx: RunContext, names: dict[str, str], begin: datetime, end: datetime, apart: Spans
) -> list[Signal]:
    spans = ctx.captures.filter(pl.col("first").is_not_null()).select("file", "first", "last")
    analysis = ctx.packets
    if spans.height == 0 or analysis is None:
        return []
    # what the captures saw around the window, as far as an edge of the events' stretch may look (blind_edge)
    reach = DENSE_REACH + EDGE_LOOK
    watched = (
        ctx.tables.frame("packets").lazy().select("ts").filter(pl.col("ts").is_between(begin - reach, end + reach))
    ).collect()["ts"]
    pair = pl.concat_list(pl.col("src").replace(names), pl.col("dst").replace(names)).list.sort().list.join(" ↔ ")
    flows = pl.concat(
        [
            analysis.tcp.select("file", "src", "dst", proto=pl.lit("tcp")),
            analysis.qps.select("file", "src", "dst", proto=pl.lit("roce")),
        ]
    ).with_columns(pair=pair)
    flows = flows.join(spans, on="file").group_by("proto", "pair").agg(pl.col("first").min(), pl.col("last").max())
    events = analysis.events.with_columns(pair=pair, text=pl.format("{}: {}", "kind", "flow"))
    signals = []
    bins = ctx.throughput_bins.with_columns(
        pair=pl.concat_list(pl.col("a").replace(names), pl.col("b").replace(names)).list.sort().list.join(" ↔ "),
        a=pl.col("a").replace(names),
        b=pl.col("b").replace(names),
    )
    for row in flows.sort("proto", "pair").iter_rows(named=True):
        hosts = tuple(row["pair"].split(" ↔ "))
        if row["proto"] == "tcp" or not flows.filter(pl.col("pair") == row["pair"], pl.col("proto") == "tcp").height:
            mine = bins.filter(pl.col("pair") == row["pair"])
            found = (
                _silence_signal(mine, row["pair"], hosts, begin, end),
                _ceiling_signal(mine, row["pair"], hosts, begin, end),
            )
            signals += [s for s in found if s is not None]
        for what, cause, kinds in PACKET_SIGNALS[row["proto"]]:
            mine = events.filter(pl.col("pair") == row["pair"], pl.col("kind").is_in(kinds))
            rows = _rows(mine.select("file", "frame", "text", "ts"), begin, end)
            signals.append(
                count_signal(
                    "packets",
                    cause,
                    what,
                    row["pair"],
                    mine["ts"],
                    (row["first"], row["last"]),
                    begin,
                    end,
                    hosts,
                    rows,
                    watched=watched,
                    limits=ctx.baseline,
                    apart=apart,
                )
            )
    return signals


THROUGHPUT_BIN = timedelta(milliseconds=10)  # short enough that a transfer's burst fills a bin at line rate
CEILING_QUANTILE = 0.9  # the busy bins' rate that stands for the path's peak
CEILING_FALL = 0.5  # the window's peak rate at this share of the peak outside or less: a ceiling
CEILING_MIN_BINS = 20


def throughput_bins(tables: RunTables) -> pl.DataFrame:
    """Bytes per THROUGHPUT_BIN from each address to each other (`a` to `b`), over every capture:
    what _ceiling_signal reads, computed once per run."""
    return (
        tables.scan("packets")
        .filter(pl.col("ts").is_not_null(), pl.col("src").is_not_null(), pl.col("dst").is_not_null())
        .group_by(
            pl.col("src").cast(pl.String).alias("a"),
            pl.col("dst").cast(pl.String).alias("b"),
            pl.col("ts").dt.truncate(THROUGHPUT_BIN).alias("bin"),
        )
        .agg(pl.col("length").cast(pl.Int64).sum().alias("bytes"))
        .sort("a", "b", "bin")
        .collect(engine="streaming")
    )


def _ceiling_signal(
    bins: pl.DataFrame, pair: str, hosts: tuple[str, ...], begin: datetime, end: datetime
) -> Signal | None:
    """Whether the path between a pair of hosts carried less at its busiest in the window than outside
    it, in either direction: the CEILING_QUANTILE of its busy bins' rates. A rate limit or a congested
    path caps every burst past it; random loss stalls transfers (the sender waits for a timeout) but
    what it sends between stalls still goes at the path's full rate, so its busy bins stay as fast.
    A capture on one side sees the cap only in the direction that crossed it before being captured."""
    seconds = THROUGHPUT_BIN.total_seconds()
    found = []
    for (a, b), direction in bins.group_by("a", "b", maintain_order=True):
        inside = direction.filter(pl.col("bin").is_between(begin, end))["bytes"]
        outside = direction.filter(~pl.col("bin").is_between(begin, end))["bytes"]
        if inside.len() < CEILING_MIN_BINS or outside.len() < CEILING_MIN_BINS:
            continue
        peak_in = float(inside.quantile(CEILING_QUANTILE) or 0.0) / seconds
        peak_out = float(outside.quantile(CEILING_QUANTILE) or 0.0) / seconds
        if peak_out > 0:
            found.append((peak_in / peak_out, peak_in, peak_out, f"{a} → {b}"))
    if not found:
        return None
    ratio, peak_in, peak_out, way = min(found)
    capped = ratio <= CEILING_FALL
    outcome = "a ceiling: every burst was capped" if capped else "no ceiling (bursts as fast as outside)"
    text = (
        f"{pair}: the path's peak rate ({way}, busiest {1 - CEILING_QUANTILE:.0%} of "
        f"{THROUGHPUT_BIN.total_seconds() * 1000:.0f} ms bins) {_rate(peak_in)} in the window vs {_rate(peak_out)} "
        f"outside it ({ratio:.2f}x): {outcome}"
    )
    return Signal("packets", "ceiling", "peak rate", pair, capped, True, text, hosts, ratio=ratio)


SILENCE_MIN = timedelta(seconds=1)  # a direction silent this long, while the other still sent, is no pause
SILENCE_RATIO = 5.0  # ... and this many times its usual longest silence outside the window:
SILENCE_QUANTILE = 0.99  # this quantile of its silences (a job's start-up idles for seconds once)
SILENCE_RETRIES = 3  # bins the other direction sent into the silence: a sender's timeouts back off 0.2, 0.4, 0.8 s


def _silence_signal(
    bins: pl.DataFrame, pair: str, hosts: tuple[str, ...], begin: datetime, end: datetime
) -> Signal | None:
    """Whether one direction of a pair fell silent in the window while the other kept sending: a dead
    link (a blackout, a flapping port) stops everything that crosses it, and the sender retransmits
    into the silence with a growing backoff. A pause of the job stops both directions."""
    found = []
    for (a, b), direction in bins.group_by("a", "b", maintain_order=True):
        times = direction["bin"].sort()
        reverse = bins.filter(pl.col("a") == b, pl.col("b") == a)["bin"]
        gaps = pl.DataFrame({"from": times.shift(1), "to": times}).drop_nulls()
        inside = gaps.filter(pl.col("to") > begin, pl.col("from") < end)
        outside = gaps.filter((pl.col("to") <= begin) | (pl.col("from") >= end))
        if inside.height == 0 or outside.height < CEILING_MIN_BINS:
            continue
        longest = inside.with_columns(gap=pl.col("to") - pl.col("from")).sort("gap").row(-1, named=True)
        usual = (outside["to"] - outside["from"]).quantile(SILENCE_QUANTILE, "higher")
        answered = reverse.is_between(longest["from"], longest["to"], closed="none").sum()
        found.append((longest["gap"], usual, answered, f"{a} → {b}", longest["from"]))
    if not found:
        return None
    gap, usual, answered, way, since = max(found)
    dead = gap >= SILENCE_MIN and gap >= SILENCE_RATIO * usual and answered >= SILENCE_RETRIES
    outcome = "the link was dead" if dead else "no silence"
    text = (
        f"{pair}: {way} sent nothing for {gap.total_seconds():.1f} s from {since:%H:%M:%S} while the other "
        f"direction sent {answered} bins of packets (its silences outside the window: up to "
        f"{usual.total_seconds():.2f} s): {outcome}"
    )
    return Signal("packets", "link", "silence", pair, dead, True, text, hosts, ratio=gap / usual if usual else None)


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.3g} Mbit/s"


def _counter_signals(ctx: RunContext, begin: datetime, end: datetime, apart: Spans) -> list[Signal]:
    deltas = ctx.counter_deltas.filter(pl.col("start").is_not_null(), pl.col("interval_s").is_not_null())
    deltas = deltas.with_columns(kind=kind_of(pl.col("counter"))).filter(pl.col("kind").is_in(list(_COUNTER_CAUSE)))
    moved = deltas.filter((pl.col("delta").fill_null(1) > 0).any().over("host", "node", "port", "counter"))
    if deltas.height == 0:
        return []
    lo, hi = begin - COARSE, end + COARSE
    place = pl.format("{} {} port {}", "host", pl.coalesce("ca", "node"), "port")
    elsewhere = pl.lit(False)
    for a, b in apart:  # a dump interval that saw another slow stretch is no baseline
        elsewhere = elsewhere | ((pl.col("start") < b) & (pl.col("end") > a))
    side = (
        pl.when(elsewhere & ((pl.col("end") <= lo) | (pl.col("start") >= hi)))
        .then(pl.lit("apart"))
        .when(pl.col("end") <= lo)
        .then(pl.lit("before"))
        .when(pl.col("start") >= hi)
        .then(pl.lit("after"))
        .otherwise(pl.lit("inside"))
    )
    per_side = (
        moved.with_columns(place=place, side=side, n=pl.col("delta").fill_null(0))
        .with_columns(port_id=pl.format("{}:{}", pl.coalesce("ca", "node"), "port"))
        .group_by("host", "place", "port_id", "kind", "counter", "side")
        .agg(
            pl.col("n").sum(),
            pl.col("interval_s").sum(),
            rows=pl.struct("file", "line", "host", text=pl.format("{}: {} (was {})", "counter", "after", "before")),
        )
    )
    signals = []
    for (host, place, port, kind, counter), sides in per_side.sort("host", "place", "counter").group_by(
        "host", "place", "port_id", "kind", "counter", maintain_order=True
    ):
        got = {r["side"]: r for r in sides.iter_rows(named=True)}
        part = {
            s: (int(got[s]["n"]), float(got[s]["interval_s"])) if s in got else (0, 0.0)
            for s in ("before", "inside", "after")
        }
        rows = tuple(got["inside"]["rows"][:EVIDENCE_ROWS]) if "inside" in got else ()
        signals.append(
            _rate_signal(
                "counters",
                _COUNTER_CAUSE[kind],
                counter,
                place,
                part["before"],
                part["inside"],
                part["after"],
                (host,),
                rows,
                ctx.baseline,
                port=port,
                locating=kind != "RDMA errors",
            )
        )
    still = deltas.select("host", "node", "port").unique().height
    if still:
        signals.append(
            Signal(
                "counters",
                None,
                "error and congestion counters",
                "every port",
                False,
                True,
                f"error and congestion counters of {count(still, 'port')}: "
                + ("no other counter moved during the run" if signals else "none moved during the run"),
            )
        )
    return signals


def _nccl_signals(ctx: RunContext, begin: datetime, end: datetime, apart: Spans) -> list[Signal]:
    spans = (
        ctx.scan("nccl_events")
        .filter(pl.col("ts").is_not_null(), pl.col("host").is_not_null())
        .group_by("host")
        .agg(first=pl.col("ts").min(), last=pl.col("ts").max())
        .collect(engine="streaming")
    )
    if spans.height == 0:
        return []
    stall = ["watchdog_timeout", "blocking_wait_timeout", "watchdog_exception", "watchdog_abort", "watchdog_stuck"]
    errors = ctx["nccl_errors"].filter(~pl.col("kind").is_in(stall), pl.col("ts").is_not_null())
    signals = []
    for row in spans.sort("host").iter_rows(named=True):
        mine = errors.filter(pl.col("host") == row["host"])
        cause = "link" if mine["kind"].str.starts_with("ib_").any() else "failure"
        rows = _rows(mine.select("file", "line", "host", "ts", text="message"), begin - COARSE, end + COARSE)
        signals.append(
            count_signal(
                "NCCL",
                cause,
                "NCCL warnings and errors",
                row["host"],
                mine["ts"],
                (row["first"], row["last"]),
                begin - COARSE,
                end + COARSE,
                (row["host"],),
                rows,
                limits=ctx.baseline,
                apart=apart,
            )
        )
    return signals


def _kernel_signals(
    ctx: RunContext, series: StreamGroups, begin: datetime, end: datetime, apart: Spans
) -> list[Signal]:
    """Per host and cause, the NIC records of its kernel log (link down, transmit timeouts ...); the
    kernel logs all along, so the exposure is the run's span (its steps and the records themselves)."""
    events = kernel_network_events(ctx.tables)
    if events.height == 0:
        return []
    span = series.scan().select(pl.col("ts").min(), pl.col("ts").max().alias("last"))
    first, last = span.collect(engine="streaming").row(0)
    # the steps' span and the records' (python datetimes), the side that has none left out
    span = (
        min(t for t in (first, events["lo"].min()) if t is not None),
        max(t for t in (last, events["lo"].max()) if t is not None),
    )
    signals = []
    for (host, cause), mine in events.sort("lo").group_by("host", "cause", maintain_order=True):
        kinds = listing(sorted(set(mine["what"].to_list())))
        rows = _rows(mine.select("file", "line", "host", "text", ts="lo"), begin - COARSE, end + COARSE)
        signal = count_signal(
            "kernel",
            cause,
            f"kernel records ({kinds})",
            host,
            mine["lo"],
            span,
            begin - COARSE,
            end + COARSE,
            (host,),
            rows,
            limits=ctx.baseline,
            apart=apart,
        )
        inside = int(mine["lo"].is_between(begin - COARSE, end + COARSE).sum())
        signals.append(
            replace(
                signal,
                text=f"{host}'s kernel logged {count(inside, 'record')} of {kinds} in the window; "
                + signal.text.split(": ", 1)[1],
                locating=True,
            )
        )
    return signals


# -- levels ---------------------------------------------------------------------------------------


def forward_waits(tables: RunTables) -> bool:
    """Whether the job's forward holds collectives: ZeRO-3 all-gathers each layer's parameters in it."""
    keys = ["zero_optimization.stage", "zero_optimization_stage"]
    stage = pl.col("value").str.strip_chars().cast(pl.Float64, strict=False)
    rows = tables.scan("deepspeed_settings").filter(pl.col("key").is_in(keys)).select(stage).collect()
    return bool((rows["value"] == 3).any())


def world_size(tables: RunTables) -> int:
    """How many ranks the job had, as far as its inputs tell: DeepSpeed's `world_size` setting,
    NCCL's `nranks`, a profiler trace's world size, or the ranks the step and comms logs name. A
    verdict from fewer ranks' step timers than this reads a partial view (findings.causes)."""
    number = pl.col("value").str.strip_chars().cast(pl.Int64, strict=False)
    queries = [
        tables.scan("deepspeed_settings").filter(pl.col("key") == "world_size").select(number.max()),
        tables.scan("nccl_comms").select(pl.col("nranks").max()),
        tables.scan("trace_ranks").select(pl.col("world_size").max()),
        *(tables.scan(name).select(pl.col("rank").drop_nulls().n_unique()) for name in ("steps", "comm_ops")),
    ]
    sizes = [q.collect().item() or 0 for q in queries]
    return max(sizes)


def collective_times(tables: RunTables) -> pl.DataFrame:
    """Per file, rank and step, from the DeepSpeed comms logger's per-op lines (each printed when its
    call returns, and placed in the step whose line follows it):

    - coll_ms: the time the rank spent inside collective calls: each call's time, differenced where
      the logger prints a running total per op name (DeepSpeed 0.19 does: a series that never falls);
    - late_ms: how much later than the ranks' median it returned from its calls, summed over the
      step's calls (the k-th call of each op name on every rank is one collective). A blocking call
      returns on every rank at once; an asynchronous one (ZeRO-3's prefetched all-gathers) returns
      when it was issued, so a rank that arrives last at the collectives, once by a lot or at every
      call by a little, returns late by what the others waited for it."""
    empty = {"file": pl.String, "rank": pl.Int64, "step": pl.Int64, "coll_ms": pl.Float64, "late_ms": pl.Float64}
    ops = (
        tables.scan("comm_ops")
        .filter(pl.col("kind") == "op", pl.col("rank").is_not_null(), pl.col("total_ms").is_not_null())
        .select("file", "rank", "line", "ts", "op", "total_ms")
        .collect()
    )
    lines = (
        tables.scan("steps")
        .filter(pl.col("step").is_not_null(), pl.col("rank").is_not_null())
        .select("file", "rank", "line", "step")
        .collect()
    )
    if ops.height == 0 or lines.height == 0:
        return pl.DataFrame(schema=empty)
    per_op = ["file", "rank", "op"]
    rise = pl.col("total_ms").diff().over(per_op, order_by="line")
    running = (rise.is_null() | (rise >= 0)).all().over(per_op) & (pl.len().over(per_op) >= 3)
    placed = (
        ops.sort("file", "rank", "line")
        .join_asof(
            lines.sort("file", "rank", "line"),
            on="line",
            by=["file", "rank"],
            strategy="forward",
            check_sortedness=False,
        )
        .filter(pl.col("step").is_not_null())
        .with_columns(took=pl.when(running).then(rise.fill_null(pl.col("total_ms"))).otherwise("total_ms"))
        .with_columns(call=pl.int_range(pl.len()).over("file", "rank", "step", "op"))
    )
    one = ["step", "op", "call"]  # one collective: the same call on every rank
    at = pl.col("ts").dt.epoch("us") / 1000
    placed = placed.with_columns(late=pl.when(pl.len().over(one) >= 2).then(at - at.median().over(one)))
    return placed.group_by("file", "rank", "step").agg(coll_ms=pl.col("took").sum(), late_ms=pl.col("late").sum())


def step_levels(series: pl.DataFrame, forward_waits: bool = False) -> pl.DataFrame:
    """Per step row, the parts of the timing model (docs/timing-model.md):

    - own_ms: the rank's own work, the timed phases that wait for no other rank: forward and the
      optimizer's local step. Under ZeRO-3 (`forward_waits`) forward all-gathers the parameters, so
      it holds waiting and only the optimizer step is left (the comms logger's times do not split
      it: an asynchronous all-gather's wait is outside its call);
    - wait_ms: the rest of the timed step, the phases that hold a collective and so the wait for the
      last rank to arrive: backward (its gradient all-reduce or reduce-scatter overlaps it), ZeRO's
      all-gather, and forward under ZeRO-3;
    - comm_ms: the collectives' own timers (`bwd_allreduce`, `optimizer_allgather`), a part of wait_ms;
    - coll_ms: the time inside collectives by the comms logger (collective_times), null without it;
    - ahead_ms: forward divided by the job's pace at this step (peer_pace, imbalance.peers_pace): what
      the whole job shares (a busy machine, the network under ZeRO-3) divided out, so that a rank whose
      forward rose alone shows it even where the job's pace moved too; null without peers' forwards;
    - between_ms: the wall time between this step line and the one before it that the timers do not
      account for (data loading, checkpoints, evaluation); where the log prints a time only every few
      steps, the mean over the steps between two printed times, which is all those times measure."""
    consecutive = pl.col("step") - pl.col("step").shift().over(step_times.STREAM) == 1
    timers = step_times.TIMERS_MS
    optimizer = pl.col("optimizer_step_ms").fill_null(0.0)
    own = optimizer if forward_waits else pl.col("fwd_ms") + optimizer
    between = pl.when(consecutive).then(pl.col("gap_ms") - pl.coalesce("iter_ms", timers).fill_null(0.0))
    printed = pl.col("ts_printed").shift(1, fill_value=False).cum_sum().over(step_times.STREAM)
    return (
        series.with_columns(
            own_ms=pl.when(timers.is_not_null()).then(own),
            wait_ms=timers - own,
            ahead_ms=pl.col("fwd_ms") / pl.col("peer_pace"),
            between_ms=between,
            _printed=printed,
        )
        .with_columns(pl.col("between_ms").mean().over(*step_times.STREAM, "_printed").clip(lower_bound=0))
        .drop("_printed")
    )


MEDIAN_MIN_STEPS = 3  # a window's median level needs this many steps in it


def _level(inside: pl.Series, outside: pl.Series, limits: Baseline, mean: bool = False) -> LevelComparison:
    """Medians inside and outside; `mean`: the mean inside against the mean outside, for a time where
    one long stretch matters in full (a 25 s checkpoint pause between two steps)."""
    inside, outside = inside.drop_nulls(), outside.drop_nulls()
    med_out = outside.median() if outside.len() else None
    spread = float((outside - med_out).abs().median() * 1.4826) if med_out is not None else 0.0
    if mean:
        return LevelComparison(
            inside.mean() if inside.len() else None,
            outside.mean() if outside.len() else None,
            spread,
            inside.len(),
            outside.len(),
            limits=limits,
        )
    median = LevelComparison(
        inside.median() if inside.len() else None,
        med_out,
        spread,
        inside.len(),
        outside.len(),
        MEDIAN_MIN_STEPS,
        limits,
    )
    if median.comparable or not inside.len():
        return median
    # too few steps for a median (a stall is one step): the level stayed when even the slowest step did
    slowest = LevelComparison(inside.max(), med_out, spread, inside.len(), outside.len(), 1, limits)
    return median if slowest.rose else slowest


LEVELS = {
    "own_ms": ("own", "own work (forward and optimizer step)"),
    "wait_ms": ("wait", "time in phases that wait for the other ranks (backward with its all-reduce, all-gathers)"),
    "comm_ms": ("comm", "collective time (all-reduce and all-gather timers)"),
    "coll_ms": ("coll", "time inside collectives (the comms logger's per-op times)"),
    "late_ms": ("late", "return from its collective calls after the ranks' median, summed (comms logger)"),
    "ahead_ms": ("ahead", "forward at the job's usual pace (its forward over the ranks' usual forward at each step)"),
    "between_ms": ("between", "time between steps outside the timers"),
    "time_ms": ("step", "step time"),
}
# levels judged by their mean: the time lost to waiting and stalls adds up over the steps (a lost
# packet stalls one step in five by a timeout), while a rank's own work is a level its median shows
MEAN_LEVELS = ("wait", "comm", "coll", "late", "between")
OWN_UNDER_ZERO3 = "own work (optimizer step; under ZeRO-3 forward all-gathers the parameters)"


def level_extent(
    stream: pl.DataFrame, column: str, begin: datetime, end: datetime, limits: Baseline = Baseline()
) -> tuple[datetime, datetime] | None:
    """When one stream's level (`column`, per step; `start` and `ts` each step's wall edges) ran high
    around [begin, end]: of the runs of steps within DENSE_REACH of it that overlap it, the one whose
    mean stands highest above the steps around it, weighed by both sides' sizes (the epidemic
    change-point statistic: the run that best splits the steps into two levels, k (n - k) / n times
    the squared difference of the means). One 25 s pause between two steps is its own run; a
    minute of slower compute is its minute, without the busy machine's noise around it."""
    near = stream.filter(
        pl.col("ts") >= begin - DENSE_REACH, pl.col("start") <= end + DENSE_REACH, pl.col(column).is_not_null()
    )
    n = near.height
    overlapping = ((near["ts"] >= begin) & (near["start"] <= end)).to_numpy().nonzero()[0]
    if n < 3 or overlapping.size == 0:
        return None
    values = near[column].to_numpy().astype(float)
    best = _best_run(values, int(overlapping[0]), int(overlapping[-1]))
    if best is None:
        return None
    first, last = _widened(values, *best, limits)
    return near["start"][first], near["ts"][last]


EXTENT_STEPS = 1_000  # past this many steps near a window, long runs are searched over bins of steps first


def _best_run(values: np.ndarray, first: int, last: int) -> tuple[int, int] | None:
    """The run of steps i..j, overlapping steps first..last, with the highest split score (level_extent).

    Every run of n steps is n^2 / 2 of them (20,000 steps: 3.5 s and 1.6 GB). Past EXTENT_STEPS, the
    runs up to two bins long are scored step by step (a bin would dilute a one-step pause), the
    longer ones as runs of bins whose best has its edges found step by step in the bins around them."""
    n = values.size
    if n <= EXTENT_STEPS:
        best = _best_of(values, np.ones(n), *_overlapping_runs(n, first, last), first, last)
        return best[1:] if best else None
    width = -(-n // EXTENT_STEPS)
    found = [_best_of(values, np.ones(n), np.arange(n - d), np.arange(d, n), first, last) for d in range(2 * width)]
    edges = np.arange(0, n, width)
    bins = (np.add.reduceat(values, edges), np.diff(np.append(edges, n)), *np.triu_indices(edges.size))
    if coarse := _best_of(*bins, first // width, last // width):
        starts = np.arange(max(coarse[1] - 1, 0) * width, min((coarse[1] + 1) * width, n))
        ends = np.arange(coarse[2] * width, min((coarse[2] + 2) * width, n))
        i, j = (grid.ravel() for grid in np.meshgrid(starts, ends, indexing="ij"))
        found.append(_best_of(values, np.ones(n), i[i <= j], j[i <= j], first, last))
    scored = [(-score, i, j) for score, i, j in filter(None, found)]
    return min(scored)[1:] if scored else None  # the highest score, then the earliest run


def _overlapping_runs(n: int, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """The runs i..j of n steps that overlap steps first..last, in the order of np.triu_indices(n)
    (i, then j, ascending): only those can score, and a window's runs are a few of all n^2 / 2."""
    rows = np.arange(last + 1)
    starts = np.maximum(rows, first)  # j from there to the last step
    lengths = n - starts
    offsets = np.cumsum(lengths) - lengths  # where each i's runs begin in the output
    return np.repeat(rows, lengths), np.arange(lengths.sum()) - np.repeat(offsets - starts, lengths)


def _best_of(
    sums: np.ndarray, counts: np.ndarray, i: np.ndarray, j: np.ndarray, first: int, last: int
) -> tuple[float, int, int] | None:
    """Of the runs i..j (of cells holding `counts` steps summing to `sums`) that overlap cells first..last
    and stand above the rest, the one with the highest score k (n - k) / n (mean inside - mean outside)^2:
    (score, i, j)."""
    total, n = sums.sum(), counts.sum()
    cum, steps = np.concatenate([[0.0], np.cumsum(sums)]), np.concatenate([[0], np.cumsum(counts)])
    inner, k = cum[j + 1] - cum[i], steps[j + 1] - steps[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = inner / k - (total - inner) / (n - k)
        score = np.where((k < n) & (gap > 0) & (i <= last) & (j >= first), k * (n - k) / n * gap**2, -1.0)
    best = int(np.argmax(score)) if score.size else 0
    return (float(score[best]), int(i[best]), int(j[best])) if score.size and score[best] > 0 else None


EDGE_STEPS = 5  # a run's edge moves out over steps whose median of this many still rose


def _widened(values: np.ndarray, first: int, last: int, limits: Baseline) -> tuple[int, int]:
    """The run first..last moved out over its ramps: while the EDGE_STEPS steps just outside it still
    rose above the steps around the run (LevelComparison's test, on the median of a few steps: its
    robust standard deviation shrinks by 1.25 / sqrt(EDGE_STEPS)). Contention that builds up over a
    few seconds (2x, then 5x) began when the 2x did."""
    outside = np.concatenate([values[:first], values[last + 1 :]])
    if outside.size < 3:
        return first, last
    level = float(np.median(outside))
    spread = float(np.median(np.abs(outside - level))) * 1.4826 * 1.2533 / np.sqrt(EDGE_STEPS)

    def rose(block: np.ndarray) -> bool:
        return (
            block.size == EDGE_STEPS
            and LevelComparison(float(np.median(block)), level, spread, EDGE_STEPS, outside.size, 1, limits).rose
        )

    while first > 0 and rose(values[max(first - EDGE_STEPS, 0) : first]):
        first -= 1
    while last < values.size - 1 and rose(values[last + 1 : last + 1 + EDGE_STEPS]):
        last += 1
    return first, last


# what the level signals read of a step series
LEVEL_COLUMNS = [
    *step_times.STREAM,
    "step",
    "line",
    "ts",
    "ts_printed",
    "gap_ms",
    "message",
    "time_ms",
    "comm_ms",
    "iter_ms",
    "fwd_ms",
    "bwd_ms",
]
LEVEL_COLUMNS += ["bwd_inner_ms", "bwd_allreduce_ms", "step_ms", "optimizer_step_ms", "optimizer_allgather_ms"]


def step_signals(
    series: StreamGroups,
    begin: datetime,
    end: datetime,
    limits: Baseline = Baseline(),
    forward_waits: bool = False,
    collectives: pl.DataFrame | None = None,
    peers: pl.DataFrame | None = None,
) -> list[Signal]:
    """Per rank (stream), the parts of its steps (step_levels) inside the window against outside it,
    judged by `limits` (the RunContext's baseline); `forward_waits`: the job runs ZeRO-3, whose
    forward all-gathers the parameters; `collectives`: collective_times. The series is read a group
    of whole streams at a time."""
    coll = collectives if collectives is not None and collectives.height else None
    pace = peers.select("engine", "step", "peer_pace") if peers is not None and peers.height else None
    return [
        s
        for frame in series.frames(LEVEL_COLUMNS)
        for s in _stream_signals(_joined(frame, coll, pace), begin, end, limits, forward_waits)
    ]


def _joined(frame: pl.DataFrame, collectives: pl.DataFrame | None, pace: pl.DataFrame | None) -> pl.DataFrame:
    """The frame with the comms logger's times per step (coll_ms, late_ms) and the job's pace (peer_pace)."""
    if collectives is None:
        frame = frame.with_columns(coll_ms=pl.lit(None, pl.Float64), late_ms=pl.lit(None, pl.Float64))
    else:
        frame = frame.join(collectives, on=["file", "rank", "step"], how="left", maintain_order="left")
    if pace is None:
        return frame.with_columns(peer_pace=pl.lit(None, pl.Float64))
    return frame.join(pace, on=["engine", "step"], how="left", maintain_order="left")


def _stream_signals(
    series: pl.DataFrame, begin: datetime, end: datetime, limits: Baseline, forward_waits: bool
) -> list[Signal]:
    timed = step_levels(series, forward_waits).with_columns(start=pl.col("ts").shift().over(step_times.STREAM))
    timed = timed.filter(
        pl.col("ts").is_not_null(), pl.int_range(pl.len()).over(step_times.STREAM) >= step_times.WARMUP_ROWS
    )
    signals = []
    for (file, host, rank, _engine), stream in timed.group_by(step_times.STREAM, maintain_order=True):
        inside = stream.filter(pl.col("ts").is_between(begin, end))
        outside = stream.filter(~pl.col("ts").is_between(begin, end))
        who = (f"rank {rank}" if rank is not None and rank >= 0 else file) + (f" ({host})" if host else "")
        for column, (cause, what) in LEVELS.items():
            level = _level(inside[column], outside[column], limits, mean=cause in MEAN_LEVELS)
            if level.inside is None or level.outside is None:
                continue
            if cause == "own" and forward_waits:
                what = OWN_UNDER_ZERO3
            ratio, rose = level.ratio, level.rose
            if cause == "ahead":  # a rise against the others that the job's step would not notice is not one
                rose = rose and level.inside - level.outside >= STEP_SHARE * (inside["time_ms"].median() or 0.0)
            outcome = "rose" if rose else "fell" if level.fell else "no rise"
            how = f"{ratio:.2f}x" if ratio is not None else "n/a"
            text = (
                f"{who}: {what} {level.inside:.0f} ms per step{' on average' if cause in MEAN_LEVELS else ''} in the "
                f"window vs {level.outside:.0f} ms outside it ({how}): {outcome}"
            )
            if cause in ("own", "wait"):
                text += _phases(inside, outside)
            evidence = tuple(inside.select("file", "line", "host", text="message").head(2).to_dicts())
            signals.append(
                Signal(
                    "steps",
                    cause,
                    what,
                    who,
                    rose,
                    level.comparable,
                    text,
                    (host,) if host else (),
                    rank=rank if rank is not None and rank >= 0 else None,
                    ratio=ratio,
                    change=level.inside - level.outside,
                    evidence=evidence,
                    extent=level_extent(stream, column, begin, end, limits) if rose else None,
                )
            )
        if (pace := _pace_signal(who, host, rank, inside["comm_ms"], outside["comm_ms"])) is not None:
            signals.append(pace)
    return signals


PACE_RISE = 2.0  # the lower quartile of a rank's communication time inside, over its median outside
PACE_MIN_STEPS = 5


def _pace_signal(who: str, host: str | None, rank: int | None, inside: pl.Series, outside: pl.Series) -> Signal | None:
    """Whether every transfer slowed, not just some: the lower quartile of the rank's communication
    time in the window at PACE_RISE x its median outside or more. A link that carries less than the
    job asks (a rate limit, a congested or downshifted path) slows every step's all-reduce to a
    steady pace, so even the window's fast steps are slow; random loss slows the steps that lost a
    segment and leaves the rest (lab-loss: the lower quartile fell to 0.5x while retransmissions
    tripled). A straggler's peers wait every step too: findings.causes weighs it with own work."""
    inside, outside = inside.drop_nulls(), outside.drop_nulls()
    if inside.len() < PACE_MIN_STEPS or outside.len() < 3 or not outside.median():
        return None
    floor, usual = float(inside.quantile(0.25)), float(outside.median())
    rose = floor >= PACE_RISE * usual
    outcome = "every transfer slowed" if rose else "no rise (only some steps' transfers slowed, if any)"
    text = (
        f"{who}: communication time of the window's faster steps (lower quartile) {floor:.0f} ms vs {usual:.0f} ms "
        f"per step outside it ({floor / usual:.2f}x): {outcome}"
    )
    return Signal(
        "steps",
        "pace",
        "communication pace",
        who,
        rose,
        True,
        text,
        (host,) if host else (),
        rank=rank if rank is not None and rank >= 0 else None,
        ratio=floor / usual,
    )


PHASES = {"fwd_ms": "forward", "bwd_ms": "backward", "optimizer_step_ms": "optimizer step", "step_ms": "step"}


def _phases(inside: pl.DataFrame, outside: pl.DataFrame) -> str:
    """` (forward 3.1x, backward 1.0x ...)`: how each timed phase changed."""
    parts = []
    for column, name in PHASES.items():
        a, b = inside[column].drop_nulls().median(), outside[column].drop_nulls().median()
        if a is not None and b:
            parts.append(f"{name} {a / b:.1f}x")
    return f" ({', '.join(parts)})" if parts else ""
