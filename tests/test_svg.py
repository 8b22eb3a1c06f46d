"""The report's charts: drawn from the data with axes, titles and legends, run text escaped."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tracelens.report import svg

T0 = datetime(2024, 12, 6, 18, 31, 0, tzinfo=timezone.utc).timestamp()


def test_a_time_chart_has_clock_ticks_axis_titles_legend_and_bands():
    fig = svg.Figure(T0, T0 + 240, "time (UTC)", time=True)
    panel = fig.panel(180, "ms per step", y_range=(0, 4600))
    svg.bands(panel, [(T0 + 30, T0 + 210, "#1 TL410")])
    svg.line(panel, [T0, T0 + 120, T0 + 240], [1175, 4600, 1175], "#3d5a80", label="node01 rank 0")
    out = str(svg.render(fig))
    assert out.startswith("<svg viewBox=") and out.endswith("</svg>")
    assert all(f">18:3{m}:00<" in out for m in range(1, 6)) and ">18:31:30<" in out
    assert ">4,000<" in out and ">ms per step<" in out and ">time (UTC)<" in out
    assert ">node01 rank 0<" in out and ">#1 TL410<" in out and "<polyline" in out


def test_lanes_are_labelled_and_marks_land_in_their_lane():
    fig = svg.Figure(T0, T0 + 60, "time (UTC)", time=True)
    panel = fig.panel(60, lanes=["node02 · counters", "510 other hosts · NCCL"])
    svg.ticks(panel, [T0 + 10], ["510 other hosts · NCCL"], ["#b3261e"])
    svg.intervals(panel, [T0], [T0 + 30], ["node02 · counters"], ["#b3261e"])
    out = str(svg.render(fig))
    assert ">510 other hosts · NCCL<" in out and ">node02 · counters<" in out
    tick_y = float(re.search(r'<line x1="[\d.]+" x2="[\d.]+" y1="([\d.]+)"[^>]*stroke-width="2"', out)[1])
    bar_y = float(re.search(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="10"', out)[1])
    assert tick_y > bar_y  # the second lane is below the first


def test_a_long_lane_name_is_cut_in_the_middle_to_fit_and_whole_on_hover():
    host = "g340-cd51-7700-58b4-b0e2-29f6-d319"  # a corpus host name
    fig = svg.Figure(T0, T0 + 60, "time (UTC)", time=True)
    fig.panel(30, lanes=[f"{host} · NCCL"])
    out = str(svg.render(fig))
    shown = re.search(r"</title>([^<]*)</text>", out)[1]
    assert len(shown) <= svg.LANE_CHARS and shown.startswith("g340") and shown.endswith("· NCCL") and "…" in shown
    assert f"<title>{host} · NCCL</title>" in out


def test_a_time_axis_past_a_day_is_dated_and_past_a_week_in_whole_days():
    def labels(first: tuple, last: tuple) -> list[str]:
        lo, hi = (datetime(*d, tzinfo=timezone.utc).timestamp() for d in (first, last))
        return [label for _, label in svg.Scale(lo, hi, 0, 600, time=True).ticks()]

    # a folder of runs years apart (the corpus: 2022-2025) had "00:00" under each of 50 ticks
    years = labels((2022, 12, 6), (2025, 2, 18))
    assert 2 <= len(years) <= 7 and all(re.fullmatch(r"20\d\d-\d\d-\d\d", t) for t in years)
    assert labels((2024, 12, 6), (2024, 12, 8)) == [
        "12-06 00:00",
        "12-06 12:00",
        "12-07 00:00",
        "12-07 12:00",
        "12-08 00:00",
    ]
    fortnight = labels((2024, 12, 6), (2024, 12, 20))
    gaps = {(datetime.fromisoformat(b) - datetime.fromisoformat(a)) for a, b in zip(fortnight, fortnight[1:])}
    assert len(fortnight) >= 3 and len(gaps) == 1 and gaps.pop().seconds == 0  # one step, of whole days
    assert labels((2024, 12, 6, 18, 31), (2024, 12, 6, 18, 35))[0] == "18:31"  # within a day: clock times


def test_stacked_areas_and_bars_stack_from_zero():
    fig = svg.Figure(0, 10, "step")
    panel = fig.panel(100, "ms", y_range=(0, 30))
    svg.stacked_areas(panel, [0, 10], {"forward": [10, 10], "backward": [20, 20]})
    out = str(svg.render(fig))
    assert out.count("<polygon") == 2 and ">forward<" in out and ">backward<" in out


def test_text_from_the_run_is_escaped():
    fig = svg.Figure(0, 1, "<x>", title="<script>alert(1)</script>")
    panel = fig.panel(50, lanes=["<img src=x onerror=alert(1)>"])
    svg.line(panel, [0, 1], [0, 1], "#000", label="</text><script>")
    out = str(svg.render(fig))
    assert "<script" not in out and "<img" not in out and "&lt;script&gt;" in out
