"""What the ranks' profiler traces say per rank and step (the spans of tracelens.ingest.profiler.kineto).

Temporal breakdown (Holistic Trace Analysis's definitions): on a rank's GPU, in a window of time,
computation is the time some computation kernel runs, communication the time some NCCL kernel
runs, of which *overlapped* is the part some computation kernel runs too and *exposed* the rest;
memory is the time only copies or sets run; idle is the time nothing runs. So
computation + exposed communication + memory + idle = the window. The windows are the rank's
steps on the GPU: from the first GPU span launched by ProfilerStep#N to the first launched by
step N+1 (the last step ends with its last span), and, for the whole trace, the first span's start
to the last one's end (HTA's span). A span running past its window's end is cut there and its
rest counted in the windows after. A rank without GPU spans (a CPU-only gloo run) is measured on
its CPU: the step's span is the window, the collective calls are communication, the top-level
ops the rest of the step are computation (nothing overlaps on one thread).

Arrivals: every rank's trace has the same collectives in the same order, so a collective is
matched across ranks by its process group and its sequence number (`Seq`, when the trace has
it) or else its position among the group's collectives of its step. A rank *arrives* when its
NCCL kernel starts (on a GPU) or its collective call starts (CPU only); the collective cannot
finish before the last arrival, so each rank *waits* last arrival minus its arrival. The ranks'
clocks differ between machines: a collective ends at about the same moment on every rank, so a
machine's clock offset is the median, over the collectives, of how much later its ranks' ends are
than the median end; arrivals are corrected by it. A machine is the host its traces name
(`host_name`), else the run's host: ranks of one machine share a clock, whatever folders the run
puts them in.
`wait_by_duration_us` (a rank's collective time minus the shortest rank's) needs no clock at all:
on a GPU the NCCL kernel's time is the waiting plus the transfer.

The timing model (docs/timing-model.md) gets per rank and step its own work (the step less its
exposed communication), its exposed communication and its wait for the last rank (step_levels),
judged inside a slow window against outside it (window_signals). On the GPU, idle time that waited
for the host to launch work is measured apart (host_waits).
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from tracelens.derived.baseline import Baseline
from tracelens.derived.window_signals import Signal, _level

GPU_KINDS = ("kernel", "memcpy", "memset")
RANK_STEP = ["rank", "step"]
COLLECTIVE = ["pg", "step", "key"]  # one collective of the job, as the arrivals' rows name it
MIN_OFFSET_COLLECTIVES = 3  # matched collectives a host needs for its clock offset to be estimated
TIE_US = 1.0  # ranks arriving within this of each other arrived together: none of them came last

BREAKDOWN_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,  # null: the whole trace
    "basis": pl.String,  # gpu or cpu
    "start_us": pl.Float64,
    "window_us": pl.Float64,
    "computation_us": pl.Float64,
    "communication_us": pl.Float64,
    "overlapped_comm_us": pl.Float64,
    "exposed_comm_us": pl.Float64,
    "memory_us": pl.Float64,
    "idle_us": pl.Float64,
}


def _union_us(spans: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """Per group, the length of the union of its [start_us, end_us) intervals."""
    ordered = spans.sort([*by, "start_us"])
    reach = pl.col("end_us").cum_max().shift(1).over(by)
    segment = (reach.is_null() | (pl.col("start_us") > reach)).cum_sum().over(by)
    return (
        ordered.with_columns(_seg=segment)
        .group_by([*by, "_seg"])
        .agg(pl.col("start_us").min(), pl.col("end_us").max())
        .group_by(by)
        .agg(((pl.col("end_us") - pl.col("start_us")).sum()).alias("union_us"))
    )


# the span classes each measure unites: computation, communication, either, and any of the three
_MEASURED = ("computation", "communication", "memory")
_UNIONS = {"c": (0,), "m": (1,), "cm": (0, 1), "all": (0, 1, 2)}
_NO_WINDOW = -(1 << 62)  # a step number no trace writes: past a window's end, before the next one's start


def _swept(spans: pl.LazyFrame, windows: pl.LazyFrame) -> pl.LazyFrame:
    """Per rank and window, and per rank over all its spans (`step` null), the length of the union of
    each class set of _UNIONS (`spans`: rank, category, start_us, end_us; `windows`: rank, step,
    start_us, end_us). One sweep over the spans' starts and ends in time order, each class's count
    of running spans carried along: from one time to the next the same classes run, for that long, in
    the window open then (a span running over a window's end counts in the next ones)."""
    counts = [(pl.col("category") == c).cast(pl.Int32) for c in _MEASURED]
    zeros = [pl.lit(0, pl.Int32).alias(c) for c in _MEASURED]
    # in time order, and at one time in this order: a window's end before the next one's start
    events = pl.concat(
        [
            windows.select("rank", "step", t="end_us").with_columns(*zeros, step=pl.lit(_NO_WINDOW)),
            windows.select("rank", "step", t="start_us").with_columns(*zeros),
            *(
                spans.select("rank", t=edge, **{c: sign * n for c, n in zip(_MEASURED, counts)})
                for edge, sign in (("start_us", 1), ("end_us", -1))
            ),
        ],
        how="diagonal",
    ).collect()
    # two stable sorts: one of several keys costs several times more
    events = events.sort("t", maintain_order=True).sort("rank", maintain_order=True)
    # every rank's counts come back to 0 after its last end: one running sum serves all ranks
    same_rank = pl.col("rank").shift(-1) == pl.col("rank")
    running = [pl.col(c).cum_sum() > 0 for c in _MEASURED]
    swept = (
        events.lazy()
        .select(
            "rank",
            step=pl.col("step").forward_fill().over("rank"),
            length=pl.when(same_rank).then(pl.col("t").shift(-1) - pl.col("t")).otherwise(0.0),
            **{label: pl.any_horizontal(running[i] for i in among) for label, among in _UNIONS.items()},
        )
        .filter(pl.col("length") > 0)
    )
    sums = [(pl.col("length") * pl.col(label)).sum().alias(label) for label in _UNIONS]
    per_window = (
        swept.filter(pl.col("step").is_not_null(), pl.col("step") != _NO_WINDOW).group_by("rank", "step").agg(sums)
    )
    whole = swept.group_by("rank").agg(sums).with_columns(step=pl.lit(None, pl.Int64))
    return pl.concat([per_window, whole], how="diagonal")


def _measures(sums: pl.LazyFrame, windows: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """The breakdown in `windows` (by, basis, start_us, window_us) from the unions of _swept."""
    out = windows.join(sums, on=by, how="left", nulls_equal=True).with_columns(
        pl.col(label).fill_null(0.0) for label in _UNIONS
    )
    return out.select(
        *by,
        "basis",
        "start_us",
        "window_us",
        computation_us=pl.col("c"),
        communication_us=pl.col("m"),
        overlapped_comm_us=pl.col("c") + pl.col("m") - pl.col("cm"),
        exposed_comm_us=pl.col("cm") - pl.col("c"),
        memory_us=pl.col("all") - pl.col("cm"),
        idle_us=(pl.col("window_us") - pl.col("all")).clip(lower_bound=0.0),
    )


def _gpu_spans(spans: pl.LazyFrame) -> pl.LazyFrame:
    return spans.filter(pl.col("kind").is_in(GPU_KINDS)).select("rank", "step", "category", "start_us", "end_us")


def _gpu_windows(gpu: pl.LazyFrame) -> pl.LazyFrame:
    """Per rank and step, the step's window on the GPU: its first span's start to the next step's."""
    firsts = (
        gpu.filter(pl.col("step").is_not_null())
        .group_by(RANK_STEP)
        .agg(pl.col("start_us").min(), pl.col("end_us").max().alias("last_end"))
        .sort(RANK_STEP)
    )
    nxt = pl.col("start_us").shift(-1).over("rank")
    return firsts.with_columns(end_us=pl.coalesce(nxt, pl.col("last_end"))).select(
        *RANK_STEP, "start_us", "end_us", window_us=pl.col("end_us") - pl.col("start_us"), basis=pl.lit("gpu")
    )


def _cpu_breakdown(spans: pl.LazyFrame, gpu_ranks: pl.LazyFrame) -> pl.LazyFrame:
    """Ranks without GPU spans: per step, on the CPU, collective calls against the other top-level spans."""
    steps = spans.filter(pl.col("kind") == "step").join(gpu_ranks, on="rank", how="anti")
    windows = steps.select(*RANK_STEP, "start_us", "end_us", window_us="dur_us", basis=pl.lit("cpu"))
    work = spans.filter(
        pl.col("step").is_not_null(),
        (pl.col("kind") == "collective") | ((pl.col("depth") == 1) & pl.col("kind").is_in(["cpu_op", "annotation"])),
    ).select(
        "rank",
        "start_us",
        "end_us",
        category=pl.when(pl.col("kind") == "collective").then(pl.lit("communication")).otherwise(pl.lit("computation")),
    )
    work = work.join(windows.select("rank").unique(), on="rank", how="semi")
    return _measures(_swept(work, windows), windows.drop("end_us"), RANK_STEP)


def breakdown(spans: pl.LazyFrame) -> pl.DataFrame:
    """Per rank and step, and per rank over the whole trace (`step` null): the temporal breakdown."""
    spans = spans.filter(pl.col("rank").is_not_null())
    gpu = _gpu_spans(spans).collect().lazy()
    windows = _gpu_windows(gpu).collect().lazy()
    sums = _swept(gpu.drop("step"), windows).collect().lazy()
    per_step = _measures(sums, windows.drop("end_us"), RANK_STEP)
    whole_windows = gpu.group_by("rank").agg(
        pl.col("start_us").min(),
        window_us=pl.col("end_us").max() - pl.col("start_us").min(),
        basis=pl.lit("gpu"),
        step=pl.lit(None, pl.Int64),
    )
    whole = _measures(sums, whole_windows, RANK_STEP)
    cpu = _cpu_breakdown(spans, gpu.select("rank").unique())
    frames = [f.select(list(BREAKDOWN_SCHEMA)).cast(BREAKDOWN_SCHEMA) for f in (per_step, whole, cpu)]  # type: ignore[arg-type]
    return pl.concat(frames).collect().sort("rank", "step", nulls_last=True)


HOST_WAIT_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "host_wait_us": pl.Float64,  # the GPU idle until a kernel the host launched only after it had gone idle
    "loader_us": pl.Float64,  # the part of it while the rank's data loader ran (its `DataLoader` span)
    "gaps": pl.UInt32,  # idle stretches that waited for the host
}
LOADER = "DataLoader"  # in the name of the span PyTorch's profiler records around each batch fetched


def host_waits(spans: pl.LazyFrame) -> pl.DataFrame:
    """Per rank and step on the GPU, the idle time that waited for the host (Holistic Trace Analysis's
    "host wait"): an idle stretch between GPU spans whose next span was launched after the stretch
    began; the GPU had run out of work because the CPU had not yet asked for more (a slow data loader,
    Python overhead, launches too small for the GPU). The stretch belongs to the step of that span."""
    spans = spans.filter(pl.col("rank").is_not_null())
    gpu = spans.filter(pl.col("kind").is_in(GPU_KINDS), pl.col("step").is_not_null())
    reach = pl.col("end_us").cum_max().shift(1).over("rank")
    gaps = (
        gpu.sort("rank", "start_us")
        .with_columns(idle_from=reach)
        .filter(pl.col("start_us") > pl.col("idle_from"), pl.col("launch_us") >= pl.col("idle_from"))
        .select("rank", "step", begin="idle_from", end="start_us")
    )
    loader = spans.filter(pl.col("name").str.contains(LOADER, literal=True), pl.col("step").is_not_null()).select(
        "rank", "step", l_begin="start_us", l_end="end_us"
    )
    overlap = (pl.min_horizontal("end", "l_end") - pl.max_horizontal("begin", "l_begin")).clip(lower_bound=0.0)
    loaded = gaps.join(loader, on=RANK_STEP).group_by(RANK_STEP).agg(loader_us=overlap.sum())
    waits = gaps.group_by(RANK_STEP).agg(host_wait_us=(pl.col("end") - pl.col("begin")).sum(), gaps=pl.len())
    out = waits.join(loaded, on=RANK_STEP, how="left").with_columns(pl.col("loader_us").fill_null(0.0))
    return out.select(list(HOST_WAIT_SCHEMA)).cast(HOST_WAIT_SCHEMA).collect().sort(RANK_STEP)  # type: ignore[arg-type]


ARRIVAL_SCHEMA = {
    "rank": pl.Int64,
    "host": pl.String,
    "step": pl.Int64,
    "pg": pl.String,  # the process group's name, else the GPU stream ("stream 7"), else "default"
    "key": pl.Int64,  # the collective's sequence number, or its position in the group's collectives of the step
    "collective": pl.String,
    "arrival_us": pl.Float64,  # on the rank's clock corrected by its machine's offset
    "end_us": pl.Float64,
    "dur_us": pl.Float64,
    "clock_offset_us": pl.Float64,
    "last_arrival_us": pl.Float64,
    "wait_us": pl.Float64,  # last arrival minus this rank's
    "wait_by_duration_us": pl.Float64,  # this rank's collective time minus the shortest rank's
    "last": pl.Boolean,  # this rank arrived last (and not together with every other)
    "ranks": pl.UInt32,  # ranks whose traces have the collective
}


def _collective_rows(spans: pl.LazyFrame) -> pl.LazyFrame:
    """Each rank's collectives: its NCCL kernels when it has any, else its CPU collective calls."""
    kernels = spans.filter(pl.col("category") == "communication")
    has_kernels = kernels.select("rank").unique()
    calls = spans.filter(pl.col("kind") == "collective").join(has_kernels, on="rank", how="anti")
    # gloo runs a call's op on a worker thread, where no call holds it: a rank whose calls carry their
    # sequence number has each collective twice, once unnumbered
    numbered = pl.col("seq").is_not_null().any().over("rank")
    calls = calls.filter(pl.col("seq").is_not_null() | ~numbered)
    rows = pl.concat([kernels, calls], how="diagonal_relaxed").filter(pl.col("rank").is_not_null())
    # concat_str, not pl.format: format panics ("i < self.len()") in the streaming engine when a
    # filter empties a chunk between others, as here on a table concatenated from several files
    pg = pl.coalesce("pg_name", pl.concat_str(pl.lit("stream "), "stream"), pl.lit("default"))
    rows = rows.with_columns(pg=pg).sort("start_us")
    position = pl.int_range(pl.len()).over(["rank", "pg", "step"])
    return rows.select(
        "rank",
        "host",
        "file",
        "step",
        "pg",
        key=pl.coalesce("seq", position).cast(pl.Int64),
        collective=pl.coalesce("collective", "name"),
        arrival_us="start_us",
        end_us="end_us",
        dur_us="dur_us",
        keyed=pl.col("seq").is_not_null(),
    )


def arrivals(spans: pl.LazyFrame, ranks: pl.LazyFrame) -> pl.DataFrame:
    """Per collective matched across ranks, each rank's arrival, wait and whether it came last; `ranks`
    (trace_ranks) says which machine's clock each trace file was written on."""
    clocks = ranks.select("file", clock=pl.coalesce("host_name", "host"))
    rows = _collective_rows(spans).join(clocks, on="file", how="left")
    # without sequence numbers, the position counts within a step: the step is part of the match
    rows = rows.with_columns(_step=pl.when("keyed").then(pl.lit(None, dtype=pl.Int64)).otherwise("step"))
    match = ["pg", "_step", "key"]
    rows = rows.with_columns(ranks=pl.len().over(match)).filter(pl.col("ranks") > 1)
    rows = _with_offsets(rows, match)
    rows = rows.with_columns(arrival_us=pl.col("arrival_us") - pl.col("clock_offset_us"))
    last = pl.col("arrival_us").max().over(match)
    out = rows.with_columns(
        last_arrival_us=last,
        wait_us=last - pl.col("arrival_us"),
        wait_by_duration_us=pl.col("dur_us") - pl.col("dur_us").min().over(match),
        last=(pl.col("arrival_us") == last) & (last - pl.col("arrival_us").min().over(match) > TIE_US),
    )
    return out.select(list(ARRIVAL_SCHEMA)).cast(ARRIVAL_SCHEMA).collect().sort(*COLLECTIVE, "rank")  # type: ignore[arg-type]


def _with_offsets(rows: pl.LazyFrame, match: list[str]) -> pl.LazyFrame:
    """The rows with their machine's clock offset (`clock`: the ranks of one machine share its clock,
    whatever host names the run gives them)."""
    clocks = rows.select(pl.col("clock").n_unique()).collect().item()
    if clocks < 2:
        return rows.with_columns(clock_offset_us=pl.lit(0.0))
    late = (pl.col("end_us") - pl.col("end_us").median().over(match)).alias("late")
    per_clock = (
        rows.with_columns(late)
        .group_by("clock")
        .agg(pl.col("late").median().alias("clock_offset_us"), pl.len().alias("n"))
        .with_columns(
            clock_offset_us=pl.when(pl.col("n") >= MIN_OFFSET_COLLECTIVES).then("clock_offset_us").otherwise(0.0)
        )
        .drop("n")
    )
    return rows.join(per_clock, on="clock", how="left").with_columns(pl.col("clock_offset_us").fill_null(0.0))


def rank_waits(arrived: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step: collectives, the time spent waiting for later ranks, and how often it came last."""
    return (
        arrived.group_by(RANK_STEP)
        .agg(
            collectives=pl.len(),
            wait_us=pl.col("wait_us").sum(),
            wait_by_duration_us=pl.col("wait_by_duration_us").sum(),
            last=pl.col("last").sum(),
        )
        .sort(RANK_STEP)
    )


# -- the timing model's levels, from the traces (docs/timing-model.md) ------------------------------

# per rank and step: (column, cause, what it is, judged by its mean)
TRACE_LEVELS = (
    ("own_ms", "own", "own work (the step less its exposed communication, from its profiler trace)", False),
    ("wait_ms", "wait", "exposed communication (waiting for the last rank and the transfer, from its trace)", True),
    ("arrival_ms", "arrival", "waiting for the last rank to arrive at the collectives (from the traces)", True),
)


def step_levels(breakdown: pl.DataFrame, arrived: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step, the parts of the timing model the traces measure: `wait_ms` its exposed
    communication (a collective lasts from the rank's arrival to its end, its wait for the last rank
    plus the transfer; the part no computation hides is what the step waits), `own_ms` the rest of
    the step, `arrival_ms` its wait for the last rank alone (from its arrival to the last rank's, at
    any of the step's collectives); `end` the step's end in UTC."""
    steps = breakdown.filter(pl.col("step").is_not_null())
    # overlapped collectives (DDP's buckets) wait at once: the union of the waits, not their sum
    spans = arrived.lazy().select(*RANK_STEP, start_us="arrival_us", end_us="last_arrival_us")
    waited = _union_us(spans, RANK_STEP).select(*RANK_STEP, arrival_ms=pl.col("union_us") / 1000).collect()
    end_ns = ((pl.col("start_us") + pl.col("window_us")) * 1000).cast(pl.Int64)
    return steps.join(waited, on=RANK_STEP, how="left").select(
        *RANK_STEP,
        end=pl.from_epoch(end_ns, "ns").dt.replace_time_zone("UTC"),
        own_ms=(pl.col("window_us") - pl.col("exposed_comm_us")) / 1000,
        wait_ms=pl.col("exposed_comm_us") / 1000,
        arrival_ms=pl.col("arrival_ms").fill_null(0.0),
    )


def window_signals(
    levels: pl.DataFrame,
    begin: datetime,
    end: datetime,
    names: dict[int, tuple[str, str | None]],
    limits: Baseline,
) -> list[Signal]:
    """Per rank, its traced own work, time in collectives and wait for the last rank (step_levels) in
    the steps that ended inside [begin, end] against those outside, as window_signals judges the
    timers' levels; `names` gives each rank as the other step signals name it ("rank 2 (node02)")
    and its host."""
    signals = []
    for (rank,), steps in levels.filter(pl.col("rank").is_not_null()).group_by("rank", maintain_order=True):
        within = steps["end"].is_between(begin, end)
        inside, outside = steps.filter(within), steps.filter(~within)
        who, host = names.get(rank, (f"rank {rank}", None))
        for column, cause, what, mean in TRACE_LEVELS:
            level = _level(inside[column], outside[column], limits, mean=mean)
            if level.inside is None or level.outside is None:
                continue
            outcome = "rose" if level.rose else "fell" if level.fell else "no rise"
            times = f"{level.ratio:.2f}x, " if level.ratio is not None else ""
            signals.append(
                Signal(
                    "traces",
                    cause,
                    what,
                    who,
                    level.rose,
                    level.comparable,
                    f"{who}: {what}, {'mean' if mean else 'median'} per step {level.inside:.0f} ms in the window "
                    f"against {level.outside:.0f} ms outside it ({times}{outcome})",
                    (host,) if host else (),
                    rank=rank,
                    ratio=level.ratio,
                    change=level.inside - level.outside,
                )
            )
    return signals
