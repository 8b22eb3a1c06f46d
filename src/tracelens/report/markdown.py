"""The ticket-ready Markdown summary (`--markdown FILE`): pasted into a GitHub or Jira ticket,
it is what people read first; the HTML report is the attachment.

Everything taken from the run (log lines, file and host names, finding text built from
them) is untrusted: inline text is backslash-escaped and defanged so that it cannot make
emphasis, links, images, mentions or HTML; log lines go in fenced code blocks whose fence
is longer than any run of backticks in them, so no line can close the block.
"""

from __future__ import annotations

import re
from pathlib import Path

from tracelens import __version__
from tracelens.analyze import Analysis
from tracelens.compare import Comparison
from tracelens.findings import Finding
from tracelens.prose import count
from tracelens.report.diff import failed_lines
from tracelens.report.summary import failure_line, verdict, when_and_cost

MAX_FINDINGS = 50  # table rows; the rest are counted
EVIDENCE_FINDINGS = 3  # findings whose first evidence lines are quoted
EVIDENCE_LINES = 6
MAX_INPUTS = 25
MAX_LINE = 400  # characters of one quoted evidence line
MAX_REASONS = 8  # bullets per list of the verdict; the HTML report has them all

# The characters that make Markdown or HTML syntax anywhere in a line (links need `[`, images
# `!`, entities `&`); `$` is GitHub's math, `@` its mentions. A line's first characters can
# also start a block (`- `, `# `, `1. `, `---`): they are escaped by _lead.
_SYNTAX = re.compile(r"([\\`*_{}\[\]<>#|~&$@!])")
_LEAD = re.compile(r"^(\d+(?=[.)])|(?=[-+=:]))(.)")
# Bare URLs are made links by GitHub's and Jira's autolinkers whatever their escapes: break
# the scheme and `www.` with a zero-width space so the text reads the same and links nowhere.
_AUTOLINK = re.compile(r"(?i)(?<=[a-z])(://)|\b(www)(\.)")
_ZWSP = "\u200b"


def inline(text: object) -> str:
    """Untrusted text as plain inline Markdown: one line, every syntax character escaped."""
    flat = " ".join(str(text).split())
    defanged = _AUTOLINK.sub(lambda m: f":{_ZWSP}//" if m.group(1) else f"www{_ZWSP}.", flat)
    return _LEAD.sub(r"\1\\\2", _SYNTAX.sub(r"\\\1", defanged))


def inline_with_code(text: str) -> str:
    """Like `inline`, but the `quoted commands` of a fix stay code spans (whose content Markdown
    never interprets)."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0 or "``" in str(text):  # unpaired or doubled backticks: no code spans at all
        return inline(text)

    def outside(p: str) -> str:
        return (" " if p[:1].isspace() else "") + inline(p) + (" " if p[-1:].isspace() and p.strip() else "")

    return "".join(outside(p) if i % 2 == 0 else f"`{' '.join(p.split())}`" for i, p in enumerate(parts))


def code_block(lines: list[str]) -> str:
    """Lines verbatim in a fenced block no line can close: the fence is longer than any backtick run."""
    body = "\n".join(line.replace("\r", "")[:MAX_LINE] for line in lines)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{body}\n{fence}"


def _verdict(analysis: Analysis) -> list[str]:
    v = verdict(analysis)
    out = [f"## tracelens: {v.severity.upper()}: {inline(v.headline)}", ""]
    facts = [f"**When:** {inline(w)}" for w in [when_and_cost(v)] if w] + [
        f"**Where:** {inline(v.where)}" for _ in [0] if v.where
    ]
    if facts:
        out += [" · ".join(facts), ""]
    for title, items in (("Because", v.because), ("Against", v.against), ("Not available", v.not_available)):
        if items:
            out += [f"**{title}**", "", *(f"- {inline_with_code(item)}" for item in items[:MAX_REASONS])]
            out += [f"- … and {len(items) - MAX_REASONS:,} more in the HTML report"] if len(items) > MAX_REASONS else []
            out.append("")
    if v.fix:
        out += [f"**How to fix:** {inline_with_code(v.fix)}", ""]
    return out


def _findings(findings: list[Finding]) -> list[str]:
    if not findings:
        return []
    out = ["### Findings", "", "| # | Severity | Rule | Finding | Where |", "|---:|---|---|---|---|"]
    out += [
        f"| {i} | {f.severity.label} | {f.rule_id} | {inline(f.title)} | {inline(f.scope)} |"
        for i, f in enumerate(findings[:MAX_FINDINGS], start=1)
    ]
    if len(findings) > MAX_FINDINGS:
        out += ["", f"… and {count(len(findings) - MAX_FINDINGS, 'more finding')} in the HTML report."]
    out.append("")
    quoted = [f for f in findings if f.evidence][:EVIDENCE_FINDINGS]
    if quoted:
        out += ["### Top evidence", ""]
    for f in quoted:
        lines = [f"{e.location}  {e.text}" for e in f.evidence[:EVIDENCE_LINES]]
        more = f.evidence_total - len(lines)
        out += [
            f"**{f.rule_id}** {inline(f.title)}" + (f" ({count(more, 'more line')} in the report)" if more > 0 else ""),
            "",
            code_block(lines),
            "",
        ]
    return out


def _failed(lines: list[str]) -> list[str]:
    """The rules that failed (a bug in tracelens), one bullet each."""
    if not lines:
        return []
    return ["### Rules that failed", "", "A bug in tracelens; every other rule's findings stand.", ""] + [
        *(f"- {inline(line)}" for line in lines),
        "",
    ]


def _inputs(analysis: Analysis) -> list[str]:
    rows = analysis.tables["inputs"].sort("file").to_dicts()
    out = [
        "### Inputs read",
        "",
        "| File | Format | Host | Read | Parsed | Known but irrelevant | Unrecognised |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    out += [
        f"| {inline(r['file'])} | {inline(r['format'])} | {inline(r['host'] or '')} | {r['lines'] or 0:,} | "
        f"{r['parsed'] or 0:,} | {r['ignored'] or 0:,} | {r['unrecognized'] or 0:,} |"
        for r in rows[:MAX_INPUTS]
    ]
    if len(rows) > MAX_INPUTS:
        out += ["", f"… and {count(len(rows) - MAX_INPUTS, 'more file')} (all of them in the HTML report)."]
    return [*out, ""]


def render(analysis: Analysis, command: str = "") -> str:
    """The summary as Markdown text."""
    failed = [failure_line(f) for f in analysis.failed]
    lines = _verdict(analysis) + _findings(analysis.findings) + _failed(failed) + _inputs(analysis)
    return "\n".join(lines + _footer(command, analysis.config.label))


def _footer(command: str, config: str) -> list[str]:
    said = f"tracelens {__version__}" + (f", run as: {inline(command)}" if command else "")
    said += f". Config: {inline(config)}"
    return [f"*{said}. Deterministic rules over parsed evidence; the HTML report has every finding's evidence.*", ""]


def render_diff(comparison: Comparison, command: str = "") -> str:
    """`tracelens diff` as Markdown: the verdict, the changes most explaining first, the config."""
    lines = [f"## tracelens diff: {inline(comparison.bad)} against {inline(comparison.good)}", ""]
    lines += [f"**{inline(comparison.verdict)}**", ""]
    if comparison.changes:
        lines += ["| # | Area | What | Good | Slow | Where | Explains |", "|---:|---|---|---|---|---|---:|"]
        lines += [
            f"| {i} | {inline(c.area)} | {inline(c.what)} | {inline(c.good)} | {inline(c.bad)} | {inline(c.where)} | "
            + (f"{c.explains_ms:+,.0f} ms |" if c.explains_ms is not None else " |")
            for i, c in enumerate(comparison.changes[:MAX_FINDINGS], start=1)
        ]
        more = len(comparison.changes) - MAX_FINDINGS
        lines += ["", f"… and {count(more, 'more change')} in the HTML diff."] if more > 0 else []
        lines.append("")
    for title, items in (("Unchanged", comparison.unchanged), ("Not compared", comparison.unavailable)):
        if items:
            lines += [f"**{title}:** {inline(', '.join(items))}", ""]
    lines += _failed(failed_lines(comparison))
    return "\n".join(lines + _footer(command, comparison.config_label))


def write_diff(comparison: Comparison, path: Path, command: str = "") -> Path:
    """Write the diff's Markdown to `path` and return the path."""
    path.write_text(render_diff(comparison, command), encoding="utf-8")
    return path


def write(analysis: Analysis, path: Path, command: str = "") -> Path:
    """Write the Markdown summary to `path` and return the path."""
    path.write_text(render(analysis, command), encoding="utf-8")
    return path
