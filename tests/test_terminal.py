"""The terminal summary: verdict on the first line, one short line per finding, details only with -v,
colour only on a terminal and never with NO_COLOR."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.helpers import FIXTURES, SCENARIOS
from tracelens.cli import app
from tracelens.report.summary import verdict
from tracelens.report.terminal import print_summary

ANSI = re.compile(r"\x1b\[")


def _summary(analysis, width: int, verbose: bool = False, **console) -> str:
    buffer = io.StringIO()
    print_summary(
        Console(file=buffer, width=width, soft_wrap=True, **console),
        analysis,
        [("Report", Path("r.html"))],
        verbose=verbose,
    )
    return buffer.getvalue()


@pytest.fixture
def flaky(analysis_of):
    return analysis_of("scenario-flaky-link")


def _screen_lines(text: str, width: int) -> list[int]:
    """How many screen lines each printed line takes in a terminal `width` columns wide."""
    return [max(1, -(-len(line) // width)) for line in text.splitlines()]


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_fits_a_screen_with_the_verdict_first(name, analysis_of):
    text = _summary(analysis_of(name), 100)
    first = text.splitlines()[0]
    v = verdict(analysis_of(name))
    assert first.startswith(v.severity.upper()) and v.headline in first
    assert sum(_screen_lines(text, 100)) <= 40, text
    assert text.rstrip().endswith("Report: r.html")


@pytest.mark.parametrize("name", SCENARIOS)
def test_no_finding_wraps_over_two_lines_at_80_columns(name, analysis_of):
    text = _summary(analysis_of(name), 80)
    findings = [line for line in text.splitlines() if re.match(r"  (critical|warning|info)\s+TL\d{3}", line)]
    assert len(findings) == len(analysis_of(name).findings)
    assert all(n <= 2 for n in _screen_lines("\n".join(findings), 80))
    details = text.split("\n\n")[0].splitlines()[1:]
    assert all(n <= 1 for n in _screen_lines("\n".join(details), 80))  # wrapped by tracelens, under their labels
    assert len(details) <= 1 + 2 * 4  # when, and at most two lines for each of 2 because, 1 against, the fix


def test_the_verdict_says_cause_where_window_and_cost(flaky):
    text = _summary(flaky, 100)
    head, when = text.splitlines()[:2]
    assert "bad link" in head and "node02" in head and "mlx5_1 port 1" in head
    assert when.strip() == "2024-12-06 18:31:30 to 18:34:30 UTC, 2.2 min lost"
    fix = next(line for line in text.splitlines() if line.lstrip().startswith("fix"))
    assert "node02" in fix and "perfquery" in fix and "Congestion" not in fix  # the named cause's fix only


def test_verbose_prints_the_case_the_fix_and_evidence(flaky):
    short, long = _summary(flaky, 100), _summary(flaky, 100, verbose=True)
    assert "SymbolErrorCounter: 1407 (was 73)" not in short
    assert "node02/sysfs-during-1832.txt:56" in long and "SymbolErrorCounter: 1407 (was 73)" in long
    flat = " ".join(long.split())  # the points wrap under their label
    assert (
        "RoCE NAKs, PSN gaps and resends 1.86/s in the window (336)" in flat and "missing NCCL lines with times" in flat
    )


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch, flaky):
    assert not ANSI.search(_summary(flaky, 100))  # a file, not a terminal
    assert ANSI.search(_summary(flaky, 100, force_terminal=True))
    monkeypatch.setenv("NO_COLOR", "1")
    coloured = _summary(flaky, 100, force_terminal=True)
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m|\x1b\[[0-9;]*;3[0-7]", coloured)  # bold may stay; no colours


def test_the_command_prints_the_summary_and_where_everything_went(tmp_path: Path):
    report, md = tmp_path / "r.html", tmp_path / "r.md"
    result = CliRunner().invoke(
        app,
        ["analyze", str(FIXTURES / "scenario-healthy"), "-o", str(report), "--markdown", str(md)],
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK No problem found")
    assert f"Report: {report}" in result.stdout and f"Markdown: {md}" in result.stdout
    assert report.is_file() and md.read_text().startswith("## tracelens: OK: No problem found")


# What a hostile input could send a terminal: clear screen, conceal text, a window title, the
# 8-bit CSI, a right-to-left override that reorders what follows.
HOSTILE = ["\x1b[2J\x1b[H", "\x1b[8m", "\x1b]0;owned\x07", "\x9b31m", "\u202e", "\r", "\x08"]


def test_shown_escapes_every_control_sequence_and_markup():
    from tracelens.report.terminal import shown

    for seq in HOSTILE:
        text = shown(f"before {seq} after [bold]x[/]")
        assert not any(ch in text for ch in "\x1b\x07\x9b\u202e\r\x08"), repr(text)
        assert text.startswith("before \\") and "\\[bold]" in text
    assert shown("tab\tstays") == "tab\tstays"


@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_control_characters_from_inputs_never_reach_the_terminal(tmp_path: Path, verbose: list[str]):
    run = tmp_path / "run"
    (run / "node01").mkdir(parents=True)
    warn = "node01:100:100 [0] misc/socket.cc:50 NCCL WARN Call to connect failed : {seq}Connection timed out"
    (run / "node01" / "nccl.log").write_text(
        "node01:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
        + "\n".join(warn.format(seq=seq) for seq in HOSTILE)
        + "\n"
    )
    (run / "node01" / "evil\x1b]0;owned\x07\x1b[2J.bin").write_bytes(b"\x00" * 5000)
    result = CliRunner().invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), *verbose])
    assert result.exit_code == 0, result.output
    printed = result.output
    assert "evil\\x1b]0;owned\\x07\\x1b[2J.bin" in printed  # the name, shown as its escapes
    assert not any(ch in printed for ch in "\x1b\x07\x9b\u202e\r\x08"), repr(printed)
