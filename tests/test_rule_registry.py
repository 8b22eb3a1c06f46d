"""The rule registry: what every rule declares about itself (needs, kind, settings), and what follows from it."""

from __future__ import annotations

from tests.conftest import tables_from
from tracelens.derived import RunContext
from tracelens.rules import KINDS, all_rules
from tracelens.tables import INPUTS, SCHEMAS


def test_every_table_says_which_input_fills_it():
    assert set(INPUTS) == set(SCHEMAS)


def test_every_rule_declares_its_kind_needs_and_described_settings():
    for r in all_rules():
        assert r.kind in KINDS and r.needs, r.id
        for s in r.settings:
            assert s.unit and s.help.endswith((".", "...")) and s.default is not None, (r.id, s.name)


def test_a_rule_without_its_input_does_not_run_and_says_what_would_let_it():
    (tl201,) = [r for r in all_rules() if r.id == "TL201"]
    tables = tables_from(steps=[{"step": 1}])
    assert tl201.missing_inputs(tables) == [INPUTS["ib_counters"]]
    assert tl201.missing_inputs(tables_from(ib_counters=[{"counter": "SymbolErrorCounter", "value": 1}])) == []


def test_run_stamps_the_rule_id_and_a_configured_severity():
    (tl305,) = [r for r in all_rules() if r.id == "TL305"]
    assert tl305.values() == {} and tl305.severity.label == "info"
    (tl203,) = [r for r in all_rules() if r.id == "TL203"]
    assert tl203.values({"wait_warns": 0.5})["wait_warns"] == 0.5
    assert tl203.values()["wait_warns"] == 0.05
    assert tl203.run(RunContext(tables_from())) == []
