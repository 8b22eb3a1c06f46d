"""TL410-TL412: evidence from every source joined by time into a root cause.

Each source alone says something; the answer comes from their overlap. These rules read
the tables after the timeline has put every row on one UTC axis (tracelens.timeline), and
the network events of every source (tracelens.events).

Ranking: a cause is a (cause, host) pair; an event supports the hosts at both of its ends
(a NAK names both ends of a QP, an IB completion error its host and its peer, a counter its
own port). Pairs are ranked by the number of independent sources that support them (NCCL
lines, port counters, packets, and the step timers when the all-reduce surged while compute
stayed flat), then by whether some of the evidence is the host's alone (its own port's
counters, its own choice of transport: a NAK or a completion error names both ends of a
path, a symbol error the bad port), then by weight: log10(1 + count) per kind of event,
scaled by how much of its dump interval the window fills and by its strength (events.py).
The hosts the evidence cannot tell apart from the first are named together. A finding's `score` is that number of
sources plus the window's share of the run's step time, so `analyze` puts the joined root
cause with the most evidence first, ahead of the single-source findings (score 0) that
report its symptoms one by one.

Note for the scenario fixtures (tracelens.synth.scenarios, expected.json "top"): TL410 is the
top finding of a run with a slow window caused in the network or by a straggler, naming the
host (and `mlx5_1:1` ports where counters show them) and the window of slow steps, from the
start of the first slow step to the end of the last; TL411 is the top of a hang, naming the
rank that stopped first and the window from the hung collective's start to the last watchdog
report; TL412 is the top of a socket fallback measured against IB steps of the same job (TL410
leaves windows whose best cause is the socket transport to it). The cost of a socket fallback
is added by TL412 rather than by TL101, so that TL101 stays a pure configuration finding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from tracelens import steps as timing
from tracelens.events import CAUSES, network_events
from tracelens.findings import Evidence, Finding, Severity, Verdict
from tracelens.hostsignals import utilisation_phrase
from tracelens.hangs import first_stopped
from tracelens.prose import count, duration, listing, number, some
from tracelens.rules import rule
from tracelens.rules.evidence import step_evidence
from tracelens.rules.steps import COMM_SURGE, COMPUTE_FLAT, MAX_WINDOWS, MIN_COST_SHARE
from tracelens.tables import RunTables
from tracelens.timeline import LOG_TABLES

MARGIN = timedelta(seconds=5)  # events this close to a window still belong to it (log and dump times are coarse)
STRAGGLER_COMPUTE = 1.3  # a stream whose compute grew this much in a window while the others' did not
NETWORK = ("link", "congestion", "socket")
GAP_MIN_S = 120.0  # a host silent this long ...
GAP_FACTOR = 20.0  # ... and this many times its usual interval between lines has stalled
FALLBACK_SLOWER = 1.2  # steps on sockets this much slower than the job's IB steps
MIN_STEPS = 5  # steps on each side of a comparison
MAX_PHRASES = 4

COLLECT = {
    "NCCL": "NCCL lines with times (NCCL 2.26+: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "
    "NCCL_DEBUG_TIMESTAMP_LEVELS=ALL; older NCCL prints none, so let the launcher stamp each line)",
    "counters": "port counters around the window: `perfquery -x` (`ethtool -S <iface>` on RoCE) before and after "
    "the job and every minute during it (`while sleep 60; do date -u; perfquery -x; done`)",
    "packets": "a capture on the RDMA interface: `tcpdump -i mlx5_1 -s 128 -w run.pcap 'udp dst port 4791'` "
    "(RoCE; ibdump on InfiniBand)",
    "steps": "step timings: DeepSpeed `wall_clock_breakdown: true` and `steps_per_print: 1` on every rank",
}


# -- slow windows ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    """A slow stretch of the run: the slow windows of every step stream that overlap in time."""

    begin: datetime  # the start of the first slow step (its line is printed at its end)
    end: datetime
    windows: tuple[timing.Window, ...]
    share: float  # of the run's step time

    @property
    def worst(self) -> timing.Window:
        return max(self.windows, key=lambda w: w.cost_s)

    @property
    def cost_s(self) -> float:
        return self.worst.cost_s  # every rank waits for the slowest: the run lost the worst stream's time, not the sum


def slow_episodes(steps: pl.DataFrame) -> list[Episode]:
    """The run's slow stretches worth a finding (as TL401 counts them), costliest first."""
    series = timing.step_series(steps)
    total = timing.run_time_s(series) or 1.0
    found = timing.slow_windows(series) + timing.sustained_windows(series)
    windows = [w for w in found if w.start is not None and w.cost_s >= MIN_COST_SHARE * total]
    spans = sorted(((_first_step_start(series, w), w) for w in windows), key=lambda s: s[0])
    merged: list[tuple[datetime, datetime, list[timing.Window]]] = []
    for begin, w in spans:
        if merged and begin <= merged[-1][1] + MARGIN:
            first, end, group = merged[-1]
            merged[-1] = (first, max(end, w.end), [*group, w])
        else:
            merged.append((begin, w.end, [w]))
    episodes = [Episode(b, e, tuple(ws), max(w.cost_s for w in ws) / total) for b, e, ws in merged]
    return sorted(episodes, key=lambda ep: -ep.cost_s)


def _first_step_start(series: pl.DataFrame, w: timing.Window) -> datetime:
    rows = series.filter(pl.col("file") == w.file, pl.col("line").is_in(list(w.lines)))
    took = pl.duration(microseconds=(pl.col("time_ms") * pl.col("steps_covered").fill_null(1.0) * 1000).cast(pl.Int64))
    return rows.select((pl.col("ts") - took).min()).item()


def _within(events: pl.DataFrame, begin: datetime, end: datetime) -> pl.DataFrame:
    """Events whose time overlaps [begin, end] with MARGIN; a socket transport is a state, so
    it counts from the channel line on."""
    hi = pl.when(pl.col("cause") == "socket").then(pl.lit(end)).otherwise(pl.coalesce("hi", "lo"))
    return events.filter(hi >= begin - MARGIN, pl.col("lo") <= end + MARGIN)


def _straggler_events(episode: Episode) -> pl.DataFrame:
    """A stream whose compute grew in the window while the other streams' did not: a straggler."""
    ratios = [(w.host, w.compute_ratio) for w in episode.windows if w.compute_ratio]
    slow = [(host, r) for host, r in ratios if r >= STRAGGLER_COMPUTE]
    flat = [r for _, r in ratios if r < STRAGGLER_COMPUTE]
    rows = [{"source": "steps", "cause": "straggler", "what": f"compute {r:.1f}x its usual", "host": host, "count": 1}
            for host, r in slow if flat or len(ratios) == 1]
    return pl.DataFrame(rows, schema={"source": pl.String, "cause": pl.String, "what": pl.String, "host": pl.String, "count": pl.Int64})


def _comm_surged(episode: Episode) -> bool:
    w = episode.worst
    return bool(w.comm_ratio and w.comm_ratio >= COMM_SURGE and (w.compute_ratio or 1.0) <= COMPUTE_FLAT)


def rank_suspects(found: pl.DataFrame, window_s: float, network_confirmed: bool = False) -> pl.DataFrame:
    """(cause, suspect host) pairs ranked by the evidence in `found` (events with source, cause,
    host, peer, count, strength, lo, hi): independent sources first, then whether the host's own
    evidence locates the cause there, then weight (see the module doc)."""
    kinds = found.group_by("source", "cause", "what", "host", "peer", "port").agg(
        pl.col("count").sum(), pl.col("strength").fill_null(1.0).max(), span=(pl.col("hi") - pl.col("lo")).max()
    )
    interval = pl.col("span").dt.total_milliseconds() / 1000
    precision = pl.when(interval > window_s).then(pl.lit(window_s) / interval).otherwise(1.0).clip(0.1, 1.0).fill_null(1.0)
    weighted = kinds.with_columns(
        weight=(pl.col("count").cast(pl.Float64) + 1).log10() * precision * pl.col("strength"),
        # evidence of one host alone (its own port's counters, its own choice of transport, its
        # own timers) says where; a NAK or a completion error names both ends of a path
        locating=pl.col("peer").is_null() & (pl.col("strength") >= 1.0),
    )
    ends = pl.concat([
        weighted.with_columns(suspect=pl.col("host")),
        weighted.filter(pl.col("peer").is_not_null() & (pl.col("peer") != pl.col("host"))).with_columns(suspect=pl.col("peer")),
    ])  # fmt: skip
    extra = pl.col("cause").is_in(NETWORK) & network_confirmed
    return (
        ends.filter(pl.col("suspect").is_not_null())
        .group_by("cause", "suspect")
        .agg(sources=pl.col("source").n_unique(), located=pl.col("locating").any(), weight=pl.col("weight").sum())
        .with_columns(sources=pl.col("sources") + extra.cast(pl.UInt32))
        .sort(["sources", "located", "weight", "suspect"], descending=[True, True, True, False])
    )


def accused(suspects: pl.DataFrame) -> pl.DataFrame:
    """The suspects of the best cause that the evidence cannot tell apart from the first: as many
    sources, and located there as much (both ends of a congested link, say)."""
    best = suspects.row(0, named=True)
    return suspects.filter(
        pl.col("cause") == best["cause"], pl.col("sources") == best["sources"], pl.col("located") == best["located"]
    )


def _chain(found: pl.DataFrame, cause: str, hosts: list[str]) -> pl.DataFrame:
    """The events of `cause` at `hosts` (either end), grouped per source and kind: the biggest of
    each source first, then the rest by size."""
    mine = found.filter(pl.col("cause") == cause, pl.col("host").is_in(hosts) | pl.col("peer").is_in(hosts))
    order = {"NCCL": 0, "counters": 1, "packets": 2, "kernel": 3, "steps": 4}
    return (
        mine.group_by("source", "what", "host", "peer", "port")
        .agg(pl.col("count").sum(), pl.col("lo").min(), pl.col("hi").max(), rows=pl.struct("file", "line", "frame", "text", "host"))
        .with_columns(order=pl.col("source").replace_strict(order, return_dtype=pl.Int8))
        .sort(["order", "count", "what", "host", "peer", "port"], descending=[False, True, False, False, False, False], nulls_last=True)
        .with_columns(nth=pl.int_range(pl.len()).over("source"))  # ties by name: group_by's order varies between runs
        .sort(["nth", "order"])
    )


def port_text(port: str | None) -> str:
    """`mlx5_1:1` as `mlx5_1 port 1`, as the fabric rules write ports."""
    if not port:
        return ""
    ca, _, number = port.rpartition(":")
    return f"{ca} port {number}" if ca else port


def _phrase(link: dict, lead: bool = True) -> str:
    """One source's events as a clause; `lead` names the capture (a bullet names its source itself)."""
    n, what, host = link["count"], link["what"], link["host"]
    if link["source"] == "NCCL":
        return f"{host} logged {count(n, what + ' line')}" + (f" with peer {link['peer']}" if link["peer"] else "")
    if link["source"] == "counters":
        return f"{host} {port_text(link['port'])}'s {what} rose by {n:,} between the dumps at {link['lo']:%H:%M:%S} and {link['hi']:%H:%M:%S}"
    if link["source"] == "packets":
        return f"{'the capture shows ' if lead else ''}{count(n, what)} between {host} and {link['peer']}"
    if link["source"] == "kernel":
        return f"{host}'s kernel logged {count(n, what)}" + (f" on {link['port']}" if link["port"] else "")
    return f"{host}'s {what}"


_SOURCE_NAMES = {"NCCL": "NCCL log", "counters": "port counters", "packets": "capture", "kernel": "kernel log", "steps": "step timers"}


def _because(link: dict) -> str:
    """One piece of evidence as a bullet: what, how many, from which source and which files."""
    files = sorted({r["file"] for r in link["rows"] if r.get("file")})
    place = f" ({', '.join(files[:2])}" + (f" and {len(files) - 2} more" if len(files) > 2 else "") + ")" if files else ""
    return f"{_SOURCE_NAMES[link['source']].capitalize()}: {_phrase(link, lead=False)}{place}."


def _confidence(best: dict | None) -> str:
    """How sure: by the number of independent sources that agree on the cause."""
    if best is None:
        return "undetermined"
    return "high" if best["sources"] >= 3 else "medium" if best["sources"] == 2 else "low"


def _lost_because(other: dict, best: dict) -> str:
    """Why a cause considered ranks below the named one (the order rank_suspects sorts by)."""
    if other["sources"] < best["sources"]:
        why = f"{count(other['sources'], 'source')} against {best['sources']}"
    elif other["located"] != best["located"]:
        why = "as many sources, but none of its evidence is that host's own (a NAK or completion error names both ends)"
    else:
        why = "as many sources, less evidence"
    return f"{CAUSES[other['cause']]} on {other['suspect']}: {why}."


FIXES = {
    "link": "Check the link on {where}: `perfquery -x` and `ibstat {ca}` (on RoCE `ethtool -S <iface>` and "
    "`mlxlink -d {ca} -m`) for rising symbol and receive errors; reseat or replace the cable or transceiver of {port}, "
    "and drain {hosts} from the scheduler until the counters stay flat.",
    "congestion": "Find the hot link around {where}: compare PortXmitWait per second across the switch ports "
    "(`perfquery -x` on each); check PFC/ECN on the RoCE priority (`mlnx_qos -i <iface>`); spread traffic with "
    "adaptive routing or NCCL_IB_QPS_PER_CONNECTION=4.",
    "straggler": "Check {hosts}: GPU clocks, temperatures and throttling (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE`), "
    "CPU load and the data loader (`top`, `py-spy dump --pid <pid>`); drain the host if it stays slow.",
    "receiver": "The receiver on {where} fell behind (RNR NAKs or zero windows): check its CPU and memory load, "
    "and raise the receive queue depth (NCCL_IB_RETRY_CNT, the RDMA device's rnr_retry) only if the load is normal.",
    "failure": "Read the NCCL errors on {hosts} in order: the first IB completion error names the failing path; "
    "check that path's ports with `perfquery -x` and `ibstat`.",
}


def cause_fix(cause: str, hosts: list[str], ports: list[str]) -> str:
    """The named cause's fix, with the hosts and ports found (`tracelens rules TL410` has them all)."""
    ca = ports[0].split(":")[0] if ports else "<hca>"
    where = some(hosts, 8) + (f" ({listing(ports)})" if ports else "")
    return FIXES.get(cause, "").format(where=where, hosts=some(hosts, 8), ca=ca, port=listing([port_text(p) for p in ports]) or "the port")


def _missing(t: RunTables, begin: datetime, end: datetime) -> list[str]:
    """The sources that have nothing timed in [begin, end]: what to collect next time."""
    def covers(lo: pl.Series, hi: pl.Series) -> bool:
        return bool(lo.len()) and (hi.max() >= begin - MARGIN) and (lo.min() <= end + MARGIN)

    logs, dumps, packets = t["nccl_events"], t["ib_counters"]["dump_ts"].drop_nulls(), t["packets"]["ts"].drop_nulls()
    timed = logs.filter(pl.col("ts_hi") >= begin - MARGIN, pl.col("ts_lo") <= end + MARGIN)
    seen = {"NCCL": timed.height > 0, "counters": covers(dumps, dumps), "packets": covers(packets, packets)}
    return [COLLECT[source] for source, there in seen.items() if not there]


def _checked(t: RunTables, found: pl.DataFrame, begin: datetime, end: datetime) -> list[str]:
    """The sources that covered the window and showed nothing: they rule causes out."""
    missing = set(_missing(t, begin, end))
    quiet = [s for s in ("NCCL", "counters", "packets") if COLLECT[s] not in missing and found.filter(pl.col("source") == s).height == 0]
    said = {"NCCL": "NCCL logs cover the window: no warning or error in it.",
            "counters": "Port counters were dumped around the window: none rose beyond traffic.",
            "packets": "The capture covers the window: no NAK, retransmission, gap or CNP in it."}
    return [said[s] for s in quiet]


def _evidence(rows: list[dict], limit: int) -> list[Evidence]:
    return [Evidence(file=r["file"], line=r.get("line"), frame=r.get("frame"), text=r.get("text") or "", host=r.get("host")) for r in rows[:limit]]


def _span(begin: datetime, end: datetime) -> str:
    return f"{begin:%H:%M:%S} to {end:%H:%M:%S} UTC"


def _join(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


@rule("TL410", "slow-window-root-cause", Severity.WARNING)
def slow_window_root_cause(t: RunTables) -> Iterator[Finding]:
    """
    What it finds: for each slow stretch of steps (the windows TL401 reports, merged over the
    ranks that saw them), every network event in the same minutes, whatever its source: NCCL
    warnings and IB completion errors, port counters that rose between dumps whose interval
    overlaps the window, and the NAKs, PSN gaps, retransmissions, CNPs and ECN-CE marks of a
    capture; and, from the per-rank timers, a rank whose compute grew while the others' did
    not. The likely causes (a bad link, congestion, a straggler ...) are ranked by how many
    independent sources point at the same host, and the finding gives the chain of evidence
    of the first, its host and ports, the window and the time it cost. A window no source
    explains says what to collect next time.

    Why it slows the run: every rank waits for the slowest transfer at each all-reduce, so a
    lossy link (go-back-N retransmissions after each lost packet, IB retries up to the retry
    count), a congested switch port or one slow rank stalls the whole job for as long as it
    lasts; the step timers say when, the network evidence says where.

    How to fix: follow the named cause. A bad link: check the port with `perfquery -x` and
    `ibstat` (or `ethtool -S` and `mlxlink -d <dev> -m` on RoCE), reseat or replace the cable
    or transceiver, and drain the node until it is fixed. Congestion: compare PortXmitWait
    per second across switch ports to find the hot link, check PFC/ECN on the RoCE priority,
    spread traffic (adaptive routing, NCCL_IB_QPS_PER_CONNECTION). A straggler: check that
    host's GPU clocks and temperatures (`nvidia-smi -q -d PERFORMANCE`) and its CPU load.
    """
    episodes = slow_episodes(t["steps"])
    if not episodes:
        return
    events = network_events(t).filter(pl.col("cause") != "stall")  # hangs are TL411's
    for episode in episodes[:MAX_WINDOWS]:
        found = pl.concat([_within(events, episode.begin, episode.end), _straggler_events(episode)], how="diagonal_relaxed")
        window_s = max((episode.end - episode.begin).total_seconds(), 1.0)
        suspects = rank_suspects(found, window_s, network_confirmed=_comm_surged(episode))
        best = suspects.row(0, named=True) if suspects.height else None
        if best and best["cause"] == "socket":
            continue  # TL412 measures it against the job's steps on IB
        yield _window_finding(t, episode, found, best, suspects)


def _window_finding(t: RunTables, episode: Episode, found: pl.DataFrame, best: dict | None, suspects: pl.DataFrame) -> Finding:
    w = episode.worst
    hosts = sorted({x.host for x in episode.windows if x.host})
    streams = {(x.file, x.host, x.rank, x.engine) for x in episode.windows}
    slow = (f"{w.label} took {w.ratio:.1f}x the usual {number(w.baseline_ms, 'ms')} per step from "
            f"{_span(episode.begin, episode.end)} on {count(len(streams), 'step stream')}")
    if _comm_surged(episode):
        slow += f", the all-reduce {w.comm_ratio:.1f}x its usual while compute stayed flat"
    cost = f"{duration(episode.cost_s)} ({episode.share:.0%} of the run's step time)"
    because = [f"Step timers: {slow} ({w.file})."]
    slow = slow[0].upper() + slow[1:]
    missing = _missing(t, episode.begin, episode.end)
    advice = f" Not in the evidence for this window; collect next time: {'; '.join(missing)}." if missing else ""
    evidence = step_evidence(t, w.file, w.lines)[:3]
    ports: list[str] = []
    against = _checked(t, found, episode.begin, episode.end)
    fix = ""
    if best is None:
        title = f"Slow {w.label}: no network event in the window"
        summary = f"{slow}. No NCCL warning, counter rise or packet event falls in that window: {cost} lost with no cause in the evidence."
        fix = f"Collect next time, so that a window like this one can be explained: {'; '.join(missing)}." if missing else ""
        score = episode.share
    else:
        hosts = sorted(accused(suspects)["suspect"].to_list())
        chain = _chain(found, best["cause"], hosts)
        links = chain.head(MAX_PHRASES).to_dicts()
        counted = chain.filter(pl.col("source") == "counters", pl.col("host").is_in(hosts))
        ports = sorted({p for p in counted["port"].to_list() if p})
        where = some(hosts) + (f" ({', '.join(port_text(p) for p in ports)})" if ports else "")
        others = suspects.filter(~((pl.col("cause") == best["cause"]) & pl.col("suspect").is_in(hosts))).head(2).to_dicts()
        also = ("; also considered: " + ", ".join(f"{CAUSES[o['cause']]} on {o['suspect']} ({count(o['sources'], 'source')})" for o in others)) if others else ""
        title = f"Root cause of slow {w.label}: {CAUSES[best['cause']]} on {where}"
        summary = (f"{slow}. In the same window {_join([_phrase(link) for link in links])}: {CAUSES[best['cause']]} on {where} "
                   f"cost the run {cost}, by {count(best['sources'], 'independent source')}{also}.")
        because += [_because(link) for link in chain.to_dicts()]
        against += [_lost_because(o, best) for o in others]
        fix = cause_fix(best["cause"], hosts, ports)
        evidence += [e for link in links for e in _evidence(link["rows"], 5)]
        score = best["sources"] + episode.share
    if gpu := utilisation_phrase(t, episode.begin, episode.end, hosts):  # the host evidence, when nvidia-smi/DCGM sampled it
        summary += f" {gpu}."
    return Finding(
        rule_id="TL410",
        severity=Severity.CRITICAL if episode.share >= 0.2 else Severity.WARNING,
        title=title,
        summary=summary + advice,
        evidence=evidence,
        hosts=hosts,
        ranks=sorted({x.rank for x in episode.windows if x.rank >= 0 and x.host in hosts}) if best is None or best["cause"] == "straggler" else [],
        window=(episode.begin, episode.end),
        cost_seconds=episode.cost_s,
        ports=ports,
        score=score,
        verdict=Verdict(
            cause=best["cause"] if best else None, confidence=_confidence(best), headline=title, because=because,
            against=against, not_available=[f"Collect next time: {m}." for m in missing], fix=fix,
        ),
        fix=fix,
    )


# -- stalls and hangs -----------------------------------------------------------------------------


def last_signs_of_life(t: RunTables) -> pl.DataFrame:
    """Per rank (host, rank): its last step and the time of its last step-timer line."""
    steps = t["steps"].filter(pl.col("ts").is_not_null(), pl.col("rank").is_not_null())
    return steps.group_by("host", "rank").agg(
        last_step=pl.col("step").max(), last_ts=pl.col("ts").max(), line=pl.col("line").sort_by("ts").last(),
        file=pl.col("file").sort_by("ts").last(), text=pl.col("message").sort_by("ts").last(),
    ).sort("last_ts", "rank")


def _silent_ranks(t: RunTables, reporters: set[int]) -> list[int]:
    """Ranks of the job (its largest communicator) that did not report the hung collective."""
    world = t["nccl_comms"]["nranks"].max()
    return sorted(set(range(int(world))) - reporters) if world and reporters else []


def _host_of_rank(t: RunTables, ranks: list[int]) -> list[str]:
    comms = t["nccl_comms"].filter(pl.col("rank").is_in(ranks), pl.col("nranks") == t["nccl_comms"]["nranks"].max())
    steps = t["steps"].filter(pl.col("rank").is_in(ranks))
    return sorted(set(comms["host"].drop_nulls().to_list()) | set(steps["host"].drop_nulls().to_list()))


def log_gaps(t: RunTables) -> pl.DataFrame:
    """Per host, stretches where every log of the host was silent: columns host, begin, end, seconds."""
    times = pl.concat([t[n].filter(pl.col("ts_quality") == "exact").select("host", "ts") for n in LOG_TABLES])
    times = times.filter(pl.col("host").is_not_null()).unique().sort("host", "ts")
    gap = (pl.col("ts") - pl.col("ts").shift(1).over("host")).dt.total_milliseconds() / 1000
    return (
        times.with_columns(seconds=gap, begin=pl.col("ts").shift(1).over("host"))
        .with_columns(usual=pl.col("seconds").median().over("host"))
        .filter(pl.col("seconds") >= GAP_MIN_S, pl.col("seconds") >= GAP_FACTOR * pl.col("usual"))
        .select("host", "begin", pl.col("ts").alias("end"), "seconds")
    )


@rule("TL411", "stall-or-hang", Severity.CRITICAL)
def stall_or_hang(t: RunTables) -> Iterator[Finding]:
    """
    What it finds: the job stopped making progress: a PyTorch watchdog timed out on a
    collective (the hang began when the collective started, its report time minus `ran for`),
    every log of a host fell silent for minutes, or the ranks' last lines stop at different
    points. It names the rank that stopped first: a rank of the job that never reported the
    hung collective (it never enqueued it), else the rank whose last step line is the
    earliest; with Flight Recorder dumps, the rank they show stopped first (TL422); and the
    network errors and counter rises of the minutes before, if any.

    Why it slows the run: a collective completes only when every rank joins it, so one rank
    stuck in its data loader, a crashed process or a dead link holds all the others idle
    until the watchdog kills the job, 10 or 30 minutes later, and the work since the last
    checkpoint is lost.

    How to fix: start from the rank that stopped first: its last lines, `py-spy dump --pid
    <pid>` on a live hang, its host's kernel log (`dmesg -T`) and GPU state (`nvidia-smi`,
    Xid errors). Turn on PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000,
    TORCH_NCCL_DUMP_ON_TIMEOUT=1) to see which collective each rank was in; if network errors
    precede the hang, fix the link first (TL107, TL201).
    """
    watchdog = t["nccl_errors"].filter(
        pl.col("kind").is_in(["watchdog_timeout", "blocking_wait_timeout"]), pl.col("ts").is_not_null()
    )
    covered: list[tuple[datetime, datetime]] = []
    if watchdog.height:
        started = pl.col("ts") - pl.duration(milliseconds=pl.coalesce("ran_ms", "timeout_ms").fill_null(0), time_unit="ns")
        hangs = watchdog.with_columns(started=started).group_by(pl.col("op_type").fill_null("collective"), "seq").agg(
            begin=pl.col("started").min(), end=pl.col("ts").max(), ranks=pl.col("rank").drop_nulls().unique(),
            rows=pl.struct("file", "line", "host", "message"),
        )
        for hang in hangs.sort("begin").iter_rows(named=True):
            covered.append((hang["begin"], hang["end"]))
            yield _hang_finding(t, hang)
    for gap in log_gaps(t).iter_rows(named=True):
        if any(b - MARGIN <= gap["end"] and gap["begin"] <= e + MARGIN for b, e in covered):
            continue
        covered.append((gap["begin"], gap["end"]))  # the other hosts silent at the same time are in this finding
        yield _gap_finding(t, gap)


def _stopped_first(t: RunTables, reporters: set[int]) -> tuple[list[int], str]:
    stop = first_stopped(t)  # the Flight Recorder dumps and stack dumps, when the run has them
    if stop is not None:
        return [stop.rank], f"the Flight Recorder dumps show that {stop.why}; it was in {stop.where}"
    silent = _silent_ranks(t, reporters)
    if silent:
        one = len(silent) == 1
        return silent, (f"{'rank' if one else 'ranks'} {listing([str(r) for r in silent])} never reported it: "
                        f"{'it was' if one else 'they were'} not in the collective")
    lives = last_signs_of_life(t)
    if lives.height >= 2 and lives["last_ts"][0] < lives["last_ts"][1]:
        first = lives.row(0, named=True)
        return [first["rank"]], f"rank {first['rank']}'s last step line (step {first['last_step']}) is the earliest"
    return [], "the logs do not show which rank stopped first"


def _hang_finding(t: RunTables, hang: dict) -> Finding:
    ranks, why = _stopped_first(t, set(hang["ranks"]))
    hosts = _host_of_rank(t, ranks) if ranks else sorted({r["host"] for r in hang["rows"] if r["host"]})
    before = network_events(t).filter(pl.col("cause") != "stall", pl.col("lo") <= hang["end"], pl.col("lo") >= hang["begin"] - timedelta(minutes=5))
    sources = {"NCCL"} | set(before["source"].unique().to_list()) | ({"steps"} if "last step" in why else set())
    network = ""
    if before.height:
        counts = before.group_by("source", "what", "host").agg(pl.col("count").sum()).sort("count", descending=True).head(3)
        network = " Before it: " + "; ".join(f"{r['count']:,} {r['what']} ({r['source']}, {r['host']})" for r in counts.iter_rows(named=True)) + "."
    lost = (hang["end"] - hang["begin"]).total_seconds()
    what = f"{hang['op_type']} SeqNum={hang['seq']}" if hang["seq"] is not None else hang["op_type"]
    lives = last_signs_of_life(t)
    rank_lines = lives.filter(pl.col("rank").is_in(ranks)).to_dicts() if ranks else []
    return Finding(
        rule_id="TL411",
        severity=Severity.CRITICAL,
        title=f"Hang: {what} never completed" + (f"; rank {', '.join(map(str, ranks))} on {', '.join(hosts)} stopped first" if ranks else ""),
        summary=f"{what} started at {hang['begin']:%H:%M:%S} UTC and {count(len(hang['ranks']), 'rank')} waited for it until their "
        f"watchdogs fired at {hang['end']:%H:%M:%S}: {why}. The job stood still for {duration(lost)}.{network}"
        + ("" if rank_lines or not ranks else f" Not in the evidence: what rank {ranks[0]} was doing; collect next time: "
           "PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) and "
           f"{COLLECT['steps']}."),
        evidence=_evidence(rank_lines, 3) + [Evidence(file=r["file"], line=r["line"], text=r["message"] or "", host=r["host"]) for r in hang["rows"]],
        hosts=hosts,
        ranks=ranks,
        window=(hang["begin"], hang["end"]),
        cost_seconds=lost,
        score=len(sources) + 0.5,
    )


def _gap_finding(t: RunTables, gap: dict) -> Finding:
    everyone = log_gaps(t).filter(pl.col("begin") <= gap["end"], pl.col("end") >= gap["begin"])
    hosts_silent = sorted(set(everyone["host"].to_list()))
    all_hosts = sorted(set(pl.concat([t[n].select("host") for n in ("nccl_events", "steps")])["host"].drop_nulls().to_list()))
    scope = "every host" if hosts_silent == all_hosts and len(all_hosts) > 1 else ", ".join(hosts_silent)
    return Finding(
        rule_id="TL411",
        severity=Severity.WARNING,
        title=f"Logs silent for {duration(gap['seconds'])} on {scope}",
        summary=f"Every log of {scope} is silent from {_span(gap['begin'], gap['end'])} ({duration(gap['seconds'])}, "
        f"against lines every few seconds otherwise): the job stalled there. No watchdog reported it; collect next time: "
        f"{COLLECT['NCCL']}; PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000).",
        hosts=hosts_silent,
        window=(gap["begin"], gap["end"]),
        cost_seconds=gap["seconds"],
        score=1.0,
    )


# -- transport fallback cost ----------------------------------------------------------------------


@rule("TL412", "socket-fallback-cost", Severity.WARNING)
def socket_fallback_cost(t: RunTables) -> Iterator[Finding]:
    """
    What it finds: the time a fall back to NCCL's TCP socket transport cost, measured: the
    steps after the first `via NET/Socket` channel against the same job's steps before it (on
    InfiniBand or RoCE, e.g. before a relaunch on a node whose HCA was gone), when they are at
    least 1.2x slower. TL101 says the fallback happened; this says what it cost.

    Why it slows the run: the socket transport moves every gradient through the kernel TCP
    stack and host memory at a few GB/s instead of 25-50 GB/s with GPUDirect RDMA, and one
    node on sockets drags every all-reduce down to its speed.

    How to fix: make the node's HCAs visible to NCCL again (see TL101: `ibv_devinfo` shows
    the ports Active, rdma-core in the container, `/dev/infiniband` passed through,
    NCCL_IB_DISABLE unset), or drain the node and relaunch without it.
    """
    socket = network_events(t).filter(pl.col("cause") == "socket", pl.col("source") == "NCCL")
    if socket.height == 0:
        return
    since = socket["lo"].min()
    series = timing.step_series(t["steps"]).filter(pl.col("time_ms").is_not_null(), pl.col("ts").is_not_null())
    on_socket = series.with_columns(after=pl.col("ts") >= since)
    took = pl.duration(microseconds=(pl.col("time_ms") * 1000).cast(pl.Int64))
    before, after = on_socket.filter(~pl.col("after")), on_socket.filter(pl.col("after"))
    if before["step"].n_unique() < MIN_STEPS or after["step"].n_unique() < MIN_STEPS:
        return
    usual, slow = before["time_ms"].median(), after["time_ms"].median()
    if slow < FALLBACK_SLOWER * usual:
        return
    lost_rows = after.group_by("step").agg(pl.col("time_ms").median(), pl.col("steps_covered").first().fill_null(1.0))
    lost = float(((lost_rows["time_ms"] - usual).clip(lower_bound=0) * lost_rows["steps_covered"]).sum() / 1000)
    total = timing.run_time_s(series) or 1.0
    hosts = sorted(set(socket["host"].drop_nulls().to_list()))
    start, end = after.select((pl.col("ts") - took).min()).item(), after["ts"].max()
    title = f"NCCL on TCP sockets from {start:%H:%M:%S} cost {duration(lost)}"
    fix = (f"On {listing(hosts)}: `ibv_devinfo` must list the HCA ports as PORT_ACTIVE (rdma-core in the container, "
           f"`/dev/infiniband` passed through), and NCCL_IB_DISABLE / NCCL_NET=Socket must be unset; else drain "
           f"{listing(hosts)} and relaunch without {'it' if len(hosts) == 1 else 'them'}.")
    because = [
        f"NCCL log: {listing(hosts)} chose NET/Socket from {socket['lo'].min():%H:%M:%S} UTC "
        f"({count(socket.height, 'line')}, first in {socket.sort('lo')['file'][0]}).",
        f"Step timers: {number(slow, 'ms')} per step on sockets against {number(usual, 'ms')} on the same job's "
        f"{count(before['step'].n_unique(), 'step')} before ({slow / usual:.1f}x), over {count(after['step'].n_unique(), 'step')}.",
    ]
    yield Finding(
        rule_id="TL412",
        severity=Severity.CRITICAL if lost / total >= 0.2 else Severity.WARNING,
        title=title,
        summary=f"From {_span(start, end)} {', '.join(hosts)} carried NCCL traffic via NET/Socket and the steps took "
        f"{slow:.0f} ms instead of the {usual:.0f} ms of the same job's {before['step'].n_unique()} steps before it "
        f"({slow / usual:.1f}x) over {count(after['step'].n_unique(), 'step')}: {duration(lost)} lost, {lost / total:.0%} of the run's step time.",
        evidence=_evidence(socket.sort("lo").to_dicts(), 5),
        hosts=hosts,
        window=(start, end),
        cost_seconds=lost,
        score=2 + lost / total,
        fix=fix,
        verdict=Verdict(cause="socket", confidence="high", headline=title, because=because, fix=fix),
    )
