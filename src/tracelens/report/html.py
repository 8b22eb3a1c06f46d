"""The self-contained HTML report: one file, no external requests, all input text escaped."""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from tracelens import __version__
from tracelens.analyze import Analysis
from tracelens.findings import Severity
from tracelens.prose import count, duration, number, span
from tracelens.report.sections import build_sections
from tracelens.report.summary import verdict, when_and_cost

TEMPLATES = Path(__file__).resolve().parent / "templates"  # the pages' Jinja2 templates and their CSS

# No scripts, no fetches: styles and images inline only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


@functools.cache
def environment() -> Environment:
    """The Jinja2 environment of every tracelens page: templates from TEMPLATES, everything escaped.
    One per process: it keeps the templates it compiled (compiling them again would cost each report), and reloads
    one whose file changed."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["window"] = lambda window: span(*window)
    env.filters["duration"] = duration
    env.filters["number"] = lambda value: "" if value is None else number(value)
    env.filters["counted"] = count  # 3 | counted("port") -> "3 ports" (jinja's own `count` is `length`)
    env.filters["code"] = backticks_as_code
    return env


def backticks_as_code(text: str) -> Markup:
    """Escape `text`, then show its `quoted commands` as code (a fix's commands stay copyable)."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


MAX_INPUT_ROWS = 50  # input files listed open; the rest (read in full) are folded


def _needs_attention(row: dict) -> bool:
    return bool(row["unrecognized"] or row["errors"] or row["notes"])


def _inputs_split(inputs: list[dict]) -> dict:
    """The files that need attention (unrecognised lines, errors) first, then the rest, folded past
    MAX_INPUT_ROWS: a run of thousands of files keeps a short page."""
    ordered = sorted(inputs, key=lambda row: not _needs_attention(row))
    cut = max(MAX_INPUT_ROWS, sum(1 for row in inputs if _needs_attention(row)))
    return {"inputs_shown": ordered[:cut], "inputs_folded": ordered[cut:]}


def render(analysis: Analysis) -> str:
    """The report as one HTML string."""
    env = environment()
    inputs = analysis.tables["inputs"].sort("file").to_dicts()
    counts = Counter(f.severity for f in analysis.findings)
    return env.get_template("report.html.j2").render(
        csp=CSP,
        css=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
        version=__version__,
        target=str(analysis.target),
        verdict=(top := verdict(analysis)),
        when_and_cost=when_and_cost(top),
        findings=analysis.findings,
        severity_counts={s.label: counts.get(s, 0) for s in sorted(Severity, reverse=True)},
        sections=build_sections(analysis),
        inputs=inputs,
        **_inputs_split(inputs),
        totals={k: sum(row[k] or 0 for row in inputs) for k in ("lines", "parsed", "ignored", "unrecognized")},
        notes=analysis.notes,
        config=analysis.config.label,
        rules=analysis.checked,
        not_run=analysis.not_run,
        failed=analysis.failed,
    )


def write(analysis: Analysis, path: Path) -> Path:
    """Write the report to `path` (UTF-8, one file with everything inline) and return the path."""
    path.write_text(render(analysis), encoding="utf-8")
    return path
