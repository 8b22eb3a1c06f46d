"""Charts as inline SVG, drawn straight from the data: panels sharing one x axis, each with its
marks (lines, stacked areas, bars, ticks and intervals in lanes, shaded windows), axes with
ticks and titles, and a legend.

Why not Altair and vl-convert: starting the converter's JavaScript engine and Altair's schema
validation cost seconds each, for a report that must be written in under a second. The charts are
the same declarative idea, kept small: a Figure is described by its panels and marks, then
rendered once. Every text that came from the run
(series names, lanes, labels) is XML-escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from markupsafe import Markup, escape

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
LEFT, RIGHT, TOP_PAD, AXIS_H = 150, 16, 8, 34  # plot margins in px; lanes need room for their names
FONT = 'font-family="system-ui,sans-serif" font-size="11"'
LANE_CHARS = 22  # a lane's name this long fits the left margin at 11 px (longer: cut in the middle, whole on hover)
DAY = 86400
_TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]


def _nice_step(span: float, target: int) -> float:
    raw = span / max(target, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _number_label(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:,.10g}"


@dataclass
class Scale:
    """A linear map from data to pixels; `time` scales take epoch seconds and label as UTC clock times."""

    lo: float
    hi: float
    start: float = 0.0  # pixels
    end: float = 1.0
    time: bool = False
    zero: bool = False  # numeric y scales start at 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.hi - self.lo):  # an infinite value, or a span past what a float holds
            self.lo, self.hi = 0.0, 1.0
        if self.zero:
            self.lo = min(self.lo, 0.0)
        if self.hi <= self.lo:
            self.hi = self.lo + 1.0

    def __call__(self, value: float) -> float:
        return self.start + (value - self.lo) / (self.hi - self.lo) * (self.end - self.start)

    def ticks(self, target: int = 6) -> list[tuple[float, str]]:
        span = self.hi - self.lo
        if self.time:
            step: float = next((s for s in _TIME_STEPS if span / s <= target), _TIME_STEPS[-1])
            if span < 1:
                step = _nice_step(span, target)
            elif span / DAY > target:  # weeks to years (a folder of several runs): whole days, dated
                step = math.ceil(_nice_step(span / DAY, target)) * DAY
            fmt = "%H:%M:%S" if step < 60 or span < 60 else "%H:%M"
            if span > DAY:  # past a day a clock time alone repeats: "00:00" under every tick
                fmt = "%Y-%m-%d" if step >= DAY else f"%m-%d {fmt}"
            first = math.ceil(self.lo / step) * step
            return [
                (
                    t,
                    datetime.fromtimestamp(t, timezone.utc).strftime(fmt)
                    + (f".{int(round(t % 1 * 1000)):03d}" if step < 1 else ""),
                )
                for t in _frange(first, self.hi, step)
            ]
        step = _nice_step(span, target)
        first = math.ceil(self.lo / step) * step
        return [(t, _number_label(round(t, 10))) for t in _frange(first, self.hi, step)]


def _frange(first: float, last: float, step: float) -> list[float]:
    count = int((last - first) / step + 1e-9) + 1
    return [first + i * step for i in range(max(count, 0))][:50]


@dataclass
class Panel:
    """One plot area: its height, its y axis (numeric or lanes) and the SVG of its marks."""

    height: int
    y_title: str = ""
    lanes: list[str] | None = None  # categorical rows, top to bottom
    y_range: tuple[float, float] | None = None
    marks: list[Callable[[Scale, Scale, float, Panel], str]] = field(default_factory=list)  # drawn at render time
    legend: dict[str, str] = field(default_factory=dict)  # label -> colour, in order


@dataclass
class Figure:
    """Panels stacked over one shared x axis, `width` px wide."""

    x_lo: float
    x_hi: float
    x_title: str
    width: int = 900
    time: bool = False
    panels: list[Panel] = field(default_factory=list)
    title: str = ""

    def x(self) -> Scale:
        return Scale(self.x_lo, self.x_hi, LEFT, self.width - RIGHT, time=self.time)

    def panel(
        self, height: int, y_title: str = "", lanes: list[str] | None = None, y_range: tuple[float, float] | None = None
    ) -> Panel:
        p = Panel(height, y_title, lanes, y_range)
        self.panels.append(p)
        return p


def _y(panel: Panel, top: float) -> Scale:
    lo, hi = panel.y_range or (0.0, 1.0)
    return Scale(lo, hi + 0.08 * (hi - lo), top + panel.height, top, zero=True)  # headroom for the window labels


def _lane_y(panel: Panel, top: float, lane: str) -> float:
    rows = panel.lanes or []
    step = panel.height / max(len(rows), 1)
    return top + step * (rows.index(lane) + 0.5) if lane in rows else top + panel.height / 2


# -- marks: each adds a drawing function to its panel, called with the scales at render time ----


def line(
    panel: Panel,
    xs: list[float],
    ys: list[float | None],
    colour: str,
    label: str = "",
    dash: bool = False,
    points: bool = False,
) -> None:
    """A polyline; gaps (None) break it; `points` marks each value with a dot."""

    def draw(x: Scale, y: Scale, top: float, p: Panel) -> str:
        runs: list[list[str]] = []
        current: list[str] = []
        for xv, yv in zip(xs, ys):
            if yv is None or (isinstance(yv, float) and math.isnan(yv)):
                runs.append(current)
                current = []
            else:
                current.append(f"{x(xv):.1f},{y(yv):.1f}")
        runs.append(current)
        extra = ' stroke-dasharray="4 3"' if dash else ""
        dots = [xy.split(",") for r in runs for xy in r] if points else []
        return "".join(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{extra} points="{" ".join(r)}"/>'
            for r in runs
            if r
        ) + "".join(f'<circle cx="{a}" cy="{b}" r="3" fill="{colour}"/>' for a, b in dots)

    panel.marks.append(draw)
    if label:
        panel.legend[label] = colour


def lines(panel: Panel, series: Iterable[tuple[str, list[datetime], list[float | None]]], points: bool = False) -> None:
    """One line per (label, times, values), each in the palette's next colour."""
    for n, (label, times, values) in enumerate(series):
        line(panel, epoch_seconds(times), values, PALETTE[n % len(PALETTE)], label=label, points=points)


def stacked_areas(panel: Panel, xs: list[float], layers: dict[str, list[float | None]]) -> None:
    """Areas stacked from zero in the order given (first at the bottom), each in the palette's next colour."""

    def draw(x: Scale, y: Scale, top: float, p: Panel) -> str:
        base = [0.0] * len(xs)
        out = []
        for i, (name, values) in enumerate(layers.items()):
            upper = [b + (v or 0.0) for b, v in zip(base, values)]
            pts = [f"{x(a):.1f},{y(u):.1f}" for a, u in zip(xs, upper)] + [
                f"{x(a):.1f},{y(b):.1f}" for a, b in reversed(list(zip(xs, base)))
            ]
            out.append(
                f'<polygon fill="{PALETTE[i % len(PALETTE)]}" fill-opacity="0.85" '
                f'points="{" ".join(pts)}"><title>{escape(name)}</title></polygon>'
            )
            base = upper
        return "".join(out)

    panel.marks.append(draw)
    for i, name in enumerate(layers):
        panel.legend[name] = PALETTE[i % len(PALETTE)]


def bars(
    panel: Panel,
    xs: list[float],
    ys: list[float],
    colour: str,
    label: str = "",
    width_x: float = 0.0,
    bottoms: list[float] | None = None,
) -> None:
    """Vertical bars at xs (width in x units, at least 1.5 px), optionally stacked on `bottoms`."""

    def draw(x: Scale, y: Scale, top: float, p: Panel) -> str:
        w = max(1.5, abs(x(width_x) - x(0)) if width_x else 1.5)
        low = bottoms or [0.0] * len(xs)
        return "".join(
            (
                f'<rect x="{x(a) - w / 2:.1f}" y="{y(b + v):.1f}" width="{w:.1f}" '
                f'height="{max(y(b) - y(b + v), 0.5):.1f}" fill="{colour}"/>'
            )
            for a, v, b in zip(xs, ys, low)
        )

    panel.marks.append(draw)
    if label:
        panel.legend[label] = colour


def ticks(
    panel: Panel, xs: list[float], lanes: list[str], colours: list[str], sizes: list[float] | None = None
) -> None:
    """A short vertical tick per event in its lane (taller for bigger counts, `sizes` in 0..1)."""

    def draw(x: Scale, y: Scale | None, top: float, p: Panel) -> str:
        half = [4 + 5 * (s or 0) for s in (sizes or [0.0] * len(xs))]
        return "".join(
            (
                f'<line x1="{x(a):.1f}" x2="{x(a):.1f}" y1="{_lane_y(p, top, lane) - h:.1f}" '
                f'y2="{_lane_y(p, top, lane) + h:.1f}" stroke="{c}" stroke-width="2"/>'
            )
            for a, lane, c, h in zip(xs, lanes, colours, half)
        )

    panel.marks.append(draw)


def intervals(panel: Panel, starts: list[float], ends: list[float], lanes: list[str], colours: list[str]) -> None:
    """A bar over [start, end] in its lane (a counter that rose between two dumps)."""

    def draw(x: Scale, y: Scale | None, top: float, p: Panel) -> str:
        return "".join(
            (
                f'<rect x="{x(a):.1f}" y="{_lane_y(p, top, lane) - 5:.1f}" width="{max(x(b) - x(a), 2):.1f}" '
                f'height="10" fill="{c}" fill-opacity="0.5"/>'
            )
            for a, b, lane, c in zip(starts, ends, lanes, colours)
        )

    panel.marks.append(draw)


def bands(panel: Panel, spans: list[tuple[float, float, str]], colour: str = "#b3261e") -> None:
    """Shaded x ranges (slow windows), each labelled at its top left, labels staggered in rows."""

    def draw(x: Scale, y: Scale | None, top: float, p: Panel) -> str:
        out = []
        for row, (a, b, label) in enumerate(sorted(spans)):
            left, right = max(x(a), LEFT), min(x(b), x.end)
            out.append(
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left, 2):.1f}" height="{p.height}" '
                f'fill="{colour}" fill-opacity="0.12"/>'
            )
            if label:
                out.append(
                    f'<text x="{left + 2:.1f}" y="{top + 11 + 12 * (row % 4):.1f}" {FONT} '
                    f'fill="{colour}">{escape(label)}</text>'
                )
        return "".join(out)

    panel.marks.insert(0, draw)  # under the data


# -- rendering ------------------------------------------------------------------------------------


def _legend(entries: dict[str, str], top: float, width: int) -> tuple[str, float]:
    """Legend entries in rows under a panel; returns the SVG and the height it took."""
    out: list[str] = []
    x: float = LEFT
    row = 0
    for label, colour in entries.items():
        text = str(label)
        w = 18 + 6.2 * len(text) + 14
        if x + w > width - RIGHT and x > LEFT:
            x, row = LEFT, row + 1
        ty = top + 12 + 16 * row
        out.append(
            f'<rect x="{x:.0f}" y="{ty - 8:.0f}" width="12" height="8" fill="{colour}"/>'
            f'<text x="{x + 16:.0f}" y="{ty:.0f}" {FONT}>{escape(text)}</text>'
        )
        x += w
    return "".join(out), (16 * (row + 1) + 6 if entries else 0)


def render(fig: Figure) -> Markup:
    """The figure as one inline <svg> element (scales with the page through its viewBox)."""
    x = fig.x()
    parts: list[str] = []
    top: float = TOP_PAD
    if fig.title:
        parts.append(f'<text x="{LEFT}" y="{top + 12}" {FONT} font-weight="600">{escape(fig.title)}</text>')
        top += 20
    for p in fig.panels:
        y = _y(p, top)
        parts.append(
            f'<rect x="{LEFT}" y="{top}" width="{fig.width - LEFT - RIGHT}" '
            f'height="{p.height}" fill="none" stroke="#ddd"/>'
        )
        if p.lanes is not None:
            step = p.height / max(len(p.lanes), 1)
            for i, lane in enumerate(p.lanes):
                parts.append(
                    f'<text x="{LEFT - 6}" y="{top + step * (i + 0.5) + 4:.1f}" {FONT} '
                    f'text-anchor="end"><title>{escape(lane)}</title>{escape(_fitted(lane))}</text>'
                )
                if i:
                    parts.append(
                        f'<line x1="{LEFT}" x2="{fig.width - RIGHT}" y1="{top + step * i:.1f}" '
                        f'y2="{top + step * i:.1f}" stroke="#eee"/>'
                    )
        else:
            for value, label in y.ticks(4):
                parts.append(
                    f'<line x1="{LEFT - 4}" x2="{fig.width - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                    f'stroke="#eee"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" {FONT} '
                    f'text-anchor="end">{escape(label)}</text>'
                )
            if p.y_title:
                mid = top + p.height / 2
                parts.append(
                    f'<text transform="translate({LEFT - 58},{mid:.0f}) rotate(-90)" {FONT} '
                    f'text-anchor="middle">{escape(p.y_title)}</text>'
                )
        parts.extend(draw(x, y, top, p) for draw in p.marks)
        top += p.height
        legend, used = _legend(p.legend, top, fig.width)
        parts.append(legend)
        top += used + 4
    for value, label in x.ticks(8):
        parts.append(
            f'<line x1="{x(value):.1f}" x2="{x(value):.1f}" y1="{top}" y2="{top + 4}" stroke="#888"/>'
            f'<text x="{x(value):.1f}" y="{top + 16}" {FONT} text-anchor="middle">{escape(label)}</text>'
        )
    parts.append(
        f'<text x="{(LEFT + fig.width - RIGHT) / 2:.0f}" y="{top + 30}" {FONT} '
        f'text-anchor="middle">{escape(fig.x_title)}</text>'
    )
    height = top + AXIS_H + 4
    return Markup(
        f'<svg viewBox="0 0 {fig.width} {height:.0f}" width="{fig.width}" '
        f'height="{height:.0f}" role="img" aria-label="{escape(fig.title or fig.x_title)}">{"".join(parts)}</svg>'
    )


def epoch_seconds(values: list[datetime]) -> list[float]:
    """Datetimes (UTC) as floats for a time scale (a position has a time: the marks cannot draw None)."""
    return [v.timestamp() for v in values]


def _fitted(name: str, chars: int = LANE_CHARS) -> str:
    """A lane's name cut in the middle to `chars` (its host's start, its end and source kept): a
    64-character host name ran off the chart's left edge."""
    if len(name) <= chars:
        return name
    tail = chars * 2 // 3
    return f"{name[: chars - tail - 1]}…{name[-tail:]}"
