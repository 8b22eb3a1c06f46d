"""The timeline, the report's centre: one chart with time across (UTC), the step time on top and
a lane per host and source below (NCCL events, counter rises, packet events), a lane per rank of
its profiler trace's steps (those where it arrived last at most collectives, or its GPU waited for
the host, marked; tracelens.derived.traces), the windows of the root-cause and slow-step findings
shaded and numbered, and each host's GPU utilisation when
nvidia-smi or DCGM sampled it (tracelens.derived.hostsignals); then each finding's window linked to
its evidence, the logs' zone as the timeline decided it, and the clock offsets it measured and
applied."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext, step_times
from tracelens.derived.events import CAUSES
from tracelens.derived.hostsignals import gpu_lanes
from tracelens.derived.stream_groups import StreamGroups
from tracelens.ingest.profiler.kineto import EPOCH_MIN_US
from tracelens.report import svg

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 0
TITLE = "Timeline"
TEMPLATE = "sections/timeline.html.j2"

WIDTH = 900
MAX_STREAMS = 4  # step streams drawn (the ones with most steps)
MAX_POINTS = 600  # per stream; longer runs are averaged over bins of steps
BINS = 300  # packet and NCCL events are counted per this share of the time span
SHADED = {"TL401", "TL404"}  # besides the correlation findings (score > 0): the slow steps and stragglers
MAX_SHADES = 8
LANE_PX = 22
MAX_HOST_LANES = 16  # hosts given their own lanes (those the findings name); the rest share one lane
CAUSE_COLOURS = {
    "link": "#b3261e",
    "congestion": "#e37400",
    "socket": "#6a1b9a",
    "receiver": "#00796b",
    "failure": "#5f6368",
    "stall": "#000000",
    "straggler": "#1565c0",
}


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """The run on one UTC axis: step time, event lanes per host, finding windows, clocks and zone."""
    events = ctx.network_events
    steps, span = _binned_steps(ctx.step_series)
    windows = [(i, f) for i, f in enumerate(analysis.findings, start=1) if f.window]
    gpus = gpu_lanes(ctx["gpu_samples"])
    traced = _trace_steps(ctx)
    if events.height == 0 and steps.height == 0 and not windows and gpus.height == 0 and traced.height == 0:
        return None
    affected = {h for f in analysis.findings for h in f.hosts}
    return {
        "chart": _chart(steps, span, events, windows, gpus, affected, traced),
        "windows": [_window_row(i, f) for i, f in windows],
        "zone": analysis.timeline.notes[0] if analysis.timeline.notes else "",
        "offsets": analysis.timeline.offsets.to_dicts(),
    }


def _window_row(index: int, finding) -> dict:
    start, end = finding.window
    return {
        "index": index,
        "rule": finding.rule_id,
        "severity": finding.severity.label,
        "title": finding.title,
        "start": f"{start:%Y-%m-%d %H:%M:%S}",
        "end": f"{end:%H:%M:%S}",
        "seconds": (end - start).total_seconds(),
        "where": ", ".join(finding.hosts + finding.ports),
    }


TRACE_STATES = {  # a traced step's mark, by what happened in it (the first that applies)
    "arrived last at most of its collectives": "#1565c0",
    "GPU idle waiting for the host": "#000000",
    "profiled step": "#bdbdbd",
}
HOST_WAIT_SHARE = 0.1  # a step whose GPU waited for the host this share of it is marked so (TL432's default)


def _trace_steps(ctx: RunContext) -> pl.DataFrame:
    """Per rank and ProfilerStep with wall-clock times: its lane, UTC edges and state (TRACE_STATES);
    the first MAX_HOST_LANES ranks."""
    steps = ctx.trace_breakdown.filter(pl.col("step").is_not_null(), pl.col("start_us") > EPOCH_MIN_US)
    if steps.height == 0:
        return pl.DataFrame(schema={"lane": pl.String, "lo": pl.Float64, "hi": pl.Float64, "colour": pl.String})
    ranks = sorted(steps["rank"].unique().to_list())[:MAX_HOST_LANES]
    last, waited, plain = (pl.lit(c) for c in TRACE_STATES.values())
    return (
        steps.filter(pl.col("rank").is_in(ranks))
        .join(ctx.trace_waits.select("rank", "step", "last", "collectives"), on=["rank", "step"], how="left")
        .join(ctx.trace_host_waits.select("rank", "step", "host_wait_us"), on=["rank", "step"], how="left")
        .sort("rank", "step")
        .select(
            lane=pl.concat_str(pl.lit("rank "), "rank", pl.lit(" · trace")),
            lo=pl.col("start_us") / 1e6,
            hi=(pl.col("start_us") + pl.col("window_us")) / 1e6,
            colour=pl.when(2 * pl.col("last").fill_null(0) > pl.col("collectives").fill_null(0))
            .then(last)
            .when(pl.col("host_wait_us").fill_null(0.0) > HOST_WAIT_SHARE * pl.col("window_us"))
            .then(waited)
            .otherwise(plain),
        )
    )


def _chart(
    steps: pl.DataFrame,
    span: list,
    events: pl.DataFrame,
    windows: list,
    gpus: pl.DataFrame,
    affected: set[str],
    traced: pl.DataFrame,
) -> str:
    times = list(span)
    if traced.height:
        times += [datetime.fromtimestamp(traced["lo"].min(), timezone.utc)]
        times += [datetime.fromtimestamp(traced["hi"].max(), timezone.utc)]
    if events.height:
        times += [events["lo"].min(), events.select(pl.coalesce("hi", "lo").max()).item()]
    times += [t for _, f in windows for t in f.window] + ([gpus["ts"].min(), gpus["ts"].max()] if gpus.height else [])
    lo, hi = svg.epoch_seconds([min(times), max(times)])
    fig = svg.Figure(lo, hi, "time (UTC)", width=WIDTH, time=True)
    shades = [
        (f.window[0].timestamp(), f.window[1].timestamp(), f"#{i} {f.rule_id}")
        for i, f in windows
        if f.score > 0 or f.rule_id in SHADED
    ][:MAX_SHADES]
    if steps.height:
        top = fig.panel(180, "ms per step", y_range=(0.0, float(steps["ms"].max() or 1.0)))
        svg.bands(top, shades)
        streams = steps.group_by("stream", maintain_order=True)
        svg.lines(top, ((s[0], rows["ts"].to_list(), rows["ms"].to_list()) for s, rows in streams))
    if gpus.height:
        util = fig.panel(90, "GPU util. %", y_range=(0.0, 100.0))
        svg.bands(util, [(a, b, "") for a, b, _ in shades])
        hosts = _gpu_series(gpus, affected).group_by("host", maintain_order=True)
        svg.lines(util, ((h[0], rows["ts"].to_list(), rows["util"].to_list()) for h, rows in hosts))
    if events.height:
        lanes = _lanes(events, affected)
        order = _lane_order(lanes, affected)
        panel = fig.panel(LANE_PX * len(order) + 10, lanes=order)
        svg.bands(panel, [(a, b, "") for a, b, _ in shades])
        counters = lanes.filter(pl.col("source") == "counters")
        colour = pl.col("cause").replace_strict(CAUSE_COLOURS, default="#5f6368")
        counters = counters.with_columns(colour=colour)
        svg.intervals(
            panel,
            svg.epoch_seconds(counters["lo"].to_list()),
            svg.epoch_seconds(counters["hi"].to_list()),
            counters["lane"].to_list(),
            counters["colour"].to_list(),
        )
        instant = lanes.filter(pl.col("source") != "counters").with_columns(
            colour=colour, size=(pl.col("count").log10() / 3).clip(0, 1)
        )
        svg.ticks(
            panel,
            svg.epoch_seconds(instant["lo"].to_list()),
            instant["lane"].to_list(),
            instant["colour"].to_list(),
            instant["size"].to_list(),
        )
        panel.legend.update({CAUSES[c]: CAUSE_COLOURS[c] for c in CAUSE_COLOURS if c in set(lanes["cause"].to_list())})
    if traced.height:
        order = list(dict.fromkeys(traced["lane"].to_list()))
        panel = fig.panel(LANE_PX * len(order) + 10, lanes=order)
        svg.bands(panel, [(a, b, "") for a, b, _ in shades])
        svg.intervals(
            panel, traced["lo"].to_list(), traced["hi"].to_list(), traced["lane"].to_list(), traced["colour"].to_list()
        )
        used = set(traced["colour"].to_list())
        panel.legend.update({label: colour for label, colour in TRACE_STATES.items() if colour in used})
    if not fig.panels:
        svg.bands(fig.panel(40), shades)
    return svg.render(fig)


def _gpu_series(gpus: pl.DataFrame, affected: set[str]) -> pl.DataFrame:
    """A line per host when there are few, else the hosts the findings name (up to MAX_HOST_LANES)
    and the mean of the others as one line."""
    hosts = sorted(set(gpus["host"].to_list()))
    if len(hosts) <= MAX_HOST_LANES // 2:
        return gpus.sort("host", "ts")
    shown = [h for h in hosts if h in affected][: MAX_HOST_LANES // 2]
    rest = gpus.filter(~pl.col("host").is_in(shown))
    folded = (
        rest.group_by("ts")
        .agg(pl.col("util").mean())
        .with_columns(host=pl.lit(f"mean of {len(hosts) - len(shown)} other hosts"))
    )
    return pl.concat(
        [gpus.filter(pl.col("host").is_in(shown)).sort("host", "ts"), folded.select("host", "ts", "util").sort("ts")]
    )


def _binned_steps(series: StreamGroups) -> tuple[pl.DataFrame, list]:
    """Step time over time per stream (the streams with most timed steps), averaged over bins of steps when
    long, and the first and last time of the run's timed steps (none without). The series is read a group
    of whole streams at a time, for the streams' lengths and spans, then for the rows of those drawn."""
    timed = pl.col("ts").is_not_null() & pl.col("time_ms").is_not_null()
    columns = [*step_times.STREAM, "ts", "time_ms"]
    counts = pl.concat(
        frame.filter(timed).group_by(step_times.STREAM).agg(pl.len(), first=pl.col("ts").min(), last=pl.col("ts").max())
        for frame in series.frames(columns)
    )
    span = [t for t in (counts["first"].min(), counts["last"].max()) if t is not None]
    # equal lengths: the stream's names decide which are kept
    counts = counts.sort(
        "len", *step_times.STREAM, descending=[True, *[False] * len(step_times.STREAM)], nulls_last=True
    ).head(MAX_STREAMS)
    chosen = pl.concat(
        frame.filter(timed).join(counts.select(step_times.STREAM), on=step_times.STREAM, how="semi", nulls_equal=True)
        for frame in series.frames(columns)
    )
    label = pl.format("{} rank {}", pl.col("host").fill_null("?"), pl.col("rank"))
    size = max(1, -(-(counts["len"].max() or 0) // MAX_POINTS))
    binned = (
        chosen.sort("ts", maintain_order=True)
        .with_columns(stream=label, bin=pl.int_range(pl.len()).over(step_times.STREAM) // size)
        .group_by("stream", "bin")
        .agg(pl.col("ts").max(), ms=pl.col("time_ms").mean())
        .sort("stream", "ts", "bin")  # steps logged in the same second keep their order
        .select("stream", "ts", "ms")
    )
    return binned, span


def _lanes(events: pl.DataFrame, affected: set[str]) -> pl.DataFrame:
    """One mark per lane and bin of time and cause; counter rises keep their interval. A lane is a
    (host, source) of a host some finding names, or of the rest of the hosts folded into one."""
    span = (events.select(pl.coalesce("hi", "lo").max()).item() - events["lo"].min()).total_seconds()
    width_ms = max(1, int(span * 1000 / BINS))
    hosts = events["host"].drop_nulls().unique()
    shown = set(affected) if len(affected) <= MAX_HOST_LANES else set(sorted(affected)[:MAX_HOST_LANES])
    others = hosts.filter(~hosts.is_in(list(shown))).len()
    folded = f"{others} other host{'s' if others != 1 else ''}"
    # rows that name no host have a lane of their own ("?"), not the folded one: "0 other hosts" was theirs
    host = (
        pl.when(pl.col("host").is_null())
        .then(pl.lit("?"))
        .when(pl.col("host").is_in(list(shown)) | pl.lit(not shown))
        .then(pl.col("host"))
        .otherwise(pl.lit(folded))
    )
    lane = pl.format("{} · {}", host, "source")
    named = events.with_columns(lane=lane)
    counters = named.filter(pl.col("source") == "counters").select("lane", "source", "cause", "count", "lo", "hi")
    instant = (
        named.filter(pl.col("source") != "counters")
        .with_columns(pl.col("lo").dt.truncate(f"{width_ms}ms"))
        .group_by("lane", "source", "cause", "lo", maintain_order=True)
        .agg(pl.col("count").sum())
        .select("lane", "source", "cause", "count", "lo", pl.col("lo").alias("hi"))
    )
    return pl.concat([counters, instant])


def _lane_order(lanes: pl.DataFrame, affected: set[str]) -> list[str]:
    """The lanes of hosts a finding names first, then the others, the folded lane last."""
    names = sorted(set(lanes["lane"].to_list()))
    return sorted(names, key=lambda lane: (lane.split(" · ")[0] not in affected, lane[0].isdigit(), lane))
