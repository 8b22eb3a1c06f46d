"""The real lab runs (fixtures/lab-*, made by lab/run.sh): `analyze` must name the injected cause.

Each fixture's expected.json says what was injected (`cause`), where (`hosts`, `ranks`) and
when (`window`, UTC). A finding "names" a cause through its title, the headline a person reads
first, or through its structured verdict's cause where it has one (findings.Verdict); rules that
are evidence of one cause by nature (TL404 a straggler, TL2xx/TL3xx the network) blame it
whatever their wording. The causes of issue 10 fall in families: a network
cause (a bad link, congestion or a bandwidth cap), a straggler, contention on every rank, and
the input side (a data-loader stall or a checkpoint pause: all ranks wait, the network and
compute stay flat).

Cases the analysis gets wrong today are marked xfail(strict=True) in KNOWN_WRONG with what is
wrong, so that main stays green and the mark goes when the correlation rules are fixed.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from tests.helpers import FIXTURES
from tests.helpers.lab import FAMILY, expected_of, families, listing, loud_of, named, span, stated_offsets, window_of
from tracelens.findings import Severity


def _from_run_sh(folder: Path) -> bool:
    """lab/run.sh's fixtures say their scenario (lab/hang's lab-hang-* runs are tested elsewhere)."""
    return (folder / "expected.json").is_file() and "scenario" in expected_of(folder)


LAB = sorted(p for p in FIXTURES.glob("lab-*") if _from_run_sh(p))
RUNS = [p for p in LAB if expected_of(p)["scenario"] != "tcp-loss"]
IMPAIRED = [p for p in RUNS if expected_of(p)["cause"]]

# (fixture, check) -> what the analysis gets wrong there today.
KNOWN_WRONG: dict[tuple[str, str], str] = {}


def _cases(folders: list[Path], check: str) -> list:
    return [
        pytest.param(f, id=f.name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[(f.name, check)]))
        if (f.name, check) in KNOWN_WRONG
        else pytest.param(f, id=f.name)
        for f in folders
    ]


def test_the_lab_fixtures_are_real_and_described():
    assert {"lab-clean", "lab-loss", "lab-straggler"} <= {p.name for p in LAB}
    for folder in LAB:
        expected = expected_of(folder)
        assert expected["real"] is True and expected["synthetic"] is False, folder.name
        readme = (folder / "README.md").read_text()
        assert "real run" in readme or "real capture" in readme, folder.name
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d", readme), (
            f"{folder.name}: README gives no UTC time"
        )
    total = sum(f.stat().st_size for folder in LAB for f in folder.rglob("*") if f.is_file())
    assert total < 20e6, f"lab fixtures take {total / 1e6:.1f} MB"


@pytest.mark.parametrize("folder", _cases(IMPAIRED, "cause"))
def test_top_verdict_names_the_injected_cause(folder, analysis_of):
    expected = expected_of(folder)
    findings = analysis_of(folder).findings
    assert findings, f"{folder.name}: no finding at all"
    top = findings[0]
    context = f"{folder.name}: injected {expected['description']}; findings, first first:\n{listing(findings)}"
    assert top.severity >= Severity.WARNING, context
    assert expected["cause"] in named(top), f"the top finding does not name {expected['cause']}\n{context}"


@pytest.mark.parametrize("folder", _cases(IMPAIRED, "window"))
def test_top_verdict_window_is_the_injected_one(folder, analysis_of):
    expected = expected_of(folder)
    start, end = window_of(expected)
    slack = (end - start) * expected["tolerance"]
    top = analysis_of(folder).findings[0]
    context = (
        f"{folder.name}: the top finding ({top.rule_id}) must span "
        f"{span((start, end))} within {slack}; it spans {span(top.window)}"
    )
    assert top.window is not None, context
    assert abs(top.window[0] - start) <= slack and abs(top.window[1] - end) <= slack, context


@pytest.mark.parametrize("folder", _cases(IMPAIRED, "where"))
def test_top_verdict_names_the_right_hosts_and_ranks(folder, analysis_of):
    expected = expected_of(folder)
    top = analysis_of(folder).findings[0]
    context = (
        f"{folder.name}: expected hosts {expected['hosts']} ranks {expected['ranks']}; the top finding "
        f"({top.rule_id}) names {top.hosts} {top.ranks}"
    )
    assert top.hosts and set(top.hosts) <= set(expected["hosts"]), context
    if expected["cause"] == "straggler":
        assert top.hosts == expected["hosts"] and top.ranks == expected["ranks"], context


@pytest.mark.parametrize("folder", _cases(IMPAIRED, "others"))
def test_no_loud_finding_blames_another_cause(folder, analysis_of):
    expected = expected_of(folder)
    family = FAMILY[expected["cause"]]
    wrong = [f for f in loud_of(analysis_of(folder)) if families(f) - {family}]
    assert not wrong, (
        f"{folder.name}: injected {expected['cause']}, yet warnings blame another cause:\n{listing(wrong)}"
    )


@pytest.mark.parametrize("folder", _cases([FIXTURES / "lab-clean"], "clean"))
def test_clean_run_has_no_warning(folder, analysis_of):
    loud = loud_of(analysis_of(folder))
    assert not loud, f"a clean real run got warnings:\n{listing(loud)}"


@pytest.mark.parametrize("folder", _cases([FIXTURES / "lab-clean"], "blame"))
def test_clean_run_blames_no_cause(folder, analysis_of):
    """Weaker than no warning at all: the shared machine's noise may leave slow steps, but nothing is to blame."""
    blaming = [f for f in loud_of(analysis_of(folder)) if families(f)]
    assert not blaming, f"a clean real run got warnings that blame a cause:\n{listing(blaming)}"


@pytest.mark.parametrize("folder", _cases(RUNS, "once-per-stretch"))
def test_one_loud_finding_per_rule_and_stretch(folder, analysis_of):
    """A slow stretch seen in the logs of several ranks, or in several of one rank's windows, is one finding
    of each rule (lab-loss once had ten TL402 warnings, one per slow step of either rank)."""
    loud = [f for f in loud_of(analysis_of(folder)) if f.window]
    twice = [
        (a, b)
        for i, a in enumerate(loud)
        for b in loud[i + 1 :]
        if a.rule_id == b.rule_id and a.window[0] <= b.window[1] and b.window[0] <= a.window[1]
    ]
    assert not twice, f"{folder.name}: the same stretch reported twice:\n" + "\n".join(
        listing([a, b]) for a, b in twice
    )


SKEWED = [p for p in RUNS if "clock_offset_s" in expected_of(p)]


@pytest.mark.parametrize("folder", _cases(SKEWED, "offset"))
def test_skewed_clock_is_measured_and_stated(folder, analysis_of):
    ((host, offset),) = expected_of(folder)["clock_offset_s"].items()
    stated = stated_offsets(analysis_of(folder), host)
    assert any(abs(abs(v) - abs(offset)) <= 0.5 for v in stated), (
        f"{folder.name}: no note states {host}'s {offset:+} s offset within 0.5 s: {analysis_of(folder).notes}"
    )


@pytest.mark.parametrize("folder", _cases(SKEWED, "once"))
def test_skewed_clock_window_is_found_once(folder, analysis_of):
    start, end = window_of(expected_of(folder))
    margin = timedelta(seconds=10)
    causes = [
        f
        for f in loud_of(analysis_of(folder))
        if re.match(r"TL41\d$", f.rule_id)
        and f.window
        and f.window[0] <= end + margin
        and f.window[1] >= start - margin
    ]
    assert len(causes) == 1, f"{folder.name}: the slow window must come out once, at the true time:\n{listing(causes)}"


TCP = [p for p in LAB if expected_of(p).get("scenario") == "tcp-loss"]


@pytest.mark.parametrize("folder", _cases(TCP, "tcp"))
def test_tcp_loss_capture_gets_a_retransmission_warning(folder, analysis_of):
    expected = expected_of(folder)
    fired = [f for f in analysis_of(folder).findings if f.rule_id == expected["rule"]]
    assert fired and max(f.severity for f in fired) >= Severity.WARNING, (
        f"{folder.name}: {expected['tshark']['retransmissions']} of "
        f"{expected['tshark']['data_segments']} segments retransmitted "
        f"(tshark) and no {expected['rule']} warning:\n{listing(analysis_of(folder).findings)}"
    )


@pytest.mark.parametrize("folder", _cases(TCP, "count"))
def test_tcp_loss_retransmissions_agree_with_tshark(folder, analysis_of):
    expected = expected_of(folder)["tshark"]
    quoted = [
        tuple(map(int, m.groups()))
        for f in analysis_of(folder).findings
        if f.rule_id == "TL304"
        for m in re.finditer(r"(\d+) of (\d+) data segments retransmitted", f.summary)
    ]
    assert quoted, f"{folder.name}: no TL304 quotes a retransmission count"
    retx = sum(q[0] for q in quoted)
    assert abs(retx - expected["retransmissions"]) <= 0.1 * expected["retransmissions"], (
        f"{folder.name}: TL304 quotes {retx} retransmissions, tshark counts {expected['retransmissions']}"
    )


@pytest.mark.parametrize(
    "folder",
    _cases([p for p in RUNS if expected_of(p)["window"] and "window" in expected_of(p).get("tshark", {})], "tshark"),
)
def test_quoted_retransmissions_agree_with_tshark_in_the_injectedwindow_of(folder, analysis_of):
    """The count a verdict quotes for a window ("TCP retransmissions of any kind ... in the window (N)")
    is tshark's `tcp.analysis.retransmission` among data segments for the same window, within 10%."""
    from tracelens.derived.window_signals import measure

    expected = expected_of(folder)
    context = analysis_of(folder).context
    start, end = window_of(expected)
    (quoted,) = [s for s in measure(context, start, end) if s.what == "TCP retransmissions of any kind"]
    ours = int(re.search(r"in the window \(([\d,]+)\)", quoted.text).group(1).replace(",", ""))
    theirs = expected["tshark"]["window"]["retransmissions"]
    assert abs(ours - theirs) <= 0.1 * theirs, f"{folder.name}: we quote {quoted.text}; tshark counts {theirs}"
