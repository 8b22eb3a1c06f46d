"""Rule settings: each one a rule reads, and a changed value moves the rule's findings on a fixture
(the defaults leave every finding as tests/test_fixtures.py expects it)."""

from __future__ import annotations

import inspect
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.helpers import fire, tables_from
from tests.helpers.hangs import stuck_entries
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
    ("scenario-gpu-idle-bad-link", "TL601", {"drop_ratio": 0.01}, "none"),  # the GPUs fell to 35% from their usual 93%
]


@pytest.mark.parametrize(
    ("fixture", "rule_id", "settings", "becomes"), MOVES, ids=[f"{m[1]}-{next(iter(m[2]))}" for m in MOVES]
)
def test_a_changed_setting_moves_the_finding(analysis_of, fixture, rule_id, settings, becomes):
    before = _run(analysis_of, fixture, rule_id)
    assert before and any(sev != becomes for sev, _ in before)  # some already are (a port's usual little wait: info)
    after = _run(analysis_of, fixture, rule_id, settings)
    if becomes == "none":
        assert after == []
    else:
        assert [title for _, title in after] == [title for _, title in before] and {sev for sev, _ in after} == {
            becomes
        }


def test_tl401_critical_share_and_spike_rows(analysis_of):
    before = _run(analysis_of, "ds-slow-window", "TL401")
    assert before and {sev for sev, _ in before} == {"critical"}
    assert {sev for sev, _ in _run(analysis_of, "ds-slow-window", "TL401", {"critical_share": 0.99})} == {"warning"}
    # a window of 40 slow steps counts as an isolated spike when windows need more rows to stand alone
    spikes = _run(analysis_of, "ds-slow-window", "TL401", {"long_window_rows": 1000})
    assert [title for _, title in spikes] == ["1 isolated step-time spike"]


def test_tl423_window_around_the_first_stop():
    """Rank 1 stops after seq 2 (created at t0 + 2 s); an IB error at t0 falls 2 s before the stop."""
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    entries = stuck_entries(t0)
    error = {
        "host": "node02",
        "kind": "ib_completion",
        "message": "NET/IB : Got completion with error 12",
        "ts": t0,
        "ts_lo": t0,
        "ts_hi": t0,
    }
    tables = tables_from(fr_entries=entries, nccl_errors=[error])
    (finding,) = fire(tables, "TL423")
    assert finding.title == "Network events in the minute before rank 1 stopped"
    assert fire(tables, "TL423", before_s=1.0) == []
    later = t0 + timedelta(seconds=20)  # 18 s after the stop
    tables = tables_from(fr_entries=entries, nccl_errors=[error | {"ts": later, "ts_lo": later, "ts_hi": later}])
    assert fire(tables, "TL423") == []
    (late,) = fire(tables, "TL423", after_s=30.0)
    assert late.title == "Network events in the minute before rank 1 stopped"


def test_rules_and_report_read_slow_steps_from_the_context():
    """The config's [steps] reaches only what reads the RunContext's step series and episodes: a rule or
    report section that built its own (derived.step_times.step_series(...)) would use the default limits."""
    src = Path(__file__).resolve().parents[1] / "src" / "tracelens"
    own = [
        f"{p.relative_to(src)}: {m.group(0)}"
        for folder in ("rules", "report", "compare")
        for p in (src / folder).rglob("*.py")
        for m in re.finditer(
            r"\b(?:step_series|slow_episodes|slow_windows|sustained_windows)\(", p.read_text(encoding="utf-8")
        )
    ]
    assert not own
