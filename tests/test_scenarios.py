"""The whole-run scenarios (fixtures/scenario-*): each injects one cause into every source, and
the analysis must put that cause first, with its hosts, ports, ranks and window."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tracelens.analyze import analyze
from tracelens.findings import Finding, Severity
from tracelens.report.html import render

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCENARIOS = sorted(p for p in FIXTURES.glob("scenario-*") if (p / "expected.json").is_file())
WITH_CAUSE = [p for p in SCENARIOS if "top" in json.loads((p / "expected.json").read_text())]


def _expected(folder: Path) -> dict:
    return json.loads((folder / "expected.json").read_text())


def _window(top: dict) -> tuple[datetime, datetime]:
    start, end = (datetime.fromisoformat(t) for t in top["window"])
    return start, end


def _listing(findings: list[Finding]) -> str:
    return "\n".join(
        f"  {f.rule_id} {f.severity.label} hosts={f.hosts} ranks={f.ranks} window={_span(f.window)}: {f.summary[:160]}"
        for f in findings[:6]
    )


def _span(window: tuple[datetime, datetime] | None) -> str:
    return f"{window[0].isoformat()} .. {window[1].isoformat()}" if window else "none"


def test_there_are_scenarios():
    assert len(WITH_CAUSE) >= 6 and (FIXTURES / "scenario-healthy").is_dir()


@pytest.mark.parametrize("folder", WITH_CAUSE, ids=lambda p: p.name)
def test_top_finding_is_the_injected_cause(folder, analysis_of):
    top = _expected(folder)["top"]
    findings = analysis_of(folder).findings
    assert findings, f"{folder.name}: no finding at all"
    first = findings[0]
    context = (
        f"{folder.name}: expected {top['rule']} on {top['hosts']} first; findings, first first:\n{_listing(findings)}"
    )
    fired = {f.rule_id for f in findings}
    assert top["rule"] in fired, f"{top['rule']} did not fire at all ({_expected(folder)['description']})\n{context}"
    assert first.rule_id == top["rule"], f"{top['rule']} fired but is not ranked first\n{context}"
    assert first.hosts == sorted(top["hosts"]), f"the top finding must scope the injected host(s) only\n{context}"
    for port in top.get("ports", []):
        assert port in first.ports, f"the top finding must name port {port} (it names {first.ports})\n{context}"
    for rank in top.get("ranks", []):
        assert rank in first.ranks, f"the top finding must name rank {rank}\n{context}"


@pytest.mark.parametrize("folder", WITH_CAUSE, ids=lambda p: p.name)
def test_top_finding_window_is_the_injected_one(folder, analysis_of):
    top = _expected(folder)["top"]
    first = analysis_of(folder).findings[0]
    start, end = _window(top)
    slack = timedelta(seconds=top["tolerance_s"])
    context = (
        f"{folder.name}: the top finding ({first.rule_id}) must span {_span((start, end))} within "
        f"{top['tolerance_s']} s; it spans {_span(first.window)}"
    )
    assert first.window is not None, context
    assert abs(first.window[0] - start) <= slack and abs(first.window[1] - end) <= slack, context


@pytest.mark.parametrize("name", ["scenario-flaky-link", "scenario-congestion"])
def test_the_background_does_not_move_the_verdict(name, tmp_path, analysis_of):
    """Issue 10 part 8: the committed scenarios carry a real fabric's background all run long (a few
    symbol errors an hour, a little PortXmitWait, a dropped or marked packet now and then), window
    included. The same run without it must get the same verdict: cause, hosts, ports and window;
    and the verdict with it must have checked the background and found no rise."""
    from synth.incidents import scenarios
    from synth.runs import write
    from synth.scenarios import ROCE_PAIR

    (quiet,) = [s for s in scenarios(ROCE_PAIR, background=False) if s.name == name]
    without = analyze(write(quiet, tmp_path))
    with_it = analysis_of(name)
    a, b = without.findings[0], with_it.findings[0]
    assert (a.rule_id, a.verdict.cause, a.hosts, a.ports) == (b.rule_id, b.verdict.cause, b.hosts, b.ports), (
        a.title,
        b.title,
    )
    assert abs(a.window[0] - b.window[0]) <= timedelta(seconds=5) and abs(a.window[1] - b.window[1]) <= timedelta(
        seconds=5
    )
    # with the background the window's rates are measured against a baseline that is not zero
    kind = "RoCE NAKs" if name == "scenario-flaky-link" else "CNPs and ECN-CE marks"
    (quiet_rate,), (busy_rate,) = ([r for r in f.verdict.because if kind in r] for f in (a, b))
    before = [float(re.search(r"vs ([0-9.]+)/s before", r).group(1)) for r in (quiet_rate, busy_rate)]
    assert before[1] > before[0], (quiet_rate, busy_rate)
    if name == "scenario-congestion":  # the ports that only ever waited a little are ruled out, not blamed
        assert any(
            r.startswith("node01 mlx5_1 port 1: PortXmitWait") and r.endswith("no rise") for r in b.verdict.against
        )


@pytest.mark.parametrize("folder", WITH_CAUSE, ids=lambda p: p.name)
def test_every_source_places_the_cause_in_its_window(folder, analysis_of):
    """The fixtures' own consistency: the evidence each source gives (counter intervals, capture
    events, slow steps) falls in the injected window, in UTC, on every host."""
    top = _expected(folder)["top"]
    start, end = _window(top)
    slack = timedelta(seconds=top["tolerance_s"])
    sources = [f for f in analysis_of(folder).findings if f.window and re.match(r"TL(2\d\d|3\d\d|40[1-3])$", f.rule_id)]
    for f in sources:
        assert f.window[0] <= end + slack and f.window[1] >= start - slack, (
            f"{folder.name}: {f.rule_id} on {f.hosts} spans "
            f"{_span(f.window)}, outside the injected {_span((start, end))}"
        )
    for f in (f for f in sources if f.rule_id == "TL401"):
        assert abs(f.window[0] - start) <= slack and abs(f.window[1] - end) <= slack, (
            f"{folder.name}: the slow steps span {_span(f.window)}, not the injected {_span((start, end))}"
        )


def test_healthy_scenario_has_no_warning(analysis_of):
    findings = analysis_of(FIXTURES / "scenario-healthy").findings
    loud = [f for f in findings if f.severity >= Severity.WARNING]
    assert not loud, f"a healthy run got warnings:\n{_listing(loud)}"


def test_tz_scenario_is_aligned_without_tz_and_says_so(analysis_of):
    folder = FIXTURES / "scenario-tz-shift"
    shift = _expected(folder)["tz_shift_hours"]
    analysis = analysis_of(folder)
    assert analysis.timeline.shift_hours == shift, f"logs are in UTC{shift:+g}; the timeline found {analysis.timeline}"
    said = [n for n in analysis.notes if re.search(rf"UTC\+0?{shift:g}(:00)?\b|{re.escape(f'{-shift:+g}')} ?h\b", n)]
    assert said, f"no note says the {shift:+g} h shift was applied: {analysis.notes}"
    assert said[0] in render(analysis).replace("&#43;", "+"), "the report must show the shift it applied"
