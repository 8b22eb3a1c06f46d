"""The terminal summary: the verdict on the first line, one line per finding, where the outputs went.

Read by someone on call in a narrow terminal: nothing wraps a finding over more than two
lines, details and evidence only with `-v`. Colour comes from rich, which leaves it out
when the output is not a terminal and when NO_COLOR is set.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from tracelens.analyze import Analysis
from tracelens.findings import Finding, Severity
from tracelens.prose import count
from tracelens.report.summary import RunVerdict, failure_line, verdict, when_and_cost

# C0 and C1 control characters, DEL, and the invisible marks that reorder or hide text: from an input
# they would move the cursor, clear the screen, conceal text or set the window title.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def shown(text: object) -> str:
    """Text from the inputs as the terminal gets it: every control character as a visible escape
    (`\\x1b`, `\\u202e`), and no rich markup. Tabs stay: they only move to the next column."""
    visible = _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", str(text))
    return escape(visible)


STYLE = {"critical": "bold red", "warning": "yellow", "info": "blue", "ok": "green", "unreadable": "bold red"}
MAX_NOTES = 4  # notes and read errors printed; the report has them all
VERBOSE_EVIDENCE = 8


def _clip(text: str, room: int) -> str:
    """`text` on one line, cut to `room` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= room else flat[: max(room - 1, 0)] + "…"


def _labelled(console: Console, label: str, text: str, verbose: bool) -> None:
    """A point of the verdict ('  because  ...'), wrapped under its label: whole with -v, else at
    most two lines."""
    room = max(console.width - 11, 20)
    lines = textwrap.wrap(" ".join(text.split()), room, max_lines=None if verbose else 2, placeholder=" …") or [""]
    console.print(f"  [bold]{label:<8}[/] {shown(lines[0])}", highlight=False)
    for line in lines[1:]:
        console.print(f"{'':11}{shown(line)}", highlight=False)


def _print_verdict(console: Console, v: RunVerdict, verbose: bool) -> None:
    style = STYLE.get(v.severity, "")
    console.print(f"[{style}]{v.severity.upper()}[/] [bold]{shown(v.headline)}[/]", highlight=False)
    if when := when_and_cost(v):
        console.print(f"  {shown(when)}", highlight=False)
    r = v
    points = (
        [("because", b) for b in r.because]
        + [("against", b) for b in r.against]
        + [("missing", b) for b in r.not_available]
    )
    if not verbose:
        points = [("because", b) for b in r.because[:2]] + [("against", b) for b in r.against[:1]]
    for label, text in points + ([("fix", v.fix)] if v.fix else []):
        _labelled(console, label, text, verbose)


def _finding_line(console: Console, f: Finding) -> None:
    """severity, id, title, hosts: at most two screen lines."""
    head = f"{f.severity.label:<8} {f.rule_id:<5} "
    rest = _clip(f"{f.title}" + (f"  [{f.scope}]" if f.scope else ""), 2 * console.width - len(head) - 3)
    console.print(f"  [{STYLE[f.severity.label]}]{head}[/]{shown(rest)}", highlight=False)


def _print_details(console: Console, f: Finding) -> None:
    """`-v`: what the report says of a finding, as plain indented text."""
    if f.verdict:
        for label, items in (
            ("because", f.verdict.because),
            ("against", f.verdict.against),
            ("missing", f.verdict.not_available),
        ):
            for item in items:
                console.print(f"      {label:<8} {shown(item)}", highlight=False)
    else:
        console.print(f"      {shown(f.summary)}", highlight=False)
    if f.fix:
        console.print(f"      [bold]fix[/]      {shown(f.fix)}", highlight=False)
    for e in f.evidence[:VERBOSE_EVIDENCE]:
        console.print(f"      [dim]{shown(e.location)}[/]  {shown(_clip(e.text, 300))}", highlight=False)
    if f.evidence_total > VERBOSE_EVIDENCE:
        console.print(
            f"      … {count(f.evidence_total - VERBOSE_EVIDENCE, 'more evidence line')} in the report", highlight=False
        )


def _print_inputs(console: Console, analysis: Analysis) -> None:
    inputs = analysis.tables["inputs"]
    totals = {k: int(inputs[k].sum()) if inputs.height else 0 for k in ("lines", "parsed", "ignored", "unrecognized")}
    console.print(
        f"Read {count(inputs.height, 'file')}: {totals['lines']:,} lines or packets, "
        f"{totals['parsed']:,} parsed, {totals['ignored']:,} known but irrelevant, "
        f"{totals['unrecognized']:,} unrecognised.",
        highlight=False,
    )
    rows = list(inputs.iter_rows(named=True))
    said = [("red", "error", e) for row in rows for e in row["errors"] or []]
    said += [("yellow", "note", f"{row['file']}: {n}") for row in rows for n in row["notes"] or []]
    said += [("yellow", "note", n) for n in analysis.notes]
    for style, label, text in said[:MAX_NOTES]:
        console.print(f"[{style}]{label}:[/] {shown(_clip(text, 2 * console.width - len(label) - 4))}", highlight=False)
    if len(said) > MAX_NOTES:
        console.print(f"… {count(len(said) - MAX_NOTES, 'more note')} in the report.", highlight=False)


def print_summary(console: Console, analysis: Analysis, written: list[tuple[str, Path]], verbose: bool = False) -> None:
    """Verdict, findings, what was read, where the outputs went (`written`: label and path)."""
    v = verdict(analysis)
    _print_verdict(console, v, verbose)
    if analysis.findings:
        by = {s: sum(f.severity == s for f in analysis.findings) for s in sorted(Severity, reverse=True)}
        console.print(
            f"\n{count(len(analysis.findings), 'finding')} ("
            + ", ".join(f"{n} {s.label}" for s, n in by.items() if n)
            + "):",
            highlight=False,
        )
        for f in analysis.findings:
            _finding_line(console, f)
            if verbose:
                _print_details(console, f)
    if analysis.failed:
        console.print(
            f"\n[bold red]{count(len(analysis.failed), 'rule')} failed[/] (a bug in tracelens; every other rule's "
            "findings stand):",
            highlight=False,
        )
        for failure in analysis.failed:
            console.print(f"  {escape(_clip(failure_line(failure), 2 * console.width - 3))}", highlight=False)
    console.print()
    _print_inputs(console, analysis)
    console.print(f"Config: {shown(analysis.config.label)}", highlight=False)
    for label, path in written:
        console.print(f"{label}: [bold]{shown(str(path))}[/]", highlight=False)
