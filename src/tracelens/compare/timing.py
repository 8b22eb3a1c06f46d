"""Step times of two runs side by side: the job's pace per step and where inside the step it went.

A step of the job takes as long as its ranks take on average (they wait for each other in every
collective, so the ranks' times move together); its parts are DeepSpeed's timers: forward, backward
compute, the all-reduce (backward all-reduce plus ZeRO's all-gather), the optimizer step, and the
time between steps outside the timers (data loading, logging), where the log times are fine enough.
Means are additive, so the parts of a change add up to the change of the whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracelens.derived import RunContext, step_times
from tracelens.derived.stream_groups import split
from tracelens.stats import mann_whitney_p, rate_rise_p

PHASES = {
    "forward": pl.col("fwd_ms"),
    "backward compute": pl.coalesce("bwd_inner_ms", pl.col("bwd_ms") - pl.col("bwd_allreduce_ms"), "bwd_ms"),
    "all-reduce": pl.col("comm_ms"),
    "optimizer step": pl.col("step_ms") - pl.col("optimizer_allgather_ms").fill_null(0.0),
}
OUTSIDE = "between steps"  # wall time not in the timers: data loading, logging, checkpoints
SIGNIFICANT_P = 0.001
SLOW_STEP = 1.5  # a step this many times the good run's median is a slow step
MIN_SLOW_SHARE = 0.02  # of the slow run's steps, for a stretch of slow steps to count
MIN_CHANGE = 0.05  # of the good run's step time: smaller shifts are run-to-run noise, however certain


@dataclass(frozen=True)
class Pace:
    """One run's step times: per step of the job, its time and the time of each part."""

    per_step: pl.DataFrame  # step, time_ms, one column per phase (null when the log has no such timer)
    samples_per_sec: float | None
    comm_share: float | None

    @property
    def mean_ms(self) -> float:
        return float(self.per_step["time_ms"].mean())  # type: ignore[arg-type]

    @property
    def median_ms(self) -> float:
        return float(self.per_step["time_ms"].median())  # type: ignore[arg-type]

    @property
    def p95_ms(self) -> float:
        return float(self.per_step["time_ms"].quantile(0.95))  # type: ignore[arg-type]


@dataclass(frozen=True)
class PhaseChange:
    phase: str
    good_ms: float
    bad_ms: float
    p: float
    significant: bool

    @property
    def delta_ms(self) -> float:
        return self.bad_ms - self.good_ms


@dataclass(frozen=True)
class SlowStepShares:
    """Steps over SLOW_STEP x the good run's median, in each run: a slowdown confined to a window
    moves this share long before it moves the distribution as a whole."""

    threshold_ms: float
    good: int
    good_of: int
    bad: int
    bad_of: int
    p: float

    @property
    def significant(self) -> bool:
        share_good, share_bad = self.good / max(1, self.good_of), self.bad / max(1, self.bad_of)
        return self.p < SIGNIFICANT_P and share_bad >= 2 * share_good and share_bad >= MIN_SLOW_SHARE

    @property
    def text(self) -> str:
        return (f"{self.bad / max(1, self.bad_of):.0%} of the slow run's steps took over {self.threshold_ms:,.0f} ms "
                f"({SLOW_STEP}x the good run's median), against "
                f"{self.good / max(1, self.good_of):.0%} of the good run's")  # fmt: skip


@dataclass(frozen=True)
class PaceChange:
    """How the job's step time moved between the runs, and which parts moved it."""

    good: Pace
    bad: Pace
    p: float
    significant: bool
    phases: tuple[PhaseChange, ...]
    slow_steps: SlowStepShares

    @property
    def slower(self) -> bool:
        """Whether the slow run really is slower: on the whole, or in a stretch of slow steps."""
        return (self.significant and self.delta_ms > 0) or self.slow_steps.significant

    @property
    def delta_ms(self) -> float:
        """Mean step time, bad minus good: means add up, so the phases' deltas explain it."""
        return self.bad.mean_ms - self.good.mean_ms

    @property
    def relative(self) -> float:
        return self.delta_ms / self.good.mean_ms if self.good.mean_ms else 0.0

    def phase(self, name: str) -> PhaseChange | None:
        return next((p for p in self.phases if p.phase == name), None)


def pace(ctx: RunContext) -> Pace | None:
    """The job's pace from its step series; None when no step has a time. Each stream's steps are read
    a group of streams at a time, then the job's steps averaged a group of whole steps at a time."""
    index = pl.int_range(pl.len()).over(step_times.STREAM)
    wall = (
        (pl.col("ts") - pl.col("ts").shift().over(step_times.STREAM)).dt.total_microseconds()
        / 1000
        / pl.col("steps_covered")
    )
    timed = pl.col("basis") == "timers"

    def parts(series: pl.DataFrame) -> pl.DataFrame:
        series = series.filter((index >= step_times.WARMUP_ROWS) & pl.col("time_ms").is_not_null())
        return series.select(
            "step", "time_ms", "comm_ms", wall_ms=pl.when(timed & (wall > pl.col("time_ms"))).then(wall), **PHASES
        )

    read = ["ts", "step", "basis", "time_ms", "steps_covered", "comm_ms", "fwd_ms", "bwd_ms", "bwd_inner_ms"]
    read += ["bwd_allreduce_ms", "step_ms", "optimizer_allgather_ms"]
    (rows,) = ctx.step_series.map([parts], [*step_times.STREAM, *read])
    if rows.scan().head(1).collect().height == 0:
        return None
    per_step = pl.concat(
        frame.group_by("step").agg(
            pl.coalesce(pl.col("wall_ms"), pl.col("time_ms")).mean().alias("time_ms"),
            *[pl.col(name).mean() for name in PHASES],
            (pl.col("wall_ms") - pl.col("time_ms")).mean().alias(OUTSIDE),
        )
        for frame in split(rows.scan(), ["step"], ctx.workdir).frames()
    ).sort("step")
    throughput = ctx.scan("steps").select("samples_per_sec").drop_nulls().collect(engine="streaming")["samples_per_sec"]
    comm_share = rows.scan().select((pl.col("comm_ms") / pl.col("time_ms")).median()).collect(engine="streaming")
    return Pace(per_step, float(throughput.median()) if throughput.len() else None, comm_share.item())


def compare_pace(good: Pace, bad: Pace) -> PaceChange:
    """The step-time change and each part's share of it, each tested against its own spread."""
    floor = MIN_CHANGE * good.mean_ms

    def tested(column: str) -> tuple[float, float, float, bool] | None:
        if column not in good.per_step.columns or column not in bad.per_step.columns:
            return None
        a, b = good.per_step[column].drop_nulls(), bad.per_step[column].drop_nulls()
        if a.len() < 3 or b.len() < 3:
            return None
        p = mann_whitney_p(a.to_list(), b.to_list())
        g, s = float(a.mean()), float(b.mean())  # type: ignore[arg-type]
        return g, s, p, p < SIGNIFICANT_P and abs(s - g) >= floor

    phases = []
    for name in [*PHASES, OUTSIDE]:
        result = tested(name)
        if result:
            phases.append(PhaseChange(name, *result))
    whole = tested("time_ms")
    p, significant = (whole[2], whole[3]) if whole else (1.0, False)
    return PaceChange(good, bad, p, significant, tuple(phases), _slow_steps(good, bad))


def _slow_steps(good: Pace, bad: Pace) -> SlowStepShares:
    """The share of slow steps in each run, tested as a rate per step (tracelens.stats.rate_rise_p)."""
    threshold = SLOW_STEP * good.median_ms
    g = good.per_step["time_ms"].drop_nulls()
    b = bad.per_step["time_ms"].drop_nulls()
    n_good, n_bad = int((g > threshold).sum()), int((b > threshold).sum())
    return SlowStepShares(threshold, n_good, g.len(), n_bad, b.len(), rate_rise_p(n_bad, b.len(), n_good, g.len()))
