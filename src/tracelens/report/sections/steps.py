"""Step time: per engine, the step time and samples/sec over the steps with the slow windows
shaded, where each step's time went (forward, backward, all-reduce, optimizer), and the
worst windows. The windows are the ones the TL401 rule reports (tracelens.derived.step_times)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext, step_times
from tracelens.report import svg

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 40
TITLE = "Step time"
TEMPLATE = "sections/steps.html.j2"

MAX_POINTS = 600  # steps per chart; longer runs are averaged over bins of steps
MAX_CHARTS = 4  # streams charted (the ones with most steps); the table lists all
MAX_WINDOWS = 20
WIDTH = 900
PHASES = {  # stacked in this order, bottom first
    "forward": pl.col("fwd_ms"),
    "backward compute": pl.coalesce("bwd_inner_ms", pl.col("bwd_ms") - pl.col("bwd_allreduce_ms").fill_null(0)),
    "gradient all-reduce": pl.col("bwd_allreduce_ms"),
    "ZeRO all-gather": pl.col("optimizer_allgather_ms"),
    "optimizer": pl.col("step_ms") - pl.col("optimizer_allgather_ms").fill_null(0),
}


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """Per-stream step tables, the step-time and phase charts, the worst windows; None without steps."""
    if ctx.tables.height("steps") == 0:
        return None
    series, windows = ctx.step_series, ctx.slow_windows
    streams = pl.concat(
        frame.group_by(step_times.STREAM, maintain_order=True).agg(
            pl.len().alias("steps"),
            pl.col("step").min().alias("first"),
            pl.col("step").max().alias("last"),
            pl.col("basis").first(),
            pl.col("time_ms").median().alias("median_ms"),
            pl.col("samples_per_sec").median().alias("samples_per_sec"),
            pl.col("skipped").max().alias("skipped"),
        )
        for frame in series.frames([*step_times.STREAM, "step", "basis", "time_ms", "samples_per_sec", "skipped"])
    )
    charted = streams.sort("steps", descending=True, maintain_order=True).head(MAX_CHARTS)  # ties: in stream order
    charts = []
    for key in charted.select(step_times.STREAM).iter_rows():
        stream = series.stream(key)
        mine = [w for w in windows if (w.file, w.host, w.rank, w.engine) == key]
        charts.append({"title": _stream_label(*key), **_charts(stream, mine)})
    return {
        "streams": [
            r | {"label": _stream_label(r["file"], r["host"], r["rank"], r["engine"])} for r in streams.to_dicts()
        ],
        "charts": charts,
        "windows": [_window_row(w) for w in windows[:MAX_WINDOWS]],
        "more_windows": max(len(windows) - MAX_WINDOWS, 0),
    }


def _stream_label(file: str, host: str | None, rank: int, engine: str) -> str:
    who = f"rank {rank}" if rank >= 0 else "rank not logged"
    return f"{file}{' on ' + host if host else ''}, {who}, engine {engine}"


def _window_row(w: step_times.Window) -> dict:
    return {
        "label": w.label,
        "where": _stream_label(w.file, w.host, w.rank, w.engine),
        "steps": w.steps,
        "ratio": w.ratio,
        "baseline_ms": w.baseline_ms,
        "peak_ms": w.peak_ms,
        "cost_s": w.cost_s,
        "start": w.start.strftime("%Y-%m-%d %H:%M:%S") if w.start else "",
        "comm": f"{w.comm_ratio:.1f}x" if w.comm_ratio else "",
        "basis": w.basis,
    }


def _binned(stream: pl.DataFrame, columns: dict[str, pl.Expr]) -> pl.DataFrame:
    """One point per step, or per bin of steps (mean) when there are too many to draw."""
    size = max(1, -(-stream.height // MAX_POINTS))
    rows = stream.with_row_index("i").with_columns(**columns)
    return (
        rows.group_by(pl.col("i") // size).agg(pl.col("step").min(), *(pl.col(c).mean() for c in columns)).sort("step")
    )


def _charts(stream: pl.DataFrame, windows: list[step_times.Window]) -> dict:
    timed = _binned(
        stream,
        {
            "step time (ms)": pl.col("time_ms"),
            "usual (ms)": pl.col("baseline_ms"),
            "samples/sec": pl.col("samples_per_sec"),
        },
    )
    xs = timed["step"].cast(pl.Float64).to_list()
    shades = [(float(w.first_step), float(w.last_step), "") for w in windows]
    fig = svg.Figure(min(xs), max(xs), "step", width=WIDTH)
    top = fig.panel(220, "ms per step (dashed: usual)", y_range=(0.0, float(timed["step time (ms)"].max() or 1.0)))
    svg.bands(top, shades)
    svg.line(top, xs, timed["step time (ms)"].to_list(), "#3d5a80", label="step time")
    svg.line(top, xs, timed["usual (ms)"].to_list(), "#5f6368", label="usual", dash=True)
    if timed["samples/sec"].null_count() < timed.height:
        rate = fig.panel(140, "samples/sec", y_range=(0.0, float(timed["samples/sec"].max() or 1.0)))
        svg.bands(rate, shades)
        svg.line(rate, xs, timed["samples/sec"].to_list(), "#2e7d32", label="samples/sec")
    out = {"time": svg.render(fig), "phases": None}
    phases = stream.filter(pl.col("fwd_ms").is_not_null())
    if phases.height:
        binned = _binned(phases, PHASES)
        pxs = binned["step"].cast(pl.Float64).to_list()
        layers = {
            name: [max(v or 0.0, 0.0) for v in binned[name].to_list()]
            for name in PHASES
            if binned[name].null_count() < binned.height
        }
        total = max((sum(vals) for vals in zip(*layers.values())), default=1.0)
        stacked = svg.Figure(min(pxs), max(pxs), "step", width=WIDTH)
        panel = stacked.panel(220, "ms per step", y_range=(0.0, float(total)))
        svg.bands(panel, shades)
        svg.stacked_areas(panel, pxs, layers)
        out["phases"] = svg.render(stacked)
    return out
