"""TL401-TL404: how long the training steps took, and where the time went."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from tracelens.derived import RunContext, step_times
from tracelens.derived.imbalance import PEERS, peers_usual
from tracelens.findings import Finding, Severity
from tracelens.findings.causes import unseen_ranks
from tracelens.findings.evidence import row_evidence, step_evidence
from tracelens.prose import count
from tracelens.rules import Setting, rule


def _basis_note(basis: str) -> str:
    return {
        "timers": "measured by wall_clock_breakdown (forward + backward + optimizer step)",
        "iteration": "as the iteration time the log reports",
        "timestamps": "measured between progress lines, so data loading, evaluation and checkpoints count too",
    }[basis]


@rule(
    "TL401",
    "step-time-spikes",
    Severity.WARNING,
    kind="symptom",
    needs=("steps",),
    settings={
        "long_window_rows": Setting(
            "logged steps", "Slow windows of fewer logged steps are isolated spikes, reported together in one finding."
        ),
        "critical_share": Setting(
            "share of the run's step time", "A slow stretch that cost at least this share of the run is critical."
        ),
        "spikes_warn_share": Setting(
            "share of the run's step time",
            "Isolated spikes warn when together they cost at least "
            "this share of the run (less is a busy machine's noise, told at info).",
        ),
    },
)
def step_time_spikes(
    ctx: RunContext, *, long_window_rows: int = 3, critical_share: float = 0.2, spikes_warn_share: float = 0.15
) -> Iterator[Finding]:
    """
    What it finds: steps that took far longer than the run's usual step time, grouped into
    windows of consecutive slow steps, each with how much time it cost the run. "Usual" is a
    rolling median of the step time and "far" is both 1.5x that median and six robust
    standard deviations (median absolute deviation) above it, so a noisy run is not flagged
    for its noise and no fixed number of milliseconds is assumed. Step time comes from
    Megatron's iteration time, else wall_clock_breakdown's timers, else the time between
    progress lines. A stretch warns only when it stands out from the run itself: fewer than
    5% of the equally long stretches outside it were as slow, it is not the run's start-up
    (ten steady steps before it at least), it is not brief (under ten seconds, as short as a
    busy machine's bursts; a stall is never brief), and it is no mild
    slowdown (its median step under [steps] slow_ratio times the usual); otherwise it is told at
    info, with why.
    Isolated spikes (one or two slow steps) warn only when together they cost 15% of the
    run's step time; a spike every rank's log shows at once is one spike of the job.

    Why it slows the run: in data-parallel training every rank waits for the slowest at each
    gradient all-reduce, so a slow window stalls the whole job. Windows where every step is
    slow at once point at a shared cause: the network (packet loss with long RoCE/IB
    retransmission timeouts, congestion, a flapping link), a storage or data-loader stall,
    or checkpointing. Isolated multi-second spikes that repeat are the classic sign of
    retransmission timeouts.

    How to fix: look at what else happened in the window (other findings with the same time
    span): compare the timers (TL402 says whether the all-reduce grew), check the fabric
    counters for errors (`perfquery -x`, `ethtool -S` for `rx_prio*_pause`, `out_of_sequence`,
    `local_ack_timeout_err`) and the NCCL log for warnings in that window. For RoCE
    timeouts, fix the loss (PFC/ECN on the RoCE priority) and keep `NCCL_IB_TIMEOUT` at its
    default rather than raising it. If the windows line up with evaluation or checkpoints,
    make those asynchronous or less frequent.
    """
    windows = ctx.slow_windows
    total = ctx.run_time_s or 1.0
    # one finding per slow stretch of the job, however many logs saw it (steps.slow_episodes)
    # a stretch only the ranks' imbalance shows is no slow steps: TL410 judges it
    long = [ep for ep in ctx.slow_episodes if ep.worst.rows >= long_window_rows and not ep.imbalance]
    spikes = [w for w in windows if w.rows < long_window_rows]
    for ep in long[: step_times.MAX_WINDOWS]:
        w = ep.worst
        seen = f"seen in the logs of {ep.streams} ranks" if ep.streams > 1 else f"engine {w.engine}"
        loud = Severity.CRITICAL if ep.share >= critical_share else Severity.WARNING
        # a stretch no slower than the run often is, its start-up, or a mild one, is told, not warned of
        # (TL410 warns of a mild stretch when a cause rose with it)
        ordinary = ep.ordinary or (
            f"a mild slowdown ({w.ratio:.2f}x, under [steps] slow_ratio {ctx.slow_steps.slow_ratio:g}x); TL410 says "
            "whether any cause rose with it"
            if w.ratio < ctx.slow_steps.slow_ratio
            else ""
        )
        yield Finding(
            severity=Severity.INFO if ordinary else loud,
            title=f"Slow steps: {w.label} took {w.ratio:.1f}x the usual step time",
            summary=f"{w.label} ({w.steps} steps, {seen}) took {w.ratio:.1f}x the usual "
            f"{w.baseline_ms:.0f} ms per step (worst {w.peak_ms:.0f} ms), {_basis_note(w.basis)}; "
            f"they cost {w.cost_s:.1f} s, {ep.share:.0%} of the run's step time."
            + (f" Not a warning: {ordinary}." if ordinary else ""),
            evidence=step_evidence(ctx, w.file, w.lines),
            cost_seconds=w.cost_s,
            hosts=[x.host for x in ep.windows if x.host],
            ranks=[x.rank for x in ep.windows if x.rank >= 0],
            window=(ep.begin, ep.end),
        )
    events = step_times.spike_events(spikes)
    cost = sum(max(w.cost_s for w in event) for event in events)
    if spikes and cost >= ctx.slow_steps.min_cost_share * total:
        worst = max(spikes, key=lambda w: w.peak_ms)
        logs = len({w.file for w in spikes})
        yield Finding(
            # between progress lines a spike may as well be an evaluation or a checkpoint; single slow
            # steps that cost less than spikes_warn_share are a busy machine's noise
            severity=Severity.WARNING
            if worst.basis != "timestamps" and cost >= spikes_warn_share * total
            else Severity.INFO,
            title=f"{count(len(events), 'isolated step-time spike')}",
            summary=f"{count(len(events), 'single slow step')} or pairs"
            + (f" of the job, read from {logs} logs (a step they all waited on counts once)" if logs > 1 else "")
            + f", up to {worst.peak_ms:.0f} ms against a usual "
            f"{worst.baseline_ms:.0f} ms ({worst.label}), {_basis_note(worst.basis)}; together they cost "
            f"{cost:.1f} s, {cost / total:.0%} of the run's step time.",
            evidence=[e for w in spikes for e in step_evidence(ctx, w.file, w.lines)],
            hosts=[w.host for w in spikes if w.host],
            cost_seconds=cost,
        )


@rule(
    "TL402",
    "comm-bound-steps",
    Severity.WARNING,
    kind="symptom",
    needs=("steps",),
    shared=("baseline",),
    settings={
        "comm_bound_share": Setting(
            "share of the step",
            "All-reduce + all-gather time at or above this median share of the steps makes them communication-bound.",
        ),
        "comm_surge": Setting(
            "times the usual",
            "Communication time in a slow stretch at this multiple of its usual or more, "
            "with no rank's own work (forward, optimizer step) rising above its baseline, is a surge.",
        ),
    },
)
def comm_bound_steps(
    ctx: RunContext, *, comm_bound_share: float = step_times.COMM_BOUND_SHARE, comm_surge: float = 2.0
) -> Iterator[Finding]:
    """
    What it finds: steps where gradient communication takes a large share of the step, from
    wall_clock_breakdown's timers: `bwd_allreduce` (the all-reduce or reduce-scatter that did
    not overlap with the backward pass) plus ZeRO's `optimizer_allgather`. Either the share
    is high throughout (35% or more of the step), or it surges in a slow stretch of steps
    (twice its usual time, over three steps at least) while every rank's own work (forward and optimizer step) stays
    flat on every rank: one finding per stretch, however many logs saw it. Where some ranks log no timers
    (DeepSpeed prints them on rank 0 by default), the rank the timed ones waited for may be one of those:
    the finding says so rather than blame the network.

    Why it slows the run: time in these timers is time the GPUs wait for the network. A high
    share throughout means the fabric cannot keep up with the model's gradient volume (too
    little bandwidth, a downshifted link, TCP instead of RDMA); a surge with flat compute
    means the network itself slowed down for that window (loss, retransmissions, congestion),
    not the model.

    How to fix: for a surge, look for fabric errors and congestion in the same window (port
    counters, pause frames, ECN/CNP counters, NCCL warnings). For a high share throughout:
    check NCCL really uses IB/RoCE with GPUDirect RDMA (`NCCL_DEBUG=INFO`, `via NET/IB/.../GDRDMA`),
    the link rate (`ibstat`), then reduce the traffic: `overlap_comm: true` with ZeRO,
    larger `reduce_bucket_size`, `gradient_accumulation_steps` > 1, bf16/fp16 gradients
    (`communication_data_type`).
    """
    series = ctx.step_series
    timed = pl.col("comm_ms").is_not_null() & (pl.col("basis") == "timers")
    if series.scan().filter(timed).head(1).collect().height == 0:
        return
    for ep in ctx.slow_episodes:  # one finding per slow stretch, however many logs saw the surge
        if ep.ordinary or ep.imbalance:
            continue  # the run's start-up or its own noise (TL401 says which), or no slow steps at all
        signals = ctx.step_signals(ep.begin, ep.end)
        surged = [s for s in signals if s.cause == "comm" and s.rose and (s.ratio or 0.0) >= comm_surge]
        comm_ms = max((s.change or 0.0 for s in surged), default=0.0)
        if not surged or any(
            s.rose and (s.cause == "own" or s.cause == "between" and (s.change or 0.0) > comm_ms) for s in signals
        ):
            continue  # some rank's own work rose (a straggler: the others waited) or it stalled longer between steps
        compute = max((s.ratio for s in signals if s.cause == "own" and s.ratio), default=1.0)
        w, top = ep.worst, max(surged, key=lambda s: s.ratio or 0.0)
        seen = f", seen in the logs of {count(len(surged), 'rank')}" if len(surged) > 1 else ""
        # where some ranks log no timers, the one the timed ranks waited for may be among them
        untimed = unseen_ranks({s.where for s in signals if s.cause == "own"}, ctx.world_size)
        reading = (
            f"{count(untimed, 'other rank')} of the job log no timers, so one of them arriving late cannot be told "
            "from a slower network (TL410 says what to collect)"
            if untimed
            else "the network slowed down, not the model"
        )
        yield Finding(  # rule_id: stamped by Rule.run
            severity=Severity.WARNING,
            title=f"Gradient communication surged in {w.label}",
            summary=(
                f"In {w.label} the gradient all-reduce/all-gather took {top.ratio:.1f}x its usual time while every "
                f"{'timed ' if untimed else ''}rank's own work (forward and optimizer step) stayed at "
                f"{compute:.2f}x{seen}: {reading}."
            ),
            evidence=step_evidence(ctx, w.file, w.lines[:3]) + [e for s in surged for e in row_evidence(s.evidence, 2)],
            hosts=sorted({h for s in surged for h in s.hosts}),
            ranks=sorted({s.rank for s in surged if s.rank is not None}),
            window=(ep.begin, ep.end),
        )
    for frame in series.frames([*step_times.STREAM, "line", "basis", "slow", "time_ms", "comm_ms"]):
        steady = frame.filter(timed & ~pl.col("slow"))
        for (file, host, rank, engine), stream in steady.group_by(step_times.STREAM, maintain_order=True):
            share = (stream["comm_ms"] / stream["time_ms"]).median()
            if share is not None and share >= comm_bound_share:
                median = stream["comm_ms"].median()
                yield Finding(
                    severity=Severity.WARNING,
                    title=f"Steps are communication-bound ({share:.0%} in all-reduce/all-gather)",
                    summary=f"Engine {engine}: the gradient all-reduce and ZeRO all-gather take {share:.0%} of each "
                    f"step (median {median:.0f} ms of {stream['time_ms'].median():.0f} ms) over {stream.height} "
                    "steps.",
                    evidence=step_evidence(ctx, file, stream["line"].head(5).to_list()),
                    hosts=[host] if host else [],
                    ranks=[rank] if rank >= 0 else [],
                )


@rule(
    "TL403",
    "throughput-drop",
    Severity.WARNING,
    kind="symptom",
    needs=("steps",),
    settings={
        "drop_share": Setting(
            "share of the steady samples/s",
            "A rolling median this far below the early steady state, for a third of the run or more, is a drop.",
        ),
        "min_reports": Setting(
            "throughput reports", "Streams with fewer reports after warm-up are too short to judge."
        ),
    },
)
def throughput_drop(ctx: RunContext, *, drop_share: float = 0.15, min_reports: int = 12) -> Iterator[Finding]:
    """
    What it finds: samples/sec (DeepSpeed's ThroughputTimer, Megatron or the pipeline engine)
    falling and staying below the run's early steady state by more than 15%, judged on a
    rolling median over a third of the run so that short spikes (TL401) do not count. The
    first steps (warm-up) and steps skipped for fp16 overflow are left out: a skipped step
    is a numerical event (the loss scale was too high), not a network one.

    Why it slows the run: a sustained fall in throughput with no change to the model or the
    batch is the signature of a resource degrading under load: congestion building up in
    the fabric (PFC pauses, ECN/DCQCN rate cuts), a link that retrains at a lower rate,
    thermal throttling, or a slowly filling disk or data pipeline.

    How to fix: compare the time the drop starts with the fabric counters (`PortXmitWait`,
    `rx_prio*_pause`, `np_ecn_marked_roce_packets`, `rp_cnp_handled`) and with the link rate
    (`ibstat`); check GPU clocks and temperatures (`nvidia-smi -q -d PERFORMANCE`) and the
    data loader. If only some ranks show it, look for stragglers (TL404).
    """
    reported = pl.col("samples_per_sec").is_not_null() & pl.col("step").is_not_null()
    rows = ctx.scan("steps").filter(reported).collect(engine="streaming")
    for (file, host, engine), stream in rows.sort("line").group_by(["file", "host", "engine"], maintain_order=True):
        skipped = stream["skipped"].fill_null(strategy="forward").fill_null(0)
        fresh = (skipped.diff().fill_null(0) == 0).to_list()
        clean = stream.filter(pl.Series(fresh)).slice(step_times.WARMUP_ROWS)
        if clean.height < min_reports:
            continue
        steady = clean["samples_per_sec"].head(max(clean.height // 4, 3)).median()
        span = max(clean.height // 3, 4)
        rolling = clean["samples_per_sec"].rolling_median(span, center=True)
        low = clean.with_columns(rolling.alias("rolling")).filter(pl.col("rolling") < steady * (1 - drop_share))
        if low.height < span:
            continue
        worst = float(low["rolling"].min())
        overflow = int(skipped[-1] - skipped[0]) if stream.height else 0
        note = (
            (
                f" {count(overflow, 'step')} {'was' if overflow == 1 else 'were'} skipped for fp16 overflow and left "
                "out: a too-high loss scale, not the network."
            )
            if overflow
            else ""
        )
        yield Finding(
            severity=Severity.WARNING,
            title=f"Throughput fell {1 - worst / steady:.0%} below its steady state",
            summary=f"Engine {engine}: samples/sec fell from a steady {steady:.1f} to {worst:.1f} (rolling median over "
            f"{span} reports) from step {low['step'][0]} to {low['step'][-1]}.{note}",
            evidence=step_evidence(ctx, file, [low["line"][0], low["line"][-1]]),
            hosts=[host] if host else [],
            window=(low["ts"].min(), low["ts"].max()) if low["ts"].null_count() < low.height else None,
        )


@rule(
    "TL404",
    "stragglers",
    Severity.WARNING,
    needs=("steps|comm_ops",),
    settings={
        "slower_ratio": Setting(
            "times the peers' compute time",
            "A rank at this multiple of the usual forward+backward time or more is slow on that step ...",
        ),
        "slow_share": Setting(
            "share of the steps", "... and a straggler when it is slow on at least this share of them."
        ),
        "wait_share": Setting(
            "share of the collective time",
            "Comms-logger time waiting for the slowest rank at or above this "
            "share of the collective time is a straggler.",
        ),
    },
)
def stragglers(
    ctx: RunContext, *, slower_ratio: float = 1.15, slow_share: float = 0.6, wait_share: float = 0.5
) -> Iterator[Finding]:
    """
    What it finds: one rank consistently slower than its peers, where per-rank timings exist:
    wall_clock_breakdown timer lines from every rank (compute time forward + backward without
    the all-reduce, at least 15% above the other ranks' median on most steps), or the comms
    logger's straggler table (`show_straggler`) where waiting for the slowest rank is half
    or more of the collective time.

    Why it slows the run: a collective ends when its last rank arrives, so one slow rank
    (a GPU throttling, a noisy neighbour, a slow host CPU or data loader) makes every other
    rank wait at every all-reduce. The waiting shows up as communication time on the fast
    ranks, so it looks like a network problem when it is not.

    How to fix: look at the named rank's host: GPU clocks, temperature and ECC errors
    (`nvidia-smi -q`), CPU load and NUMA binding of its process, its data-loader workers.
    Swap the node out and see whether the slowness moves with it.
    """
    ranked = pl.col("compute_ms").is_not_null() & (pl.col("rank") >= 0)
    # Ranks are compared across files: per-node logs each hold one host's ranks.
    usual = peers_usual(ctx.step_series, "compute_ms")
    if usual.height:
        columns = ["host", "rank", "compute_ms", "file", "line", "ts"]
        per_rank = pl.concat(
            frame.filter(ranked)
            .join(usual, on=PEERS, maintain_order="left")
            .with_columns((pl.col("compute_ms") / pl.col("usual")).alias("ratio"))
            .group_by("host", "rank", "engine")
            .agg(
                pl.col("ratio").median(),
                (pl.col("ratio") >= slower_ratio).mean().alias("share"),
                pl.struct("file", "line").head(2).alias("where"),
                first=pl.col("ts").min(),
                last=pl.col("ts").max(),
            )
            for frame in ctx.step_series.by(["host", "rank", "engine"], [*PEERS, *columns])
        )
        slow = per_rank.filter((pl.col("ratio") >= slower_ratio) & (pl.col("share") >= slow_share))
        # one finding per host: its slow ranks together (a throttled or overloaded node slows all of its GPUs)
        for (host, _engine), group in slow.sort("rank").group_by("host", "engine", maintain_order=True):
            ranks, worst = group["rank"].to_list(), group.sort("ratio", "rank").row(-1, named=True)
            who = f"Rank {ranks[0]}" if len(ranks) == 1 else f"Ranks {', '.join(map(str, ranks))}"
            where = f" on {host}" if host else ""
            places = [p for ps in group["where"].to_list() for p in ps]
            yield Finding(
                severity=Severity.WARNING,
                title=f"{who}{where} {'is a straggler' if len(ranks) == 1 else 'are stragglers'} "
                f"({worst['ratio']:.2f}x {'its' if len(ranks) == 1 else 'their'} peers' compute time)",
                summary=(
                    f"{who}{where} took up to {worst['ratio']:.2f}x the usual forward+backward time of the fastest "
                    f"ranks, and {'was' if len(ranks) == 1 else 'were'} slower by {slower_ratio - 1:.0%} or more on "
                    f"at least {group['share'].min():.0%} of the steps."
                ),
                evidence=[e for p in places for e in step_evidence(ctx, p["file"], [p["line"]])],
                hosts=[host] if host else [],
                ranks=ranks,
                window=(group["first"].min(), group["last"].max()) if group["first"].min() else None,
            )
    waits = ctx["comm_ops"].filter(pl.col("kind") == "straggler")
    for _, table in waits.group_by(["file"], maintain_order=True):
        comm, wait = table["total_ms"].sum(), table["straggler_total_ms"].sum()
        if comm and wait / comm >= wait_share:
            yield Finding(
                severity=Severity.WARNING,
                title="Collectives mostly wait for a straggler",
                summary=f"The comms logger's straggler breakdown shows {wait:.0f} ms of {comm:.0f} ms collective time "
                f"({wait / comm:.0%}) spent waiting for the slowest rank to arrive, not moving data.",
                evidence=row_evidence(table.iter_rows(named=True), text=lambda r: f"{r['op']} {r['msg_bytes']} B"),
            )
