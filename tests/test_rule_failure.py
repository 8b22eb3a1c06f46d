"""A rule that raises is a failed rule, not a failed run: the report, Markdown, terminal summary and
JSON (of `analyze` and of `diff`) are written and list it with its error, every other rule's findings
stand, and the exit status is RULE_FAILED."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tracelens.rules as registry
from tracelens.cli import RULE_FAILED, app
from tracelens.rules import all_rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUN = FIXTURES / "scenario-flaky-link"  # fires TL201, TL204, TL301, TL401, TL402, TL410
BROKEN = "TL201"
# The message quotes "input": markup, HTML and a terminal escape that must all arrive inert.
MESSAGE = "port <b>[red]mlx5_1</b>\x1b[31m has no counter\nsecond line never shown"
ERROR = "ValueError: port <b>[red]mlx5_1</b>\ufffd[31m has no counter"
runner = CliRunner()


@pytest.fixture()
def broken_rule(monkeypatch, tmp_path):
    """BROKEN raises on every run (as a rule's bug meets an odd input); crash reports go to tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def fail(ctx, **settings):
        raise ValueError(MESSAGE)

    rule = next(r for r in all_rules() if r.id == BROKEN)
    monkeypatch.setitem(registry._REGISTRY, BROKEN, replace(rule, func=fail))


def _fired(report: dict) -> set[str]:
    return {f["rule_id"] for f in report["findings"]}


def test_a_rule_that_raises_is_listed_as_failed_and_the_others_stand(broken_rule, tmp_path):
    html, md, js = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"
    args = ["analyze", str(RUN), "-o", str(html), "--markdown", str(md), "--json", str(js), "--jobs", "1"]
    result = runner.invoke(app, [*args, "--fail-on", "warning"])

    assert result.exit_code == RULE_FAILED, result.output  # wins over the findings at --fail-on (1)
    report = json.loads(js.read_text())
    assert report["rules_failed"] == [{"rule": BROKEN, "error": ERROR}]
    assert _fired(report) == {"TL204", "TL301", "TL401", "TL402", "TL410"}
    assert BROKEN not in report["rules_checked"]
    assert report["verdict"]["headline"] and report["findings"][0]["rule_id"] == "TL410"

    page = html.read_text()
    assert "1 rule failed" in page
    assert f"{BROKEN}</span> link-physical-errors: ValueError: port &lt;b&gt;[red]mlx5_1&lt;/b&gt;\ufffd[31m" in page
    assert "<b>[red]" not in page and "\x1b" not in page and "second line" not in page

    summary = md.read_text()
    assert "### Rules that failed" in summary and f"- {BROKEN} " in summary
    assert "<b>" not in summary and "\x1b" not in summary

    terminal = result.output
    assert "1 rule failed" in terminal and f"{BROKEN} " in terminal and "[red]mlx5_1" in terminal
    assert "\x1b" not in terminal and "second line" not in terminal
    traceback_file = Path(terminal.split("please report it with them): ")[1].split()[0])
    assert traceback_file.parent == tmp_path / "cache" / "tracelens"
    assert "raise ValueError(MESSAGE)" in traceback_file.read_text()


def test_the_verdict_says_a_rule_failed_when_nothing_else_was_found(broken_rule, tmp_path):
    js = tmp_path / "r.json"
    result = runner.invoke(
        app, ["analyze", str(FIXTURES / "flaky-link"), "-o", str(tmp_path / "r.html"), "--json", str(js)]
    )
    assert result.exit_code == RULE_FAILED, result.output
    verdict = json.loads(js.read_text())["verdict"]
    assert verdict["severity"] == "ok"  # TL201 was the only rule to fire here
    assert verdict["because"][1] == f"Not checked: {BROKEN} failed (a bug in tracelens)."


@pytest.mark.parametrize("how", ["option", "environment"])
def test_no_crash_report_writes_no_traceback_of_a_failed_rule(broken_rule, tmp_path, monkeypatch, how):
    args = ["analyze", str(FIXTURES / "flaky-link"), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json")]
    if how == "option":
        args.append("--no-crash-report")
    else:
        monkeypatch.setenv("TRACELENS_NO_CRASH_REPORT", "1")
    result = runner.invoke(app, args)
    assert result.exit_code == RULE_FAILED, result.output
    assert json.loads((tmp_path / "r.json").read_text())["rules_failed"][0]["rule"] == BROKEN
    assert "tracebacks" not in result.output and not list((tmp_path / "cache").rglob("crash-*"))


def test_without_a_failure_the_exit_status_is_the_findings(tmp_path):
    result = runner.invoke(app, ["analyze", str(RUN), "-o", str(tmp_path / "r.html"), "--fail-on", "warning"])
    assert result.exit_code == 1, result.output
    assert "failed" not in result.output


def test_diff_lists_the_rule_that_failed_on_either_run(broken_rule, tmp_path):
    pairs = FIXTURES / "pairs"
    html, md, js = tmp_path / "d.html", tmp_path / "d.md", tmp_path / "d.json"
    args = ["diff", str(pairs / "healthy"), str(pairs / "port-half-rate"), "-o", str(html), "--json", str(js)]
    result = runner.invoke(app, [*args, "--markdown", str(md), "--jobs", "1"])

    assert result.exit_code == RULE_FAILED, result.output
    comparison = json.loads(js.read_text())
    expected = [{"run": run, "rule": BROKEN, "error": ERROR} for run in ("good", "slow")]
    assert comparison["rules_failed"] == expected
    assert comparison["changes"][0]["what"] == "port mlx5_1:1 rate"  # the comparison stands
    page = html.read_text()
    assert page.count(f"{BROKEN} link-physical-errors failed: ValueError") == 2 and "<b>[red]" not in page
    assert f"slow run: {BROKEN} " in md.read_text()
    assert f"error: good run: {BROKEN} " in result.output and "\x1b" not in result.output
