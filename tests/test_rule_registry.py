"""The rule registry: what every rule declares about itself (needs, kind, settings), and what follows from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markupsafe import escape
from typer.testing import CliRunner

from tests.helpers import tables_from
from tracelens.cli import app
from tracelens.config_file import load
from tracelens.derived import RunContext, Shared
from tracelens.findings import Severity
from tracelens.report.html import render
from tracelens.report.summary import to_json
from tracelens.rules import KINDS, all_rules, rule
from tracelens.tables import INPUTS, SCHEMAS


def test_every_table_says_which_input_fills_it():
    assert set(INPUTS) == set(SCHEMAS)


def test_every_rule_declares_its_kind_needs_and_described_settings():
    for r in all_rules():
        assert r.kind in KINDS and r.needs, r.id
        for s in r.settings:
            assert s.unit and s.help.endswith((".", "...")) and s.default is not None, (r.id, s.name)
            assert not isinstance(s.default, (int, float)) or 0 <= s.default < float("inf"), (
                r.id,
                s.name,
            )  # as config.py asks


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


README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
RULES_DIR = Path(__file__).resolve().parents[1] / "src" / "tracelens" / "rules"


def _readme_families() -> dict[str, list[str]]:
    """README.md's table of rule families: `TL1` -> the modules it lists (`transport.py` ...)."""
    rows = re.findall(r"^\| (TL\d)xx \| [^|]+ \| ([^|]+) \|$", README, flags=re.MULTILINE)
    return {family: re.findall(r"`([\w.]+\.py)`", modules) for family, modules in rows}


def test_every_rule_belongs_to_a_family_the_readme_lists():
    """README.md lists the families, not the rules (the catalogue is `tracelens rules`): a new rule
    needs no README edit unless it opens a family. Every family listed has rules, and the modules
    listed for it hold rules of that family."""
    families = _readme_families()
    assert len(families) >= 6 and "TL1" in families
    rules = all_rules()
    assert [r.id for r in rules if r.id[:3] not in families] == []
    for family, modules in families.items():
        assert modules and any(r.id.startswith(family) for r in rules), family
        for module in modules:
            held = [r.id for r in rules if r.func.__module__ == f"tracelens.rules.{module[:-3]}"]
            assert held and all(i.startswith(family) for i in held), (family, module, held)


def test_rule_modules_register_by_being_in_the_package():
    """Every module of tracelens.rules that defines a rule is imported by the registry itself (no
    import list to extend), and the catalogue's order is the ids' whatever the import order."""
    defining = {p.stem for p in RULES_DIR.glob("*.py") if "\n@rule(" in p.read_text(encoding="utf-8")}
    rules = all_rules()
    assert defining and {r.func.__module__.rpartition(".")[2] for r in rules} == defining
    assert [r.id for r in rules] == sorted(r.id for r in rules)


def test_the_markdown_catalogue_has_a_row_per_rule():
    table = CliRunner().invoke(app, ["rules", "--markdown"]).stdout
    assert table.count("\n| TL") == len(all_rules()) and "| TL101 | nccl-socket-transport | warning | cause |" in table
    assert "| TL305 | capture-duplicates | info | cause | Frames that appear twice in a capture |" in table


def test_the_readme_config_example_is_a_valid_config(tmp_path):
    (example,) = re.findall(r"```toml\n(.*?)```", README, flags=re.DOTALL)
    (tmp_path / "tracelens.toml").write_text(example)
    config = load(tmp_path / "tracelens.toml")
    assert config.settings == {"TL203": {"wait_warns": 0.10}} and config.hosts == {"ip-10-0-0-1": "node01"}
    assert config.shared == Shared()  # the example gives the defaults of [steps], [baseline] and [packets]


def test_rules_command_shows_a_rules_kind_needs_and_settings():
    shown = CliRunner().invoke(app, ["rules", "TL203"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0
    lines = shown.stdout.splitlines()
    assert lines[0] == "TL203 port-discards-congestion (a cause; default severity warning)"
    assert f"- ib_counters ({INPUTS['ib_counters']})" in lines
    assert "Settings (in a tracelens.toml: [rules.TL203])" in lines
    (tl203,) = [r for r in all_rules() if r.id == "TL203"]
    for s in tl203.settings:
        assert f"- {s.name} = {s.default!r} ({s.unit}): {s.help}" in lines
    assert [t for t in ("What it finds", "Why it slows the run", "How to fix") if t in lines] == [
        "What it finds",
        "Why it slows the run",
        "How to fix",
    ]
    assert not any(line.startswith("Slow steps") for line in lines)  # TL203 reads no steps
    steps = CliRunner().invoke(app, ["rules", "TL401"], env={"COLUMNS": "400"}).stdout.splitlines()
    assert "Slow steps (in a tracelens.toml: [steps], for every rule that reads steps)" in steps
    assert any(line.startswith("- slow_ratio = 1.5 (times the usual step time): ") for line in steps)


def test_rules_catalogue_lists_every_rule_with_its_kind():
    shown = CliRunner().invoke(app, ["rules"], env={"COLUMNS": "400"}).stdout
    for r in all_rules():
        assert re.search(rf"{r.id}\s*│\s*{re.escape(r.name)}\s*│\s*{r.severity.label}\s*│\s*{r.kind}\s*│", shown), r.id


def test_report_and_json_list_the_rules_that_could_not_run_and_what_would_let_them(analysis_of):
    analysis = analysis_of("ds-overlap-comm-off")  # DeepSpeed logs only: no counters, captures, NCCL lines
    not_run = {n["rule"]: n["needs"] for n in to_json(analysis)["rules_not_run"]}
    assert not_run["TL201"] == [INPUTS["ib_counters"]] and not_run["TL301"] == [INPUTS["packets"]]
    assert "TL501" not in not_run and "TL501" in to_json(analysis)["rules_checked"]
    html = render(analysis)
    assert f"{len(not_run)} rule(s) could not run for lack of input" in html
    assert f'<span class="rule">TL201</span> link-physical-errors: needs {escape(INPUTS["ib_counters"])}' in html


def test_the_registry_says_whether_a_table_shared_settings_or_kind_is_unknown():
    def check(ctx):
        """
        What it finds: nothing, a rule made to be refused.
        Why it slows the run: it does not, the registry refuses it before it can run.
        How to fix: name a table of the run, a group of shared settings and a kind that exist.
        """
        yield from ()

    refused = {
        "needs unknown table(s) ['step']": dict(needs=("steps|step",)),
        "unknown group(s) of shared settings ['step']": dict(needs=("steps",), shared=("step",)),
        "unknown kind 'symptoms'": dict(kind="symptoms"),
    }
    for message, declared in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            rule("TL999", "refused", Severity.INFO, **declared)(check)
