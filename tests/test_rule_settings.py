"""Rule settings: each one a rule reads, and a changed value moves the rule's findings on a fixture
(the defaults leave every finding as tests/test_fixtures.py expects it)."""

from __future__ import annotations

import inspect
import re

import pytest

from tracelens.rules import all_rules

RULES = {r.id: r for r in all_rules()}


def test_every_setting_is_read_by_its_rule():
    for r in RULES.values():
        body = inspect.getsource(r.func).split('"""', 2)[-1]  # after the docstring
        for s in r.settings:
            assert re.search(rf"\b{s.name}\b", body), f"{r.id} declares {s.name} but never reads it"


def _run(analysis_of, fixture: str, rule_id: str, settings: dict | None = None) -> list[tuple[str, str]]:
    return [(f.severity.label, f.title) for f in RULES[rule_id].run(analysis_of(fixture).context, settings)]


# (fixture, rule, settings, what the findings become: "none" or the severity every finding takes)
MOVES = [
    ("scenario-congestion", "TL203", {"wait_warns": 0.5}, "info"),  # ~6% PortXmitWait: noted, no longer a warning
    ("scenario-congestion", "TL303", {"marked_share": 0.5}, "none"),
    ("scenario-congestion", "TL403", {"drop_share": 0.9}, "none"),  # the drop is 54%
    ("scenario-flaky-link", "TL301", {"loss_share": 0.5}, "none"),
    ("lab-tcp-loss", "TL304", {"min_losses": 1_000_000}, "none"),
    ("lab-tcp-loss", "TL304", {"critical_share": 0.0001}, "critical"),
    ("scenario-straggler", "TL404", {"slower_ratio": 3.0}, "none"),  # node02's ranks are 1.4x their peers
    ("scenario-socket-fallback", "TL412", {"slower_ratio": 100.0}, "none"),
]


@pytest.mark.parametrize(("fixture", "rule_id", "settings", "becomes"), MOVES, ids=[f"{m[1]}-{next(iter(m[2]))}" for m in MOVES])
def test_a_changed_setting_moves_the_finding(analysis_of, fixture, rule_id, settings, becomes):
    before = _run(analysis_of, fixture, rule_id)
    assert before and all(sev != becomes for sev, _ in before)
    after = _run(analysis_of, fixture, rule_id, settings)
    if becomes == "none":
        assert after == []
    else:
        assert [title for _, title in after] == [title for _, title in before] and {sev for sev, _ in after} == {becomes}


def test_tl401_critical_share_and_spike_rows(analysis_of):
    before = _run(analysis_of, "ds-slow-window", "TL401")
    assert before and {sev for sev, _ in before} == {"critical"}
    assert {sev for sev, _ in _run(analysis_of, "ds-slow-window", "TL401", {"critical_share": 0.99})} == {"warning"}
    # a window of 40 slow steps counts as an isolated spike when windows need more rows to stand alone
    spikes = _run(analysis_of, "ds-slow-window", "TL401", {"long_window_rows": 1000})
    assert [title for _, title in spikes] == ["1 isolated step-time spike"]
