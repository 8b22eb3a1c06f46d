"""The timeline, the report's centre: one chart with time across (UTC), the step time on top and
a lane per host and source below (NCCL events, counter rises, packet events), the windows of
the root-cause and slow-step findings shaded and numbered, and each host's GPU utilisation when
nvidia-smi or DCGM sampled it (tracelens.hostsignals); then each finding's window linked to its evidence, the logs'
zone as the timeline decided it, and the clock offsets it measured and applied."""

from __future__ import annotations

import altair as alt
import polars as pl

from tracelens import steps as timing
from tracelens.events import CAUSES, network_events
from tracelens.hostsignals import gpu_lanes
from tracelens.report.charts import to_svg

ORDER = 0
TITLE = "Timeline"
TEMPLATE = "sections/timeline.html.j2"

WIDTH = 900
MAX_STREAMS = 4  # step streams drawn (the ones with most steps)
MAX_POINTS = 600  # per stream; longer runs are averaged over bins of steps
BINS = 300  # packet and NCCL events are counted per this share of the time span
SHADED = {"TL401", "TL404"}  # besides the correlation findings (score > 0): the slow steps and stragglers
MAX_SHADES = 8
ISO = "%Y-%m-%dT%H:%M:%S%.3fZ"
LABEL_ROWS = 4  # staggered rows of window labels
X_AXIS = alt.Axis(format="%H:%M:%S", title="time (UTC)", labelAngle=0)
CAUSE_COLOURS = {"link": "#b3261e", "congestion": "#e37400", "socket": "#6a1b9a", "receiver": "#00796b",
                 "failure": "#5f6368", "stall": "#000000", "straggler": "#1565c0"}


def context(analysis) -> dict | None:
    """The run on one UTC axis: step time, event lanes per host, finding windows, clocks and zone."""
    tables = analysis.tables
    events = network_events(tables)
    series = timing.step_series(tables["steps"]).filter(pl.col("ts").is_not_null(), pl.col("time_ms").is_not_null())
    windows = [(i, f) for i, f in enumerate(analysis.findings, start=1) if f.window]
    gpus = gpu_lanes(tables["gpu_samples"])
    if events.height == 0 and series.height == 0 and not windows and gpus.height == 0:
        return None
    return {
        "chart": _chart(series, events, windows, gpus),
        "windows": [_window_row(i, f) for i, f in windows],
        "zone": analysis.timeline.notes[0] if analysis.timeline.notes else "",
        "offsets": analysis.timeline.offsets.to_dicts(),
    }


def _window_row(index: int, finding) -> dict:
    start, end = finding.window
    return {
        "index": index, "rule": finding.rule_id, "severity": finding.severity.label, "title": finding.title,
        "start": f"{start:%Y-%m-%d %H:%M:%S}", "end": f"{end:%H:%M:%S}", "seconds": (end - start).total_seconds(),
        "where": ", ".join(finding.hosts + finding.ports),
    }


def _iso(column: str) -> pl.Expr:
    return pl.col(column).dt.convert_time_zone("UTC").dt.strftime(ISO)


def _chart(series: pl.DataFrame, events: pl.DataFrame, windows: list, gpus: pl.DataFrame) -> str:
    x = alt.X("t:T", scale=alt.Scale(type="utc"), axis=X_AXIS)
    shades = [{"from": f.window[0].isoformat(), "to": f.window[1].isoformat(), "finding": f"#{i} {f.rule_id}"}
              for i, f in windows if f.score > 0 or f.rule_id in SHADED][:MAX_SHADES]
    # Labels of windows that start close together would print over each other: stagger them in rows.
    for row, shade_ in enumerate(sorted(shades, key=lambda s: s["from"])):
        shade_["offset"] = 12 * (row % LABEL_ROWS)
    shade = alt.Chart(alt.Data(values=shades)).mark_rect(color="#b3261e", opacity=0.12).encode(
        x=alt.X("from:T", scale=alt.Scale(type="utc"), axis=X_AXIS), x2="to:T"
    )
    labels = alt.Chart(alt.Data(values=shades)).mark_text(align="left", dx=2, dy=6, baseline="top", fontSize=10).encode(
        x=alt.X("from:T", scale=alt.Scale(type="utc")), y=alt.Y("offset:Q", scale=None, axis=None), text="finding:N"
    )
    panels = []
    if series.height:
        steps = _binned_steps(series)
        line = alt.Chart(alt.Data(values=steps.to_dicts())).mark_line(point=False).encode(
            x=x, y=alt.Y("ms:Q", title="ms per step"), color=alt.Color("stream:N", legend=alt.Legend(orient="top", title=None))
        )
        panels.append(alt.layer(shade, line, labels).properties(width=WIDTH, height=180))
    if gpus.height:
        util = alt.Chart(alt.Data(values=gpus.to_dicts())).mark_line().encode(
            x=x, y=alt.Y("util:Q", title="GPU util. %", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("host:N", legend=alt.Legend(orient="top", title=None)),
        )
        panels.append(alt.layer(shade, util).properties(width=WIDTH, height=90))
    if events.height:
        lanes = _lanes(events)
        order = sorted({lane["lane"] for lane in lanes})
        y = alt.Y("lane:N", sort=order, title=None)
        colour = alt.Color("cause:N", scale=alt.Scale(domain=[CAUSES[c] for c in CAUSE_COLOURS], range=list(CAUSE_COLOURS.values())),
                           legend=alt.Legend(orient="bottom", title=None))
        data = alt.Chart(alt.Data(values=lanes))
        intervals = data.transform_filter("datum.source == 'counters'").mark_bar(opacity=0.5, height=10).encode(x=x, x2="t2:T", y=y, color=colour)
        points = data.transform_filter("datum.source != 'counters'").mark_tick(thickness=2).encode(
            x=x, y=y, color=colour, size=alt.Size("count:Q", scale=alt.Scale(range=[8, 18]), legend=None)
        )
        panels.append(alt.layer(shade, intervals, points).properties(width=WIDTH, height=24 * len(order) + 10))
    if not panels:
        panels.append(alt.layer(shade, labels).properties(width=WIDTH, height=40))
    return to_svg(alt.vconcat(*panels).resolve_scale(x="shared", color="independent"))


def _binned_steps(series: pl.DataFrame) -> pl.DataFrame:
    """Step time over time per stream (the streams with most steps), averaged over bins of steps when long."""
    counts = series.group_by(timing.STREAM).len().sort("len", descending=True).head(MAX_STREAMS)
    chosen = series.join(counts.select(timing.STREAM), on=timing.STREAM, how="semi", nulls_equal=True)
    label = pl.format("{} rank {}", pl.col("host").fill_null("?"), pl.col("rank"))
    size = max(1, -(-counts["len"].max() // MAX_POINTS))
    return (
        chosen.sort("ts")
        .with_columns(stream=label, bin=pl.int_range(pl.len()).over(timing.STREAM) // size)
        .group_by("stream", "bin")
        .agg(pl.col("ts").max(), ms=pl.col("time_ms").mean())
        .select("stream", _iso("ts").alias("t"), "ms")
        .sort("stream", "t")
    )


def _lanes(events: pl.DataFrame) -> list[dict]:
    """One mark per lane (host, source) and bin of time and cause; counter rises keep their interval."""
    span = (events.select(pl.coalesce("hi", "lo").max()).item() - events["lo"].min()).total_seconds()
    width_ms = max(1, int(span * 1000 / BINS))
    lane = pl.format("{} · {}", pl.col("host").fill_null("?"), "source")
    named = events.with_columns(lane=lane, cause=pl.col("cause").replace_strict(CAUSES))
    counters = named.filter(pl.col("source") == "counters").select("lane", "source", "cause", "count", _iso("lo").alias("t"), _iso("hi").alias("t2"))
    instant = (
        named.filter(pl.col("source") != "counters")
        .with_columns(pl.col("lo").dt.truncate(f"{width_ms}ms"))
        .group_by("lane", "source", "cause", "lo")
        .agg(pl.col("count").sum())
        .select("lane", "source", "cause", "count", _iso("lo").alias("t"), pl.lit(None, pl.String).alias("t2"))
    )
    return pl.concat([counters, instant]).to_dicts()
