"""The comparison of two runs as HTML: the `tracelens diff` page, and the context of the report section
that `analyze --baseline` adds (tracelens.report.sections.baseline)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracelens import __version__
from tracelens.compare import Comparison
from tracelens.compare.timing import Pace
from tracelens.report import svg
from tracelens.report.html import CSP, TEMPLATES, environment
from tracelens.report.summary import failure_line


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f} ms"


def _p(value: float) -> str:
    return f"{value:.1e}" if value < 0.001 else f"{value:.3f}"


def _chart(good: Pace, bad: Pace):
    """Both runs' step times on one y scale, so their heights compare."""
    steps = pl.concat([good.per_step["step"], bad.per_step["step"]])
    fig = svg.Figure(float(steps.min()), float(steps.max()), "step", width=720)
    top = max(good.per_step["time_ms"].max() or 0.0, bad.per_step["time_ms"].max() or 0.0)
    panel = fig.panel(180, "step time (ms)", y_range=(0.0, float(top) or 1.0))
    for label, pace, colour in (("good run", good, "#2e7d32"), ("slow run", bad, "#b3261e")):
        svg.line(
            panel,
            pace.per_step["step"].cast(pl.Float64).to_list(),
            pace.per_step["time_ms"].to_list(),
            colour,
            label=label,
        )
    return svg.render(fig)


def context(comparison: Comparison) -> dict:
    """What the comparison template shows (tables of text, numbers formatted once here)."""
    steps = None
    change = comparison.pace
    if change:
        g, b = change.good, change.bad
        rows = [
            {"label": "mean step", "good": _ms(g.mean_ms), "bad": _ms(b.mean_ms),
             "delta": f"{round(change.delta_ms):+,d} ms ({change.relative:+.0%})",
             "p": _p(change.p), "significant": change.significant},
            {"label": "median / p95",
             "good": f"{_ms(g.median_ms)} / {_ms(g.p95_ms)}", "bad": f"{_ms(b.median_ms)} / {_ms(b.p95_ms)}",
             "delta": "", "p": "", "significant": False},
            *[{"label": p.phase, "good": _ms(p.good_ms), "bad": _ms(p.bad_ms),
               "delta": f"{round(p.delta_ms):+,d} ms", "p": _p(p.p), "significant": p.significant}
              for p in change.phases],
        ]  # fmt: skip
        if g.samples_per_sec and b.samples_per_sec:
            rows.append({"label": "samples/s", "good": f"{g.samples_per_sec:,.1f}", "bad": f"{b.samples_per_sec:,.1f}",
                         "delta": f"{b.samples_per_sec / g.samples_per_sec - 1:+.0%}",
                         "p": "", "significant": False})  # fmt: skip
        steps = {"rows": rows, "chart": _chart(g, b)}
    return {
        "verdict": comparison.verdict,
        "config": comparison.config_label,
        "good": comparison.good,
        "bad": comparison.bad,
        "steps": steps,
        "changes": [
            {
                "area": c.area,
                "what": c.what,
                "good": c.good,
                "bad": c.bad,
                "where": c.where,
                "detail": c.detail,
                "explains": f"{c.explains_ms:+,.0f} ms" if c.explains_ms is not None else "",
            }
            for c in comparison.changes
        ],  # fmt: skip
        "unchanged": comparison.unchanged,
        "unavailable": comparison.unavailable,
        "gone_findings": comparison.gone_findings,
        "failed": failed_lines(comparison),
    }


def failed_lines(comparison: Comparison) -> list[str]:
    """The rules that failed on either run, each named with its run."""
    return [f"{run} run: {failure_line(f)}" for run, f in comparison.failed]


def render(comparison: Comparison) -> str:
    """The diff page as one self-contained HTML string."""
    return (
        environment()
        .get_template("diff.html.j2")
        .render(
            csp=CSP,
            css=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
            version=__version__,
            ctx=context(comparison),
        )
    )


def write(comparison: Comparison, path: Path) -> Path:
    path.write_text(render(comparison), encoding="utf-8")
    return path
