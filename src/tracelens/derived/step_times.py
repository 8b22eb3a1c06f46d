"""Step times, their robust baseline and the slow windows: shared by the TL4xx rules and the report.

A *stream* is one engine of one rank in one file. Its step time comes from the best
evidence the log has (`basis`):

- "iteration": the whole iteration as Megatron or the pipeline engine reports it;
- "timers": wall_clock_breakdown's forward + backward + optimizer step (GPU time, so data
  loading between steps is not in it);
- "timestamps": the time between two progress lines divided by the steps between them
  (everything: data loading, evaluation, checkpoints).

The baseline is a centred rolling median over BASELINE_ROWS rows, and the spread its
rolling median absolute deviation: a window of slow steps shorter than half of that does
not move it, and no fixed number of milliseconds is assumed anywhere.

Everything here works stream by stream, so a run's series is computed and read a group of whole
streams at a time (derived.stream_groups): a big run's steps never sit in memory whole, and what
its groups give is what one pass over all of them gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

import polars as pl

from tracelens.derived.stream_groups import StreamGroups, split
from tracelens.tables import Frame

STREAM = ["file", "host", "rank", "engine"]
BASELINE_ROWS = 201
WARMUP_ROWS = 2  # DeepSpeed's own ThroughputTimer skips the first two steps too
MIN_SPREAD = 0.02  # spread floor, as a share of the baseline: very steady runs are not flagged for jitter
MERGE_GAP_ROWS = 2  # slow rows this close belong to one window
TIMERS_MS = pl.col("fwd_ms") + pl.col("bwd_ms") + pl.col("step_ms")  # wall_clock_breakdown's timed step


@dataclass(frozen=True)
class SlowSteps:
    """What makes a step slow (a config's [steps] table): more than `slow_ratio` times the rolling
    median of its log's step time and more than `slow_sigmas` robust standard deviations above it;
    or, in a stretch of `sustained_steps` logged steps or more that the rolling median absorbs, more
    than `sustained_ratio` times the log's fast quartile. A stretch that cost less than
    `min_cost_share` of the run's step time is not worth a finding."""

    slow_ratio: float = 1.5
    slow_sigmas: float = 6.0
    sustained_ratio: float = 1.25
    sustained_steps: int = 10
    min_cost_share: float = 0.01


def _streams_of(steps: pl.LazyFrame) -> pl.LazyFrame:
    """The step rows as step_series takes them: rank and engine filled, the rows with a step."""
    return steps.with_columns(pl.col("rank").fill_null(-1), pl.col("engine").fill_null("0")).filter(
        pl.col("step").is_not_null()
    )


def step_groups(steps: Frame, slow: SlowSteps, folder: Path | None = None) -> list[StreamGroups]:
    """The step series by the best timing (step_series) and by wall time (`wall`), computed a group of
    whole streams at a time: a table in memory is one group; a big spilled one is split into groups
    written under `folder` (the run's working folder), and each series is written there too."""
    rows = (
        StreamGroups(STREAM, [steps]) if isinstance(steps, pl.DataFrame) else split(steps, STREAM, folder, _streams_of)
    )
    return rows.map([partial(step_series, slow=slow), partial(step_series, wall=True, slow=slow)])


def step_series(steps: pl.DataFrame, wall: bool = False, slow: SlowSteps = SlowSteps()) -> pl.DataFrame:
    """Per stream and step: time_ms (by basis), steps_covered, gap_ms, comm_ms, compute_ms, baseline_ms,
    slow. gap_ms is the wall time per step since the step line before, where the printed times measure
    it. `wall`: time every step by its step lines' timestamps, whatever timers the log has (a stall in
    the data loader or a checkpoint is between the timers, not in them)."""
    timers = TIMERS_MS
    prev_ts, prev_step = pl.col("ts").shift().over(STREAM), pl.col("step").shift().over(STREAM)
    covered = (pl.col("step") - prev_step).cast(pl.Float64)
    per_step_gap = (pl.col("ts") - prev_ts).dt.total_microseconds() / 1000 / covered
    # v0.1 stamps whole seconds: too coarse to time a step
    fine_ts = (pl.col("ts").dt.millisecond() != 0).any().over(STREAM)
    paced = pl.col("ts_paced") & pl.col("ts_paced").shift().over(STREAM)  # both ends of the gap (_paced)
    gap = pl.when((covered > 0) & fine_ts & paced).then(per_step_gap)
    if wall:  # no iteration time and no timers: the basis falls to the timestamps
        timers = pl.lit(None, pl.Float64)
        steps = steps.with_columns(pl.lit(None, pl.Float64).alias("iter_ms"))
    series = (
        steps.with_columns(pl.col("rank").fill_null(-1), pl.col("engine").fill_null("0"))
        .filter(pl.col("step").is_not_null())
        .sort([*STREAM, "step"], nulls_last=True)
        .pipe(_paced)
        .with_columns(gap_ms=gap)
        .with_columns(
            pl.coalesce(pl.col("iter_ms"), timers, pl.col("gap_ms")).alias("time_ms"),
            pl.when(pl.col("iter_ms").is_not_null())
            .then(pl.lit("iteration"))
            .when(timers.is_not_null())
            .then(pl.lit("timers"))
            .otherwise(pl.lit("timestamps"))
            .alias("basis"),
            pl.when(pl.col("iter_ms").is_null() & timers.is_null()).then(covered).otherwise(1.0).alias("steps_covered"),
            pl.when(pl.any_horizontal(pl.col("bwd_allreduce_ms", "optimizer_allgather_ms").is_not_null()))
            .then(pl.sum_horizontal("bwd_allreduce_ms", "optimizer_allgather_ms"))
            .alias("comm_ms"),  # null where no collective timer was logged
            (pl.col("fwd_ms") + pl.coalesce("bwd_inner_ms", pl.col("bwd_ms") - pl.col("bwd_allreduce_ms"))).alias(
                "compute_ms"
            ),
        )
    )
    return _baseline(series, slow)


def _paced(series: pl.DataFrame) -> pl.DataFrame:
    """Steps whose line printed no time (DeepSpeed's timers every step, its progress line every
    steps_per_print steps) placed among their stream's printed times, where the timeline alone would put
    them all at the midpoint of the lines around them (or at the last line before a hang). Between two
    printed times each step takes its timed length (iteration or timers) plus an equal share of the
    time the timers leave out, so a stretch of slow steps starts where its timers rise, not spread over
    the whole print interval; without timers for every step there, the steps go at the even pace the
    printed times show. Steps before the first or after the last printed time take the share (or the
    pace) of the nearest interval. `series` is sorted by stream and step. `ts_printed` says which rows'
    times were printed, `ts_paced` which lie between two printed times."""
    if "ts_quality" not in series.columns:
        return series.with_columns(ts_printed=pl.lit(True), ts_paced=pl.lit(True))
    exact = (pl.col("ts_quality").fill_null("exact") == "exact") & pl.col("ts").is_not_null()  # null: as given
    us = pl.col("ts").dt.epoch("us").cast(pl.Float64)
    known = series.with_columns(
        _lo_us=pl.when(exact).then(us).forward_fill().over(STREAM),
        _lo_step=pl.when(exact).then(pl.col("step")).forward_fill().over(STREAM),
        _hi_us=pl.when(exact).then(us).backward_fill().over(STREAM),
        _hi_step=pl.when(exact).then(pl.col("step")).backward_fill().over(STREAM),
        _w=pl.coalesce("iter_ms", TIMERS_MS) * 1000,  # the step's timed length, us
        ts_printed=exact,
    )
    step, lo_step, hi_step, w = pl.col("step"), pl.col("_lo_step"), pl.col("_hi_step"), pl.col("_w")
    # every row belongs to the interval that ends at the next printed row (itself, if printed)
    interval = [*STREAM, "_hi_step"]
    known = known.with_columns(
        _start_us=pl.col("_lo_us").shift().over(STREAM), _start_step=lo_step.shift().over(STREAM)
    )
    span, start = pl.col("_hi_us") - pl.col("_start_us"), pl.col("_start_step")
    rows, timed = pl.len().over(interval), w.sum().over(interval)
    whole = (rows == hi_step - start) & (w.null_count().over(interval) == 0)  # every step there, timed
    share = pl.when(whole).then(((span - timed) / rows).clip(lower_bound=0))  # untimed time per step
    known = known.with_columns(
        _share=share,
        _first_share=share.backward_fill().over(STREAM),
        _last_share=share.forward_fill().over(STREAM),
        _pace=pl.when(exact & (hi_step > start)).then(span / (hi_step - start)),  # us per step
    ).with_columns(
        _first_pace=pl.col("_pace").backward_fill().over(STREAM), _last_pace=pl.col("_pace").forward_fill().over(STREAM)
    )
    done = w.cum_sum().over(interval) + pl.int_range(1, pl.len() + 1).over(interval) * pl.col("_share")
    length = timed + rows * pl.col("_share")  # the interval's steps end to end: 0 when nothing timed them
    weighted = pl.col("_start_us") + done * span / length
    rest = (w + pl.col("_first_share")).sum().over(interval) - (w + pl.col("_first_share")).cum_sum().over(interval)
    after = pl.when(hi_step.is_null()).then(w + pl.col("_last_share")).cum_sum().over(*STREAM, "_lo_step")
    placed_us = (
        pl.when(exact)
        .then(None)
        .when(hi_step > lo_step)
        .then(
            pl.when(length > 0)
            .then(weighted)
            .otherwise(
                pl.col("_lo_us") + (pl.col("_hi_us") - pl.col("_lo_us")) * (step - lo_step) / (hi_step - lo_step)
            )
        )
        .when(lo_step.is_null())
        .then(pl.coalesce(pl.col("_hi_us") - rest, pl.col("_hi_us") - (hi_step - step) * pl.col("_first_pace")))
        .when(hi_step.is_null())
        .then(pl.coalesce(pl.col("_lo_us") + after, pl.col("_lo_us") + (step - lo_step) * pl.col("_last_pace")))
    )
    kind = series.schema["ts"]
    placed = pl.from_epoch(placed_us.cast(pl.Int64), time_unit="us").dt.cast_time_unit(kind.time_unit)
    if kind.time_zone:
        placed = placed.dt.replace_time_zone("UTC").dt.convert_time_zone(kind.time_zone)
    return known.with_columns(ts=pl.coalesce(placed, "ts"), ts_paced=exact | (lo_step < hi_step).fill_null(False)).drop(
        "_lo_us",
        "_lo_step",
        "_hi_us",
        "_hi_step",
        "_w",
        "_start_us",
        "_start_step",
        "_share",
        "_first_share",
        "_last_share",
        "_pace",
        "_first_pace",
        "_last_pace",
    )


def _baseline(series: pl.DataFrame, limits: SlowSteps) -> pl.DataFrame:
    index = pl.int_range(pl.len()).over(STREAM)
    timed = pl.col("time_ms").is_not_null() & (index >= WARMUP_ROWS)
    t = pl.when(timed).then(pl.col("time_ms"))
    window = dict(window_size=BASELINE_ROWS, center=True, min_samples=1)
    base = t.rolling_median(**window).over(STREAM)
    series = series.with_columns(base.alias("baseline_ms"))
    spread = (t - pl.col("baseline_ms")).abs().rolling_median(**window).over(STREAM) * 1.4826
    spread = pl.max_horizontal(spread, pl.col("baseline_ms") * MIN_SPREAD)
    slow = (
        timed
        & (pl.col("baseline_ms") > 0)
        & (pl.col("time_ms") > limits.slow_ratio * pl.col("baseline_ms"))
        & (pl.col("time_ms") - pl.col("baseline_ms") > limits.slow_sigmas * spread)
    )
    return series.with_columns(slow.fill_null(False).alias("slow"))


@dataclass(frozen=True)
class Window:
    """Consecutive slow steps of one stream."""

    file: str
    host: str | None
    rank: int
    engine: str
    first_step: int
    last_step: int
    rows: int  # slow rows (one per logged step)
    steps: int  # steps inside, counting those between progress lines
    ratio: float  # median time over baseline inside
    baseline_ms: float
    peak_ms: float
    cost_s: float  # time lost against the baseline
    start: datetime | None
    end: datetime | None
    basis: str
    lines: tuple[int, ...]
    comm_ratio: float | None  # comm time inside over the stream's median, where timers show it
    compute_ratio: float | None
    stall: bool = False  # a step that stalled (_stalls_apart), kept apart from the slow steps around it
    imbalance: bool = False  # this rank's forward rose against its peers' (imbalance.py), whatever the step time did

    @property
    def label(self) -> str:
        return (
            f"step {self.first_step}"
            if self.first_step == self.last_step
            else f"steps {self.first_step}-{self.last_step}"
        )


# what the windows and the run time read of a series
WINDOW_COLUMNS = [*STREAM, "step", "line", "ts", "basis", "time_ms", "baseline_ms", "slow", "steps_covered"]
WINDOW_COLUMNS += ["comm_ms", "compute_ms"]


@dataclass(frozen=True)
class Timed:
    """A step series and what its streams give, read in one pass over its groups: the slow windows
    and the sustained ones (costliest first), and the run time: the total step time of the longest
    stream, what a window's cost is measured against."""

    series: StreamGroups
    windows: list[Window]
    sustained: list[Window]
    run_time_s: float


def timed(series: StreamGroups, slow: SlowSteps = SlowSteps()) -> Timed:
    """The windows and run time of `series`, a group of whole streams at a time (each group's windows
    costliest first, then all of them: the stable sort keeps stream order among equal costs)."""
    windows: list[Window] = []
    sustained: list[Window] = []
    totals: list[float] = []
    for frame in series.frames(WINDOW_COLUMNS):
        windows += slow_windows(frame)
        sustained += sustained_windows(frame, slow)
        totals += _stream_totals(frame)
    by_cost = partial(sorted, key=lambda w: -w.cost_s)
    return Timed(series, by_cost(windows), by_cost(sustained), float(max(totals, default=0.0) or 0.0))


def slow_windows(series: pl.DataFrame) -> list[Window]:
    """The slow windows of every stream, costliest first (only the streams with a slow step are looked at)."""
    windows = []
    for key, stream in series.filter(pl.col("slow").any().over(STREAM)).group_by(STREAM, maintain_order=True):
        stream = stream.with_row_index("i")
        slow_rows = stream.filter(pl.col("slow"))["i"].to_list()
        for first, last in runs_of(slow_rows):
            inside = stream.filter(pl.col("i").is_between(first, last) & pl.col("slow"))
            windows += [replace(window_of(key, stream, part), stall=stall) for part, stall in _stalls_apart(inside)]
    return sorted(windows, key=lambda w: -w.cost_s)


def sustained_windows(series: pl.DataFrame, slow: SlowSteps = SlowSteps()) -> list[Window]:
    """Long slow stretches the rolling baseline absorbs (a slowdown that lasts, or ramps up over
    tens of steps): steps slower than `sustained_ratio` x the stream's lower quartile (its usual
    pace, as long as most of the stream is not slow), for `sustained_steps` logged steps or more;
    or stretches of spikes between steps at the usual pace, as packet loss makes them (each lost
    packet stalls one step for a retransmission timeout): steps over that ratio make up DENSE_SHARE
    of every `sustained_steps` or more, twice the share usual for the stream, with DENSE_SPIKES steps
    or more among them slow by the rolling baseline, and the stretch as a whole ran `sustained_ratio`
    slower. The windows are measured against that quartile."""
    index = pl.int_range(pl.len()).over(STREAM)
    usual = pl.col("time_ms").filter(pl.int_range(pl.len()) >= WARMUP_ROWS).quantile(0.25).over(STREAM)
    marked = series.with_columns(baseline_ms=usual, _spike=pl.col("slow").fill_null(False), _i=index).with_columns(
        over=(
            (pl.col("_i") >= WARMUP_ROWS)
            & (pl.col("baseline_ms") > 0)  # a 0 ms pace (steps shorter than their stamps resolve) is no baseline
            & (pl.col("time_ms") > slow.sustained_ratio * pl.col("baseline_ms"))
        ).fill_null(False)
    )
    density = pl.col("over").cast(pl.Float64).rolling_mean(slow.sustained_steps, center=True, min_samples=1)
    marked = marked.with_columns(_density=density.over(STREAM))
    # where slow steps are as dense all run long (a busy shared machine), a dense stretch stands out from nothing
    usual_density = pl.max_horizontal(pl.lit(DENSE_SHARE), 2 * pl.col("_density").median().over(STREAM))
    marked = marked.with_columns(dense=pl.col("_density") >= usual_density).with_columns(
        _stretch=(pl.col("dense") != pl.col("dense").shift()).fill_null(True).cum_sum().over(STREAM)
    )
    # a stretch of spikes runs from its first step over the ratio to its last, not as far as the density reaches
    at, stretch = pl.when(pl.col("over")).then(pl.col("_i")), [*STREAM, "_stretch"]
    within = pl.col("_i").is_between(at.min().over(stretch), at.max().over(stretch))
    spiked = pl.col("_spike").sum().over(stretch) >= DENSE_SPIKES
    marked = marked.with_columns(slow=pl.col("over") | (pl.col("dense") & within & spiked).fill_null(False))
    marked = marked.drop("over", "dense", "_density", "_spike", "_i", "_stretch")
    return [
        w
        for w in slow_windows(marked)
        if w.rows >= slow.sustained_steps and w.cost_s * 1000 >= (slow.sustained_ratio - 1) * w.baseline_ms * w.steps
    ]


DENSE_SHARE = 0.3  # of the steps around it slower than the sustained ratio: a stretch of dense spikes
DENSE_SPIKES = 2  # steps among them slow by the rolling baseline (slow_ratio, slow_sigmas): spikes, not a drift
STALL_RATIO = 5.0  # a step this many times its stream's usual step stalled: an event of its own


def _stalls_apart(inside: pl.DataFrame) -> list[tuple[pl.DataFrame, bool]]:
    """A slow stretch cut at its stalls, each part with whether it stalled: a step that took STALL_RATIO x
    its stream's usual step or more, and as much more than the other slow steps around it (a dead
    link's one 14 s step among a busy start's 1 s steps), is a window of its own, and so is each run
    of slow steps around it, so that each gets its own cause."""
    took = inside["time_ms"]
    stalled = (took >= STALL_RATIO * inside["baseline_ms"]).fill_null(False)
    around = took.filter(~stalled).median()  # the slow steps around it: a straggler's are all long
    if around is not None:
        stalled &= took >= STALL_RATIO * around
    if not stalled.any() or stalled.all():
        return [(inside, bool(stalled.all()))]
    piece = (stalled | stalled.shift(1, fill_value=False)).cum_sum()
    parts = inside.with_columns(piece=piece, stalled=stalled).group_by("piece", maintain_order=True)
    return [(part.drop("piece", "stalled"), bool(part["stalled"][0])) for _, part in parts]


def runs_of(rows: list[int]) -> list[tuple[int, int]]:
    """Row numbers as runs (first, last), rows MERGE_GAP_ROWS apart or closer in one."""
    runs: list[tuple[int, int]] = []
    for i in rows:
        if runs and i - runs[-1][1] <= MERGE_GAP_ROWS + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def window_of(key: tuple, stream: pl.DataFrame, inside: pl.DataFrame) -> Window:
    """The Window of `inside`, slow rows of `stream` (a stream's series, whose key is `key`)."""
    file, host, rank, engine = key
    steps_covered = inside["steps_covered"].fill_null(1.0)
    lost = ((inside["time_ms"] - inside["baseline_ms"]) * steps_covered).sum() / 1000
    first_step = int(inside["step"][0] - steps_covered[0] + 1)
    return Window(
        file=file, host=host, rank=rank, engine=engine,
        first_step=first_step, last_step=int(inside["step"][-1]), rows=inside.height, steps=int(steps_covered.sum()),
        ratio=float((inside["time_ms"] / inside["baseline_ms"]).median()),
        baseline_ms=float(inside["baseline_ms"].median()), peak_ms=float(inside["time_ms"].max()),
        cost_s=float(lost), start=inside["ts"].min(), end=inside["ts"].max(), basis=inside["basis"][0],
        lines=tuple(inside["line"].to_list()), comm_ratio=ratio_of_medians(inside["comm_ms"], stream["comm_ms"]),
        compute_ratio=ratio_of_medians(inside["compute_ms"], stream["compute_ms"]),
    )  # fmt: skip


def ratio_of_medians(now: pl.Series, typical: pl.Series) -> float | None:
    """Median of `now` over median of `typical`; None when either has no value (a slow window whose
    timer values are missing) or the typical one is zero."""
    a, b = now.median(), typical.median()
    return float(a / b) if a is not None and b else None


def _stream_totals(series: pl.DataFrame) -> list[float]:
    """Each stream's total step time (s), correctly rounded (math.fsum over its rows, which the series
    holds in a run per stream): a sum whose order does not matter, so that a group of streams gives what
    the whole series gives (polars sums a stream that is a slice of a bigger frame with the slices before
    it, so its last bit moves with its place in the frame)."""
    took = (pl.col("time_ms") * pl.col("steps_covered").fill_null(1.0)).fill_null(0.0)
    values = series.select(took).to_series().to_numpy()
    ends = series.group_by(STREAM, maintain_order=True).len()["len"].cum_sum().to_list()
    return [math.fsum(values[start:end].tolist()) / 1000 for start, end in zip([0, *ends], ends)]


# -- slow episodes: one per slow stretch of the job, whatever the number of logs that saw it ------

MAX_WINDOWS = 10  # the costliest stretches get a finding each (TL401, TL410); the rest are counted
MARGIN = timedelta(seconds=5)  # events this close to a window still belong to it (log and dump times are coarse)
COMM_BOUND_SHARE = 0.35  # the default of TL402's and TL504's comm_bound_share: the all-reduce's median share of a step
EPISODE_MARGIN_S = 5.0  # windows of different streams this close belong to one stretch
NOISE_SHARE = 0.05  # a stretch stands out when fewer than this share of equally long stretches outside it are as slow
MIN_BEFORE_ROWS = 10  # a stretch with fewer steady steps before it is the run's start-up
# A slow stretch shorter than this is as long as the bursts a shared machine makes (another job's
# burst, a page-cache flush), however many steps fit in it: told, not warned of, unless another
# source rose with it (TL410).
BRIEF = timedelta(seconds=10)


@dataclass(frozen=True)
class Episode:
    """A slow stretch of the run: the slow windows of every step stream (timed by their timers or
    by their timestamps) that overlap in time."""

    begin: datetime  # the start of the first slow step (its line is printed at its end)
    end: datetime
    windows: tuple[Window, ...]
    share: float  # of the run's step time
    ordinary: str = ""  # why the stretch does not stand out from the run (start-up, brief, its noise), else ""
    startup: bool = False  # the run's start-up: nothing steady before it to compare with

    @property
    def worst(self) -> Window:
        return max(self.windows, key=lambda w: w.cost_s)

    @property
    def stall(self) -> bool:
        """A stall: one step (or a few) that took many times the usual, not a slow stretch."""
        return all(w.stall for w in self.windows)

    @property
    def imbalance(self) -> bool:
        """Seen only in the ranks' imbalance (imbalance.py): the step times did not single it out."""
        return all(w.imbalance for w in self.windows)

    @property
    def cost_s(self) -> float:
        return self.worst.cost_s  # every rank waits for the slowest: the run lost the worst stream's time, not the sum

    @property
    def streams(self) -> int:
        """How many logs (rank and engine in a file) saw it."""
        return len({(w.file, w.host, w.rank, w.engine) for w in self.windows})


def slow_episodes(
    series: Timed, wall: Timed, slow: SlowSteps = SlowSteps(), imbalanced: Sequence[Window] = ()
) -> list[Episode]:
    """The run's slow stretches that cost at least `slow.min_cost_share` of its step time, costliest first;
    windows seen by several logs, by timers (`series`, step_series) or by timestamps (`wall`, step_series
    with `wall`), or in the ranks' imbalance (`imbalanced`: imbalance_windows of `series`), are one episode."""
    found: list[tuple[datetime, datetime, Window, float]] = []  # first step's start, last time, window, run
    for side, extra in ((series, list(imbalanced)), (wall, [])):
        total = side.run_time_s or 1.0
        costly = [
            w
            for w in side.windows + side.sustained + extra
            if w.start is not None and w.end is not None and w.cost_s >= slow.min_cost_share * total
        ]
        for w, begin in zip(costly, _first_step_starts(side.series, costly)):
            found.append((begin, w.end, w, total))  # type: ignore[arg-type]
    margin = timedelta(seconds=EPISODE_MARGIN_S)
    slow_stretches = _merged([f for f in found if not f[2].stall], margin)
    # a stall is an episode of its own, next to slow steps (a dead link after a busy start), but one
    # among a slow stretch's steps is part of it (a lossy link stalls some steps for a timeout)
    stalls = [
        f
        for f in found
        if f[2].stall
        and not any(first - margin <= f[0] and f[1] <= end + margin for first, end, _, _ in slow_stretches)
    ]
    slow_stretches = _lulls_joined(slow_stretches, [(f[0], f[1]) for f in stalls])
    for begin, last, w, total in found:
        if w.stall and not any(f[2] is w for f in stalls):
            i = next(
                i
                for i, (first, end, _, _) in enumerate(slow_stretches)
                if first - margin <= begin and last <= end + margin
            )
            first, end, group, run = slow_stretches[i]
            slow_stretches[i] = (first, end, [*group, w], max(run, total))
    merged = slow_stretches + _merged(stalls, margin)
    episodes = []
    for b, e, ws, run in merged:
        stream = _worst_stream(wall.series, ws)
        imbalance = all(w.imbalance for w in ws)
        # the step times say nothing of a stretch only the imbalance shows: its edges and its standing
        # out are the imbalance's own (measured against the rank's usual excess)
        begin, end = (b, e) if imbalance else _trimmed(stream, b, e)
        ordinary, startup = _ordinary(stream, begin, end, all(w.stall for w in ws))
        if imbalance and not startup:
            ordinary = ""
        episodes.append(Episode(begin, end, tuple(ws), max(w.cost_s for w in ws) / run, ordinary, startup))
    return sorted(episodes, key=lambda ep: -ep.cost_s)


def _merged(
    found: list[tuple[datetime, datetime, Window, float]], margin: timedelta
) -> list[tuple[datetime, datetime, list[Window], float]]:
    """Windows (first step's start, last time, window, run time) this close in time, as one stretch each."""
    merged: list[tuple[datetime, datetime, list[Window], float]] = []
    for begin, last, w, total in sorted(found, key=lambda s: s[0]):
        if merged and begin <= merged[-1][1] + margin:
            first, end, group, run = merged[-1]
            merged[-1] = (first, max(end, last), [*group, w], max(run, total))
        else:
            merged.append((begin, last, [w], total))
    return merged


def spike_events(spikes: Sequence[Window]) -> list[list[Window]]:
    """Isolated spikes of several logs at the same moment, as one event each: every rank waits at the
    same step, so the job lost the worst log's time once, not once per log. Spikes with no time are
    events of their own."""
    timed = [(w.start, w.end, w, 0.0) for w in spikes if w.start is not None and w.end is not None]
    usual = timedelta(milliseconds=max((w.baseline_ms for w in spikes), default=0.0))
    events = [group for _, _, group, _ in _merged(timed, usual)]  # type: ignore[arg-type]
    return events + [[w] for w in spikes if w.start is None or w.end is None]


def _lulls_joined(
    stretches: list[tuple[datetime, datetime, list[Window], float]], stalls: list[tuple[datetime, datetime]]
) -> list[tuple[datetime, datetime, list[Window], float]]:
    """Slow stretches (in time order) parted by a lull shorter than each of them and holding no stall,
    as one: a fault that comes and goes (random loss stalls some steps, not all) leaves such lulls,
    and judging each part alone would take the fault's other part for the run's baseline. A stall
    in the lull is an event of its own between them (a dead link after a busy start), the run's
    start-up is its own (warm-up, no fault), and a stretch is never joined past half the run: the
    run's baseline is its ordinary time, and a run that wanders between paces all along is its own
    noise."""
    joined: list[tuple[datetime, datetime, list[Window], float]] = []
    for first, end, group, run in stretches:
        if joined:
            b, e, g, r = joined[-1]
            calm = not any(e <= s_end and s_begin <= first for s_begin, s_end in stalls)
            minority = (max(e, end) - b).total_seconds() < max(r, run) / 2
            startup = min(w.first_step for w in g) <= WARMUP_ROWS + MIN_BEFORE_ROWS
            if calm and minority and not startup and first - e < min(e - b, end - first):
                joined[-1] = (b, max(e, end), [*g, *group], max(r, run))
                continue
        joined.append((first, end, group, run))
    return joined


def _worst_stream(wall: StreamGroups, windows: list[Window]) -> pl.DataFrame:
    """The wall step times (time_ms, start, ts) of the stream with the costliest window."""
    worst = max(windows, key=lambda w: w.cost_s)
    stream = wall.stream((worst.file, worst.host, worst.rank, worst.engine))
    stream = stream.filter(pl.col("time_ms").is_not_null(), pl.col("ts").is_not_null())
    took = pl.duration(microseconds=(pl.col("time_ms") * pl.col("steps_covered").fill_null(1.0) * 1000).cast(pl.Int64))
    return stream.with_columns(start=pl.col("ts") - took)


def _ordinary(stream: pl.DataFrame, begin: datetime, end: datetime, stall: bool) -> tuple[str, bool]:
    """Why the stretch [begin, end] does not stand out from its run, or "" when it does, and whether
    that is because it is the run's start-up. It is the run's start-up when fewer than
    MIN_BEFORE_ROWS steady steps precede it (nothing before it to compare with: compilation,
    warm-up, a machine busy at launch); it is brief when it is no stall and
    lasts less than BRIEF; it is the run's own noise when
    NOISE_SHARE or more of the equally long stretches outside it (rolling medians over as many
    steps) were as slow as its median step. Measured on the wall step times of the costliest log,
    so a busy shared machine that wanders between 1x and 3x all run long does not make its 2x a finding
    (`stream`: _worst_stream)."""
    if stream.height == 0:
        return "", False
    steady = stream.slice(WARMUP_ROWS)
    # the steps that ran within [begin, end] (a step's line is printed at its end, `start` is the line before)
    within = (pl.col("start") >= begin - timedelta(milliseconds=1)) & (pl.col("ts") <= end)
    inside = steady.filter(within)
    outside = steady.filter(~within)
    if steady.filter(pl.col("ts") < begin).height < MIN_BEFORE_ROWS:
        return f"start-up: fewer than {MIN_BEFORE_ROWS} steady steps before it to compare with", True
    if not stall and end - begin < BRIEF:
        return (
            f"brief: {inside.height} steps over {(end - begin).total_seconds():.1f} s, as short as the bursts of "
            "a busy machine"
        ), False
    rows = max(3, min(inside.height, outside.height // 2))
    level = inside["time_ms"].median()
    stretches = outside["time_ms"].rolling_median(rows).drop_nulls()
    if level is None or stretches.len() < 2:
        return "", False
    as_slow = float((stretches >= level).mean())
    if as_slow < NOISE_SHARE:
        return "", False
    return (
        f"within the run's own variability: {as_slow:.0%} of the {rows}-step stretches outside it were as slow "
        f"(median {level:.0f} ms per step)"
    ), False


def _trimmed(stream: pl.DataFrame, begin: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The window's edges without the merely noisy steps joined to it: on the costliest stream's wall
    times, the run of steps inside [begin, end] that most exceeds the midpoint between the steps'
    median inside and outside (the maximum-sum run over step time minus that midpoint). Real runs on
    busy machines have slowish steps around a slow stretch; the midpoint keeps the stretch itself
    (`stream`: _worst_stream)."""
    inside = stream.filter(pl.col("start") >= begin - timedelta(milliseconds=1), pl.col("ts") <= end)
    outside_ms = stream.filter((pl.col("ts") < begin) | (pl.col("start") > end))["time_ms"].median()
    if inside.height < 3 or outside_ms is None:
        return begin, end
    mid = (float(inside["time_ms"].median()) + outside_ms) / 2
    best, best_run, run_sum, run_first = 0.0, None, 0.0, 0
    for i, ms in enumerate(inside["time_ms"].to_list()):
        if run_sum <= 0:
            run_sum, run_first = 0.0, i
        run_sum += ms - mid
        if run_sum > best:
            best, best_run = run_sum, (run_first, i)
    if best_run is None:
        return begin, end
    first, last = best_run
    return max(begin, inside["start"][first]), min(end, inside["ts"][last])


def _first_step_starts(series: StreamGroups, windows: Sequence[Window]) -> list[datetime | None]:
    """When each window's first slow step began (its line is printed at its end): one query for them all."""
    if not windows:
        return []
    at = pl.DataFrame(
        {
            "window": [i for i, w in enumerate(windows) for _ in w.lines],
            "file": [w.file for w in windows for _ in w.lines],
            "line": [line for w in windows for line in w.lines],
        },
        schema={"window": pl.Int64, "file": pl.String, "line": pl.Int64},
    )
    took = pl.duration(microseconds=(pl.col("time_ms") * pl.col("steps_covered").fill_null(1.0) * 1000).cast(pl.Int64))
    starts = (
        series.scan()
        .select("file", "line", start=pl.col("ts") - took)
        .join(at.lazy(), on=["file", "line"])
        .group_by("window")
        .agg(pl.col("start").min())
        .collect(engine="streaming")
    )
    begun = dict(zip(starts["window"].to_list(), starts["start"].to_list()))
    return [begun.get(i) for i in range(len(windows))]
