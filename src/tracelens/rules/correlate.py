"""TL410-TL412: evidence from every source joined by time into a root cause.

TL410 gives each slow stretch of the job (steps.slow_episodes: the windows every log saw,
merged, so a window seen in the logs of two ranks is one finding) a verdict: every signal of
the run is measured inside the window and before and after it (derived.window_signals, tested
by derived.baseline), the competing causes are weighed on the signals that rose
(findings.causes), and the finding carries the verdict as data (Finding.verdict: headline,
because, against, not_available, fix). A cause whose evidence did not rise above its own
baseline is never named; a window nothing explains is "undetermined" and says what to collect.

Note for the scenario fixtures (expected.json "top"): TL410 is the top finding of a run with a
slow window caused in the network or by a straggler, naming the host (and `mlx5_1:1` ports
where counters locate it) and the window from the start of the first slow step to the end of
the last; TL411 is the top of a hang, naming the rank that stopped first and the window from
the hung collective's start to the last watchdog report; TL412 is the top of a socket
fallback measured against IB steps of the same job (TL410 leaves windows that begin with the
switch to sockets to it).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import polars as pl

from tracelens.derived import RunContext, step_times
from tracelens.derived.hostsignals import utilisation_phrase
from tracelens.derived.step_times import MARGIN
from tracelens.derived.stream_groups import StreamGroups
from tracelens.derived.window_signals import measure
from tracelens.findings import Finding, Severity, Verdict
from tracelens.findings.causes import NETWORK, Candidate, verdict
from tracelens.findings.evidence import hosts_of, row_evidence, step_evidence
from tracelens.prose import count, duration, listing, number, ranks_text, some
from tracelens.prose import span as prose_span
from tracelens.rules import Setting, rule
from tracelens.timeline import LOG_TABLES

MAX_REASONS = 6
EVIDENCE_SPAN_SHARE = (
    0.25  # the cause's dense events give the window when they span this share of the slow steps' window
)

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


def port_text(port: str | None) -> str:
    """`mlx5_1:1` as `mlx5_1 port 1`, as the fabric rules write ports."""
    if not port:
        return ""
    ca, _, number = port.rpartition(":")
    return f"{ca} port {number}" if ca else port


FIXES = {
    "link": "Check the link on {where}: `perfquery -x` and `ibstat {ca}` (on RoCE `ethtool -S <iface>` and "
    "`mlxlink -d {ca} -m`) for rising symbol and receive errors; reseat or replace the cable or transceiver of {port}, "
    "and drain {hosts} from the scheduler until the counters stay flat.",
    "congestion": (
        "Find what caps the path between {where}: rate limits and shaping on both hosts "
        "(`tc -s qdisc show`, `nft list ruleset`, an instance's or VPC's bandwidth cap, "
        "`ethtool <iface>` for a link up at a lower speed); on a fabric, the hot link: PortXmitWait "
        "per second across the switch ports (`perfquery -x` on each), PFC/ECN on the RoCE priority "
        "(`mlnx_qos -i <iface>`); spread traffic with adaptive routing or NCCL_IB_QPS_PER_CONNECTION=4."
    ),
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
    return FIXES.get(cause, "").format(
        where=where, hosts=some(hosts, 8), ca=ca, port=listing([port_text(p) for p in ports]) or "the port"
    )


def _missing(ctx: RunContext, begin: datetime, end: datetime) -> list[str]:
    """The sources that have nothing timed in [begin, end]: what to collect next time."""

    def covers(lo: pl.Series, hi: pl.Series) -> bool:
        return bool(lo.len()) and (hi.max() >= begin - MARGIN) and (lo.min() <= end + MARGIN)

    dumps = ctx["ib_counters"]["dump_ts"].drop_nulls()
    timed = ctx.scan("nccl_events").filter(pl.col("ts_hi") >= begin - MARGIN, pl.col("ts_lo") <= end + MARGIN).head(1)
    first, last = ctx.captures.select(pl.col("first").min(), pl.col("last").max()).row(0)  # the packets unread
    captured = first is not None and last >= begin - MARGIN and first <= end + MARGIN
    seen = {
        "NCCL": timed.collect(engine="streaming").height > 0,
        "counters": covers(dumps, dumps),
        "packets": captured,
    }
    return [COLLECT[source] for source, there in seen.items() if not there]


def _span(begin: datetime, end: datetime) -> str:
    return f"{begin:%H:%M:%S} to {end:%H:%M:%S} UTC"


# the step levels that are a cause's own evidence (a straggler's: its own ranks' own work)
CAUSE_LEVELS = {
    "straggler": ("own",),
    "contention": ("own",),
    "input": ("between",),
    "comm": ("wait",),
    **{cause: ("wait",) for cause in NETWORK},
}


def _evidence_window(
    signals: list, best: Candidate, begin: datetime, end: datetime
) -> tuple[datetime, datetime] | None:
    """When the named cause's own evidence ran high: its events (retransmissions, NAKs, NCCL warnings)
    dense, or its own step levels (a straggler's compute time, the time between steps) raised. That
    is the window the verdict gives, rather than the slow steps' blurred edges. A network cause's
    events, where a source recorded them, say when it lasted; the ranks' waiting is its effect on the
    job, highest where the loss hurt most, not where it began and ended."""

    def own(s) -> bool:
        if s.source == "steps":
            return s.cause in CAUSE_LEVELS.get(best.cause, ()) and (best.cause != "straggler" or s.rank in best.ranks)
        return s.cause == best.cause

    def waited(s) -> bool:  # a late rank named by its arrival alone: when the others waited for it
        return s.source == "steps" and s.cause == "wait"

    # a stretch of events this short next to the slow steps (a few bursts) does not say when the cause began or ended
    long = [
        s for s in signals if s.rose and s.extent and s.extent[1] - s.extent[0] >= EVIDENCE_SPAN_SHARE * (end - begin)
    ]
    mine = [s for s in long if own(s)]
    events = [s for s in mine if s.source != "steps"]
    extents = [s.extent for s in events or mine] or [s.extent for s in long if best.cause == "straggler" and waited(s)]
    if not extents:
        return None
    # where several logs or places show it, the edges most of them agree on: one rank's noise next
    # to the window (a busy machine) does not widen it
    return _median([e[0] for e in extents]), _median([e[1] for e in extents])


def _label(series: StreamGroups, w: step_times.Window, begin: datetime, end: datetime) -> str:
    """`steps 254-324 (03:47:05 to 03:47:49 UTC)`: the steps of the worst log that ran in [begin, end]."""
    mine = (
        series.scan()
        .filter(pl.col("file") == w.file, pl.col("rank") == w.rank, pl.col("ts") > begin, pl.col("ts") <= end)
        .select("step")
        .collect(engine="streaming")["step"]
    )
    if mine.len() == 0:
        return f"{w.label} ({prose_span(begin, end)})"
    steps = f"step {mine.min()}" if mine.min() == mine.max() else f"steps {mine.min()}-{mine.max()}"
    return f"{steps} ({prose_span(begin, end)})"


def _median(times: list[datetime]) -> datetime:
    times = sorted(times)
    middle = len(times) // 2
    return times[middle] if len(times) % 2 else times[middle - 1] + (times[middle] - times[middle - 1]) / 2


def _socket_switch(ctx: RunContext, episode: step_times.Episode) -> bool:
    """Whether a process chose NCCL's socket transport at the window's start (TL412's to measure)."""
    socket = ctx.network_events.filter(pl.col("cause") == "socket")
    return socket.filter(pl.col("lo") >= episode.begin - MARGIN, pl.col("lo") <= episode.end).height > 0


@rule("TL410", "slow-window-root-cause", Severity.WARNING, kind="root cause", needs=("steps",), shared=("baseline",))
def slow_window_root_cause(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: for each slow stretch of steps (the windows TL401 reports, one per stretch
    whatever the number of logs that saw it), the verdict: every signal of the run measured
    inside the window against the same signal before and after it: loss-driven TCP
    retransmissions, RoCE NAKs and PSN gaps, CNPs and ECN marks per host pair, error and
    congestion counters per port, NCCL warnings per host, and per rank the compute time, the
    communication time and the time between steps. A count rose when the one-sided 95% mid-p
    lower bound of its rate ratio (window over baseline) is at least 1.5; a per-step time rose
    when its median is at least 1.3x and three robust standard deviations above its level
    outside. The competing causes (a bad link, congestion, a straggler, contention on every
    rank, a stall between steps) are weighed on what rose; the finding names the best with its
    confidence, quotes both sides of every signal, lists the signals that stayed normal (they
    rule the other causes out), and says "undetermined" with what to collect when nothing rose.

    Why it slows the run: every rank waits for the slowest at each all-reduce, so a lossy link,
    a congested port, one slow rank or a stalled data loader stalls the whole job for as long
    as it lasts. The same slow steps look alike in the step timers whatever the cause; only
    the signals that changed in that window, and where, tell them apart.

    How to fix: follow the named cause (the finding's fix is that cause's). A bad link:
    `perfquery -x`, `ethtool -S`, `mlxlink -d <dev> -m`, reseat or replace the cable. Congestion:
    PortXmitWait per port, PFC/ECN on the RoCE priority. A straggler: that host's CPU load and
    affinity (`pidstat 1`, `taskset -p <pid>`), GPU clocks (`nvidia-smi -q -d PERFORMANCE`). A
    stall between steps: DataLoader `num_workers`, asynchronous checkpoints.
    """
    episodes = ctx.slow_episodes
    if not episodes:
        return
    series = ctx.step_series
    for episode in episodes[: step_times.MAX_WINDOWS]:
        if _socket_switch(ctx, episode):
            continue  # TL412 measures it against the job's steps on IB
        yield _window_finding(ctx, series, episode)


def _window_finding(ctx: RunContext, series: StreamGroups, episode: step_times.Episode) -> Finding:
    w = episode.worst
    missing = _missing(ctx, episode.begin, episode.end)

    apart = [(ep.begin, ep.end) for ep in ctx.slow_episodes if ep is not episode]

    def judged(begin: datetime, end: datetime):
        signals = measure(ctx, begin, end, apart)
        return (
            (begin, end),
            signals,
            *verdict(signals, _label(series, w, begin, end), missing, ctx.forward_waits, ctx.world_size),
        )

    # measured on the slow steps' window, then again on the named cause's own window (its evidence's
    # edges): the quoted rates and levels are then those of the window the finding gives
    window, signals, diagnosis, best = judged(episode.begin, episode.end)
    for _ in range(0 if episode.stall else 2):  # a stall's window is its step, not its cause's stretch
        own = _evidence_window(signals, best, *window) if best else None
        if own is None or own == window:
            break
        again = judged(*own)
        if again[3] is None or (again[3].cause != best.cause and again[3].score < best.score):
            break  # the narrower window alone says something else, and says it less: the wider one stays
        window, signals, diagnosis, best = again
    seen = f"seen in the logs of {count(episode.streams, 'rank')}" if episode.streams > 1 else "seen in one log"
    cost = f"{duration(episode.cost_s)} ({episode.share:.0%} of the run's step time)"
    slow = (
        f"{w.label.capitalize()} took {w.ratio:.1f}x the usual "
        f"{number(w.baseline_ms, 'ms')} per step, {seen}; they cost {cost}."
    )
    reasons = diagnosis.because[:MAX_REASONS] if best else diagnosis.against[:MAX_REASONS]
    summary = (
        f"{diagnosis.headline}. {slow} " + ("Because: " if best else "Checked and normal: ") + "; ".join(reasons) + "."
    )
    hosts = best.hosts if best else []
    if gpu := utilisation_phrase(
        ctx.tables, episode.begin, episode.end, hosts
    ):  # the host evidence, when nvidia-smi/DCGM sampled it
        summary += f" {gpu}."
    if best and best.cause in FIXES:
        diagnosis.fix = cause_fix(best.cause, hosts, best.ports)
    evidence = step_evidence(ctx, w.file, w.lines)[:3]
    risen = [s for s in signals if s.rose and best and (s.cause == best.cause or s.source == "steps")]
    evidence += [e for s in risen for e in row_evidence(s.evidence, 3)]
    first = (
        series.scan()
        .filter(pl.col("file") == w.file, pl.col("rank") == w.rank)
        .select(pl.col("step").min())
        .collect(engine="streaming")
        .item()
    )
    startup = first is not None and w.first_step <= first + step_times.WARMUP_ROWS  # warm-up: told, never blamed
    if startup:
        diagnosis.headline = f"Start-up: {diagnosis.headline}"
    # a stretch that does not stand out from the run (brief, its noise) is blamed only when a source
    # besides the step times rose with it
    corroborated = any(s.rose and s.source != "steps" and best and s.cause == best.cause for s in signals)
    # the run's start-up has nothing before it to compare with, unless the cause's own window lies past it
    past_startup = episode.startup and window[0] > episode.begin
    told = bool(episode.ordinary) and not corroborated and not past_startup
    if best and told:
        summary += f" Told, not warned of: {episode.ordinary}, and no source besides the step times rose with it."
    # a window nothing explains, the start-up or one told is not blamed: info, after the findings that warn
    blamed = best is not None and not startup and not told
    return Finding(
        # TL401 warns of the slow steps of a window nothing explains
        severity=(Severity.CRITICAL if diagnosis.confidence == "high" and episode.share >= 0.2 else Severity.WARNING)
        if blamed
        else Severity.INFO,
        title=diagnosis.headline,
        summary=summary,
        fix=diagnosis.fix,
        evidence=evidence,
        hosts=hosts,
        ranks=best.ranks if best else [],
        window=window,
        cost_seconds=episode.cost_s,
        ports=best.ports if best else [],
        score=best.score + episode.share if best and blamed else 0.0,  # told: ranked by severity like the rest
        verdict=diagnosis,
    )


# -- stalls and hangs -----------------------------------------------------------------------------


def _job_ranks(ctx: RunContext) -> tuple[int, set[int]]:
    """The job's size (its largest communicator) and the ranks whose own lines are in the run (their
    init line in that communicator, or their step lines): a rank whose log was not collected is unknown."""
    comms = ctx.scan("nccl_comms").filter(pl.col("nranks") == pl.col("nranks").max()).select("rank", "nranks").collect()
    world = int(comms["nranks"].max() or 0)  # no communicator: 0
    steps = ctx.scan("steps").select("rank").unique().collect(engine="streaming")["rank"]
    return world, set(comms["rank"].drop_nulls().to_list()) | set(steps.drop_nulls().to_list())


def _host_of_rank(ctx: RunContext, ranks: list[int]) -> list[str]:
    widest = pl.col("nranks") == pl.col("nranks").max()
    comms = ctx.scan("nccl_comms").filter(pl.col("rank").is_in(ranks), widest).select("host").collect()
    steps = ctx.scan("steps").filter(pl.col("rank").is_in(ranks)).select("host").collect(engine="streaming")
    return sorted(set(comms["host"].drop_nulls().to_list()) | set(steps["host"].drop_nulls().to_list()))


def log_gaps(ctx: RunContext, silent_s: float, silent_factor: float) -> pl.DataFrame:
    """Per host, stretches where every log of the host was silent at least `silent_s` seconds and
    `silent_factor` times its usual interval between lines: columns host, begin, end, seconds."""
    exact = [ctx.scan(n).filter(pl.col("ts_quality") == "exact", pl.col("host").is_not_null()) for n in LOG_TABLES]
    times = (
        pl.concat([frame.select("host", "ts") for frame in exact])
        .unique()
        .collect(engine="streaming")
        .sort("host", "ts")
    )
    gap = (pl.col("ts") - pl.col("ts").shift(1).over("host")).dt.total_milliseconds() / 1000
    return (
        times.with_columns(seconds=gap, begin=pl.col("ts").shift(1).over("host"))
        .with_columns(usual=pl.col("seconds").median().over("host"))
        .filter(pl.col("seconds") >= silent_s, pl.col("seconds") >= silent_factor * pl.col("usual"))
        .select("host", "begin", pl.col("ts").alias("end"), "seconds")
    )


@rule(
    "TL411",
    "stall-or-hang",
    Severity.CRITICAL,
    kind="root cause",
    needs=("nccl_errors|nccl_events|steps",),
    settings={
        "silent_s": Setting("seconds", "A host whose every log is silent this long ..."),
        "silent_factor": Setting(
            "times the host's usual interval between lines", "... and this many times its usual interval has stalled."
        ),
    },
)
def stall_or_hang(ctx: RunContext, *, silent_s: float = 120.0, silent_factor: float = 20.0) -> Iterator[Finding]:
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
    watchdog = ctx["nccl_errors"].filter(
        pl.col("kind").is_in(["watchdog_timeout", "blocking_wait_timeout"]), pl.col("ts").is_not_null()
    )
    covered: list[tuple[datetime, datetime]] = []
    if watchdog.height:
        started = pl.col("ts") - pl.duration(
            milliseconds=pl.coalesce("ran_ms", "timeout_ms").fill_null(0), time_unit="ns"
        )
        timed_out = (
            watchdog.with_columns(started=started)
            .group_by(pl.col("op_type").fill_null("collective"), "seq", maintain_order=True)
            .agg(
                begin=pl.col("started").min(),
                end=pl.col("ts").max(),
                ranks=pl.col("rank").drop_nulls().unique(maintain_order=True),
                rows=pl.struct("file", "line", "host", "message"),
            )
        )
        for hang in timed_out.sort("begin", maintain_order=True).iter_rows(named=True):
            covered.append((hang["begin"], hang["end"]))
            yield _hang_finding(ctx, hang)
    gaps = log_gaps(ctx, silent_s, silent_factor)
    for gap in gaps.iter_rows(named=True):
        if any(b - MARGIN <= gap["end"] and gap["begin"] <= e + MARGIN for b, e in covered):
            continue
        covered.append((gap["begin"], gap["end"]))  # the other hosts silent at the same time are in this finding
        yield _gap_finding(ctx, gap, gaps)


def _stopped_first(ctx: RunContext, reporters: set[int]) -> tuple[list[int], str]:
    stop = ctx.first_stopped  # the Flight Recorder dumps and stack dumps, when the run has them
    if stop is not None:
        return [stop.rank], f"the Flight Recorder dumps show that {stop.why}; it was in {stop.where}"
    world, logged = _job_ranks(ctx)
    # ranks of the job whose lines are in the run but which did not report the hung collective
    silent = sorted((set(range(world)) & logged) - reporters) if reporters else []
    if silent:
        one = len(silent) == 1
        return (
            silent,
            f"{ranks_text(silent)} never reported it: {'it was' if one else 'they were'} not in the collective",
        )
    lives = ctx.last_steps
    if lives.height >= 2 and lives["last_ts"][0] < lives["last_ts"][1]:
        first = lives.row(0, named=True)
        return [first["rank"]], f"rank {first['rank']}'s last step line (step {first['last_step']}) is the earliest"
    unseen = len(set(range(world)) - logged - reporters)
    if unseen:
        return [], (
            f"the logs do not show which rank stopped first: {count(unseen, 'rank')} of the {world}-rank job "
            "left no lines here (their logs were not collected, so whether they joined it is unknown)"
        )
    return [], "the logs do not show which rank stopped first"


def _hang_finding(ctx: RunContext, hang: dict) -> Finding:
    ranks, why = _stopped_first(ctx, set(hang["ranks"]))
    hosts = _host_of_rank(ctx, ranks) if ranks else sorted({r["host"] for r in hang["rows"] if r["host"]})
    before = ctx.network_events.filter(
        pl.col("cause") != "stall", pl.col("lo") <= hang["end"], pl.col("lo") >= hang["begin"] - timedelta(minutes=5)
    )
    sources = {"NCCL"} | set(before["source"].unique().to_list()) | ({"steps"} if "last step" in why else set())
    network = ""
    if before.height:
        counts = before.group_by("source", "what", "host").agg(pl.col("count").sum())
        counts = counts.sort("count", "what", "source", "host", descending=[True, False, False, False]).head(3)
        network = (
            " Before it: "
            + "; ".join(
                f"{r['count']:,} {r['what']} ({r['source']}, {r['host']})" for r in counts.iter_rows(named=True)
            )
            + "."
        )
    lost = (hang["end"] - hang["begin"]).total_seconds()
    what = f"{hang['op_type']} SeqNum={hang['seq']}" if hang["seq"] is not None else hang["op_type"]
    lives = ctx.last_steps
    rank_lines = lives.filter(pl.col("rank").is_in(ranks)).to_dicts() if ranks else []
    return Finding(
        severity=Severity.CRITICAL,
        title=f"Hang: {what} never completed"
        + (f"; {ranks_text(ranks)} on {', '.join(hosts)} stopped first" if ranks else ""),
        summary=(
            f"{what} started at {hang['begin']:%H:%M:%S} UTC and "
            f"{count(len(hang['ranks']), 'rank')} waited for it until their watchdogs fired at "
            f"{hang['end']:%H:%M:%S}: {why}. The job stood still for {duration(lost)}.{network}"
        )
        + (
            ""
            if rank_lines or not ranks
            else f" Not in the evidence: what rank {ranks[0]} was doing; collect next time: "
            "PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) and "
            f"{COLLECT['steps']}."
        ),
        evidence=row_evidence(rank_lines, 3) + row_evidence(hang["rows"], text="message"),
        hosts=hosts,
        ranks=ranks,
        window=(hang["begin"], hang["end"]),
        cost_seconds=lost,
        score=len(sources) + 0.5,
    )


def _gap_finding(ctx: RunContext, gap: dict, gaps: pl.DataFrame) -> Finding:
    everyone = gaps.filter(pl.col("begin") <= gap["end"], pl.col("end") >= gap["begin"])
    hosts_silent = sorted(set(everyone["host"].to_list()))
    all_hosts = hosts_of(ctx.scan("nccl_events"), ctx.scan("steps"))
    scope = "every host" if hosts_silent == all_hosts and len(all_hosts) > 1 else ", ".join(hosts_silent)
    return Finding(
        severity=Severity.WARNING,
        title=f"Logs silent for {duration(gap['seconds'])} on {scope}",
        summary=(
            f"Every log of {scope} is silent from {_span(gap['begin'], gap['end'])} ({duration(gap['seconds'])}, "
            "against lines every few seconds otherwise): the job stalled there. No watchdog reported it; collect "
            f"next time: {COLLECT['NCCL']}; PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000)."
        ),
        hosts=hosts_silent,
        window=(gap["begin"], gap["end"]),
        cost_seconds=gap["seconds"],
        score=1.0,
    )


# -- transport fallback cost ----------------------------------------------------------------------


@rule(
    "TL412",
    "socket-fallback-cost",
    Severity.WARNING,
    kind="root cause",
    needs=("steps", "nccl_net|nccl_channels"),
    settings={
        "slower_ratio": Setting(
            "times the steps before",
            "Steps on sockets at least this much slower than the same job's steps "
            "before the fallback have a cost worth a finding.",
        ),
        "min_steps": Setting("steps", "Fewer steps on either side of the fallback are too few to compare."),
    },
)
def socket_fallback_cost(ctx: RunContext, *, slower_ratio: float = 1.2, min_steps: int = 5) -> Iterator[Finding]:
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
    socket = ctx.network_events.filter(pl.col("cause") == "socket", pl.col("source") == "NCCL")
    if socket.height == 0:
        return
    since = socket["lo"].min()
    timed = ctx.step_series.scan().filter(pl.col("time_ms").is_not_null(), pl.col("ts").is_not_null())
    on_socket = timed.select("step", "ts", "time_ms", "steps_covered", after=pl.col("ts") >= since)
    on_socket = on_socket.collect(engine="streaming")
    took = pl.duration(microseconds=(pl.col("time_ms") * 1000).cast(pl.Int64))
    before, after = on_socket.filter(~pl.col("after")), on_socket.filter(pl.col("after"))
    if before["step"].n_unique() < min_steps or after["step"].n_unique() < min_steps:
        return
    usual, slow = before["time_ms"].median(), after["time_ms"].median()
    if slow < slower_ratio * usual:
        return
    lost_rows = after.group_by("step", maintain_order=True).agg(
        pl.col("time_ms").median(), pl.col("steps_covered").first().fill_null(1.0)
    )
    lost = float(((lost_rows["time_ms"] - usual).clip(lower_bound=0) * lost_rows["steps_covered"]).sum() / 1000)
    total = ctx.run_time_s or 1.0
    hosts = sorted(set(socket["host"].drop_nulls().to_list()))
    start, end = after.select((pl.col("ts") - took).min()).item(), after["ts"].max()
    title = f"NCCL on TCP sockets from {start:%H:%M:%S} cost {duration(lost)}"
    fix = (
        f"On {listing(hosts)}: `ibv_devinfo` must list the HCA ports as PORT_ACTIVE (rdma-core in the container, "
        f"`/dev/infiniband` passed through), and NCCL_IB_DISABLE / NCCL_NET=Socket must be unset; else drain "
        f"{listing(hosts)} and relaunch without {'it' if len(hosts) == 1 else 'them'}."
    )
    because = [
        f"NCCL log: {listing(hosts)} chose NET/Socket from {socket['lo'].min():%H:%M:%S} UTC "
        f"({count(socket.height, 'line')}, first in {socket.sort('lo', maintain_order=True)['file'][0]}).",
        f"Step timers: {number(slow, 'ms')} per step on sockets against {number(usual, 'ms')} on the same job's "
        f"{count(before['step'].n_unique(), 'step')} before ({slow / usual:.1f}x), over "
        f"{count(after['step'].n_unique(), 'step')}.",
    ]
    yield Finding(
        severity=Severity.CRITICAL if lost / total >= 0.2 else Severity.WARNING,
        title=title,
        summary=(
            f"From {_span(start, end)} {', '.join(hosts)} carried NCCL traffic via NET/Socket and the steps took "
            f"{slow:.0f} ms instead of the {usual:.0f} ms of the same job's {before['step'].n_unique()} steps before "
            f"it ({slow / usual:.1f}x) over {count(after['step'].n_unique(), 'step')}: {duration(lost)} lost, "
            f"{lost / total:.0%} of the run's step time."
        ),
        evidence=row_evidence(socket.sort("lo", maintain_order=True).to_dicts(), 5),
        hosts=hosts,
        window=(start, end),
        cost_seconds=lost,
        score=2 + lost / total,
        fix=fix,
        verdict=Verdict(cause="socket", confidence="high", headline=title, because=because, fix=fix),
    )
