"""TL430-TL431: what the ranks' PyTorch profiler traces say (tracelens.derived.traces).

TL430 measures the communication no computation hides, per rank and step; TL431 names the rank
that arrives last at the collectives, per slow stretch of steps (and over the whole trace), from
the arrivals matched across the ranks' traces.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.traces import COLLECTIVE
from tracelens.findings import Evidence, Finding, Severity
from tracelens.findings.evidence import row_evidence
from tracelens.ingest.profiler.kineto import EPOCH_MIN_US
from tracelens.prose import count, number_runs
from tracelens.rules import Setting, rule

MAX_STEPS_SHOWN = 6


def _window(begin_us: float | None, end_us: float) -> tuple[datetime, datetime] | None:
    """The span in UTC, when the trace's clock is the wall clock (not the time since boot)."""
    if begin_us is None or begin_us < EPOCH_MIN_US:
        return None
    return datetime.fromtimestamp(begin_us / 1e6, tz=timezone.utc), datetime.fromtimestamp(
        end_us / 1e6, tz=timezone.utc
    )


def _files(ctx: RunContext, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """Each rank's trace file: its row (rank, file, host)."""
    rows = ctx["trace_ranks"].filter(pl.col("rank").is_in(ranks)).select("rank", "file", "host")
    return {r["rank"]: r for r in rows.iter_rows(named=True)}


def _trace_evidence(files: dict[int, dict[str, Any]], ranks: list[int]) -> list[Evidence]:
    """The first ranks' trace files, as a finding's evidence."""
    return row_evidence((files[r] for r in ranks if r in files), 4, lambda r: f"rank {r['rank']}: profiler trace")


def _hosts(files: dict[int, dict[str, Any]], ranks: list[int]) -> list[str]:
    return sorted({host for r in ranks if r in files and (host := files[r]["host"])})


def _steps_text(steps: list[int]) -> str:
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in number_runs(steps, shortest=2))


@rule(
    "TL430",
    "exposed-communication",
    Severity.WARNING,
    kind="symptom",
    needs=("trace_spans",),
    settings={
        "share": Setting("share of the step", "A rank whose median step exposes more communication than this."),
        "critical_share": Setting("share of the step", "Above this median share the finding is critical."),
    },
)
def exposed_communication(ctx: RunContext, *, share: float = 0.25, critical_share: float = 0.5) -> Iterator[Finding]:
    """
    What it finds: from the ranks' profiler traces, per rank and ProfilerStep, the share of the
    step during which communication runs and no computation does (exposed communication, in
    Holistic Trace Analysis's temporal breakdown: on the GPU, NCCL kernels with no computation
    kernel beside them; on a CPU-only run, the collective calls), when the median step of some
    rank exposes more than `share` of its time.

    Why it slows the run: communication that overlaps computation is free; exposed communication
    adds to every step. A high share means the gradient all-reduce waits for the end of the
    backward pass (no bucketing or overlap), the network is slow for the model's size, or the
    rank waits for a slower one inside the collective (TL431 says which).

    How to fix: let DDP or DeepSpeed overlap the all-reduce with the backward pass
    (`overlap_comm: true`, smaller `reduce_bucket_size` / DDP `bucket_cap_mb` so that the first
    buckets leave early), use gradient accumulation to communicate less often, and check the
    transport (TL1xx) and the last-arriving rank (TL431) before buying bandwidth.
    """
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null(), pl.col("window_us") > 0)
    if steps.height == 0:
        return
    per_rank = (
        steps.with_columns(exposed=pl.col("exposed_comm_us") / pl.col("window_us"))
        .group_by("rank")
        .agg(
            pl.col("exposed").median().alias("median"),
            pl.col("exposed_comm_us").sum().alias("exposed_us"),
            pl.col("window_us").sum().alias("window_us"),
            pl.col("basis").first(),
            pl.col("step").filter(pl.col("exposed") > share).alias("over"),
            pl.len().alias("steps"),
        )
        .sort("median", descending=True)
    )
    high = per_rank.filter(pl.col("median") > share)
    if high.height == 0:
        return
    worst = high.row(0, named=True)
    ranks = high["rank"].to_list()
    files = _files(ctx, ranks)
    parts = [
        f"rank {r['rank']}: {r['median']:.0%} of the median step ({r['exposed_us'] / 1e3:,.1f} ms exposed "
        f"in {count(r['steps'], 'step')}; over {share:.0%} in steps {_steps_text(sorted(r['over']))[:120]})"
        for r in high.head(MAX_STEPS_SHOWN).iter_rows(named=True)
    ]
    where = "GPU (NCCL kernels with no computation kernel running)" if worst["basis"] == "gpu" else "CPU"
    span = ctx.trace_breakdown.filter(pl.col("rank") == worst["rank"], pl.col("step").is_not_null())
    begin = span["start_us"].min()
    end = (span["start_us"] + span["window_us"]).max()
    yield Finding(
        severity=Severity.CRITICAL if worst["median"] > critical_share else Severity.WARNING,
        title=f"Exposed communication: {worst['median']:.0%} of the median step on rank {worst['rank']}",
        summary=f"On the {where}, communication ran with nothing to hide it behind for " + "; ".join(parts) + ".",
        evidence=_trace_evidence(files, ranks),
        hosts=_hosts(files, ranks),
        ranks=ranks,
        window=_window(begin, end),
        cost_seconds=float(high["exposed_us"].max()) / 1e6,
    )


@rule(
    "TL431",
    "last-arriving-rank",
    Severity.WARNING,
    kind="cause",
    needs=("trace_spans",),
    settings={
        "slow_ratio": Setting("multiple of the median step", "A step slower than this is part of a slow stretch."),
        "last_share": Setting(
            "share of the waiting", "More than this share of the ranks' waiting at collectives is for one rank."
        ),
        "min_wait_share": Setting("share of the step", "The others wait for it at least this share of their steps."),
        "min_collectives": Setting("collectives", "Fewer matched collectives in a stretch say too little."),
        "min_steps": Setting("steps", "A slow stretch of fewer steps is a spike, not judged on its own."),
    },
)
def last_arriving_rank(
    ctx: RunContext,
    *,
    slow_ratio: float = 1.3,
    last_share: float = 0.6,
    min_wait_share: float = 0.05,
    min_collectives: int = 3,
    min_steps: int = 3,
) -> Iterator[Finding]:
    """
    What it finds: from the collectives matched across the ranks' profiler traces (by process
    group and sequence number, or by position in the step), the rank the others waited for: the
    one that arrived last where more than `last_share` of their waiting time was spent, in each
    slow stretch of steps (the run's slow stretches as its logs show them, else the traced steps
    slower than `slow_ratio` times their median, at least `min_steps` of them) or, when no
    stretch is slower, over the whole trace;
    only when the other ranks wait for it at least `min_wait_share` of their step time. A rank
    arrives when its NCCL kernel (or, CPU only, its collective) starts; it waits from then until
    the last rank arrives.

    Why it slows the run: a collective finishes only when every rank has joined it. The rank that
    arrives last and waits least sets the pace: every other rank idles in the collective for it,
    so the whole job runs at the speed of its slowest rank (a slower GPU or CPU, a data loader
    that stalls, more work on that rank, a noisy neighbour).

    How to fix: find what the last rank does before the collective: compare its computation time
    per step with the others' (the report's profiler breakdown), its data loading (more
    `num_workers`, `pin_memory`), its host (CPU frequency, other jobs: `top`, `nvidia-smi`), and
    the balance of work across ranks (uneven batches or sequence lengths). Replace the host or
    GPU if it is slower on the same work.
    """
    arrived = ctx.collective_arrivals
    if arrived.height == 0 or arrived["rank"].n_unique() < 2:
        return
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null(), pl.col("window_us") > 0)
    stretches = _episode_steps(ctx) or _slow_stretches(steps, slow_ratio)
    scopes: list[list[int] | None] = [s for s in stretches if len(s) >= min_steps] or [None]
    for stretch in scopes:
        rows = arrived if stretch is None else arrived.filter(pl.col("step").is_in(stretch))
        finding = _last_rank(ctx, rows, steps, stretch, last_share, min_wait_share, min_collectives)
        if finding is not None:
            yield finding


def _episode_steps(ctx: RunContext) -> list[list[int]]:
    """The traced steps that ended inside each of the job's slow stretches (the windows TL401 and TL410
    judge against the whole run): a trace that holds mostly slow steps has no stretch slower than its
    own median, yet the run's logs still tell which of its steps were slow."""
    ended = ctx.trace_levels.select("step", "end")
    found = []
    for episode in ctx.slow_episodes:
        inside = ended.filter(pl.col("end").is_between(episode.begin, episode.end))["step"].unique().sort()
        if inside.len():
            found.append(inside.to_list())
    return found


def _slow_stretches(steps: pl.DataFrame, slow_ratio: float) -> list[list[int]]:
    """Runs of consecutive steps whose slowest rank's window exceeds slow_ratio x the median step."""
    per_step = steps.group_by("step").agg(pl.col("window_us").max()).sort("step")
    if per_step.height < 3:
        return []
    median = per_step["window_us"].median()
    slow = per_step.filter(pl.col("window_us") > slow_ratio * median)["step"].to_list()  # type: ignore[operator]
    return [list(run) for run in number_runs(slow, shortest=1)] if 0 < len(slow) < per_step.height else []


def _last_rank(
    ctx: RunContext,
    rows: pl.DataFrame,
    steps: pl.DataFrame,
    stretch: list[int] | None,
    last_share: float,
    min_wait_share: float,
    min_collectives: int,
) -> Finding | None:
    collectives = rows.select(*COLLECTIVE).unique().height
    if collectives < min_collectives:
        return None
    # whom the ranks waited for, by time: under ZeRO-3 a step holds many small prefetched collectives
    # that any rank may start last by a hair; the waiting a slow rank causes is what sets the pace
    lasts = rows.filter("last").select(*COLLECTIVE, late=pl.col("rank"))
    waited_for = (
        rows.join(lasts, on=COLLECTIVE)
        .filter(pl.col("rank") != pl.col("late"))
        .group_by("late")
        .agg(pl.col("wait_us").sum())
        .sort("wait_us", "late", descending=[True, False])
    )
    total = waited_for["wait_us"].sum()
    if waited_for.height == 0 or total <= 0:
        return None
    rank, for_it = waited_for.row(0)
    if for_it <= last_share * total:
        return None
    times = lasts.filter(pl.col("late") == rank).height
    others = rows.filter(pl.col("rank") != rank)
    scope = steps if stretch is None else steps.filter(pl.col("step").is_in(stretch))
    other_steps = scope.filter(pl.col("rank") != rank)
    waited = others["wait_us"].sum() / max(other_steps.height, 1)
    step_us = other_steps["window_us"].mean() or 0.0
    if step_us <= 0 or waited < min_wait_share * step_us:  # type: ignore[operator]
        return None
    own = rows.filter(pl.col("rank") == rank)["wait_us"].mean() or 0.0
    files = _files(ctx, [rank])
    host = next(iter(_hosts(files, [rank])), None)
    where = f"steps {_steps_text(stretch)}" if stretch else "the whole trace"
    begin, end = rows["arrival_us"].min(), rows["last_arrival_us"].max()
    lateness = rows.filter(pl.col("rank") == rank)
    worst = lateness.join(
        others.group_by(*COLLECTIVE).agg(pl.col("arrival_us").max().alias("next")), on=COLLECTIVE
    ).with_columns(late_us=pl.col("arrival_us") - pl.col("next"))
    late = worst["late_us"].median() or 0.0
    return Finding(
        severity=Severity.WARNING,
        title=f"Rank {rank}{f' on {host}' if host else ''} arrives last at {times} of {collectives} collectives, "
        f"{for_it / total:.0%} of the others' waiting"
        + (f", in the slow steps {_steps_text(stretch)}" if stretch else ""),
        summary=(
            f"In {where}, rank {rank} started {times} of the {collectives} collectives matched across "
            f"{rows['rank'].n_unique()} ranks' profiler traces last, a median {late / 1e3:,.2f} ms after the "
            f"rank before it; {for_it / total:.0%} of the time the other ranks waited at them was for it, "
            f"{waited / 1e3:,.2f} ms per step in all ({waited / step_us:.0%} of their {step_us / 1e3:,.1f} ms "
            f"steps), while rank {rank} itself waited {own / 1e3:,.2f} ms per collective."
        ),
        evidence=_trace_evidence(files, [rank]),
        hosts=[host] if host else [],
        ranks=[rank],
        window=_window(begin, end),
        cost_seconds=float(others["wait_us"].sum()) / 1e6 / max(others["rank"].n_unique(), 1),
    )


@rule(
    "TL432",
    "gpu-waits-for-host",
    Severity.WARNING,
    kind="cause",
    needs=("trace_spans",),
    settings={
        "share": Setting("share of the step", "A rank whose median step's GPU waits for its host longer than this."),
        "critical_share": Setting("share of the step", "Above this median share the finding is critical."),
    },
)
def gpu_waits_for_host(ctx: RunContext, *, share: float = 0.1, critical_share: float = 0.3) -> Iterator[Finding]:
    """
    What it finds: from the ranks' profiler traces, per rank and ProfilerStep, the time the GPU sat
    idle waiting for its host: idle stretches between GPU spans whose next kernel, copy or set was
    launched only after the GPU had gone idle (Holistic Trace Analysis's "host wait"), when the
    median step of some rank waits more than `share` of its time; and how much of that wait the
    rank's data loader was fetching a batch (its `enumerate(DataLoader)` span).

    Why it slows the run: a GPU runs only what the CPU has queued. When the host is late (it is
    still loading or preprocessing the next batch, or Python and launch overhead cannot keep up
    with kernels that finish in microseconds), the GPU idles and the step takes that much longer;
    in a data-parallel job the other ranks then wait for this one at the next collective.

    How to fix: for a data loader, more `DataLoader` workers (`num_workers`), `pin_memory=True`,
    `prefetch_factor`, `persistent_workers=True`, faster storage or preprocessing off the training
    process; for launch overhead, larger batches or fused kernels, CUDA graphs
    (`torch.compile(mode="reduce-overhead")`), and fewer host syncs (`.item()`, `.cpu()`, prints of
    tensors) inside the step.
    """
    waits = ctx.trace_host_waits
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null(), pl.col("basis") == "gpu", pl.col("window_us") > 0)
    if waits.height == 0 or steps.height == 0:
        return
    per_step = steps.select("rank", "step", "start_us", "window_us").join(waits, on=["rank", "step"], how="left")
    per_rank = (
        per_step.with_columns(pl.col("host_wait_us", "loader_us").fill_null(0.0))
        .with_columns(waited=pl.col("host_wait_us") / pl.col("window_us"))
        .group_by("rank")
        .agg(
            pl.col("waited").median().alias("median"),
            pl.col("host_wait_us").sum(),
            pl.col("loader_us").sum(),
            pl.col("step").filter(pl.col("waited") > share).alias("over"),
            pl.len().alias("steps"),
            pl.col("start_us").min().alias("begin"),
            (pl.col("start_us") + pl.col("window_us")).max().alias("end"),
        )
        .filter(pl.col("median") > share)
        .sort("median", "rank", descending=[True, False])
    )
    if per_rank.height == 0:
        return
    worst = per_rank.row(0, named=True)
    ranks = per_rank["rank"].to_list()
    files = _files(ctx, ranks)
    loader = per_rank["loader_us"].sum() >= 0.5 * per_rank["host_wait_us"].sum()
    why = "its data loader was fetching the next batch" if loader else "the host launched too little, too late"
    parts = [
        f"rank {r['rank']}: {r['median']:.0%} of the median step ({r['host_wait_us'] / 1e3:,.1f} ms in "
        f"{count(r['steps'], 'step')}, {r['loader_us'] / max(r['host_wait_us'], 1e-9):.0%} of it while the data "
        f"loader ran; over {share:.0%} in steps {_steps_text(sorted(r['over']))[:120]})"
        for r in per_rank.head(MAX_STEPS_SHOWN).iter_rows(named=True)
    ]
    yield Finding(
        severity=Severity.CRITICAL if worst["median"] > critical_share else Severity.WARNING,
        title=f"GPU idle waiting for the host: {worst['median']:.0%} of the median step on rank {worst['rank']}"
        + (" (data loader)" if loader else " (CPU-bound launch)"),
        summary="The GPU ran out of queued work and waited for its host, mostly while "
        + why
        + ": "
        + "; ".join(parts)
        + ".",
        evidence=_trace_evidence(files, ranks),
        hosts=_hosts(files, ranks),
        ranks=ranks,
        window=_window(worst["begin"], worst["end"]),
        cost_seconds=float(per_rank["host_wait_us"].max()) / 1e6,
    )
