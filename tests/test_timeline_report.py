"""The report's centre: the timeline chart before the findings, each window linked to its
finding, the zone decision and the clock offsets; the verdict names the cause and its cost."""

from __future__ import annotations

import re

import pytest

from tests.helpers import FIXTURES
from tracelens.analyze import Analysis
from tracelens.report.html import render
from tracelens.report.summary import verdict


@pytest.fixture(scope="module")
def flaky(analysis_of) -> tuple[Analysis, str]:
    analysis = analysis_of("scenario-flaky-link")
    return analysis, render(analysis)


def test_the_timeline_is_the_first_section_with_its_chart(flaky):
    _, html = flaky
    assert html.index('id="timeline"') < html.index('id="findings"')
    centre = html[html.index('id="timeline"') : html.index('id="findings"')]
    assert "<svg" in centre and "ms per step" in centre and "node02 · counters" in centre


def test_each_window_links_to_its_finding_and_back(flaky):
    analysis, html = flaky
    centre = html[html.index('id="timeline"') : html.index('id="findings"')]
    windowed = [i for i, f in enumerate(analysis.findings, start=1) if f.window]
    assert windowed and all(f'href="#finding-{i}"' in centre for i in windowed)
    assert all(f'id="finding-{i}"' in html for i in windowed)
    assert '<a href="#timeline">' in html[html.index('id="findings"') :]


def test_the_verdict_names_the_root_cause_and_the_time_it_cost(flaky):
    analysis, html = flaky
    top = verdict(analysis)
    assert top.headline == analysis.findings[0].title and "node02" in top.headline
    assert top.cost_seconds > 120 and top.finding == 1 and top.where == "node02 (mlx5_1:1)"
    assert re.search(r"18:34:30 UTC, 2\.2 min lost", html)
    assert "SymbolErrorCounter 33.9/s in the window (8,128)" in html[html.index('id="verdict"') : html.index("<nav")]


def test_the_zone_decision_and_the_clocks_are_shown(flaky):
    _, html = flaky
    centre = html[html.index('id="timeline"') : html.index('id="findings"')]
    assert "Log times read as UTC: they overlap the capture" in centre
    assert "<h3>Clocks</h3>" in centre


def test_a_run_without_any_timed_evidence_has_no_timeline(analysis_of):
    html = render(analysis_of("gdr-off"))
    assert 'id="timeline"' not in html


@pytest.mark.parametrize("folder", sorted(FIXTURES.glob("scenario-*")), ids=lambda p: p.name)
def test_every_scenario_renders_its_timeline(folder, analysis_of):
    html = render(analysis_of(folder))
    centre = html[html.index('id="timeline"') : html.index('id="findings"')]
    assert "<svg" in centre and "time (UTC)" in centre
