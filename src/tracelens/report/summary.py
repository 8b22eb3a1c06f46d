"""The one-paragraph verdict and the machine-readable JSON of an analysis."""

from __future__ import annotations

from datetime import datetime

from tracelens import __version__
from tracelens.analyze import Analysis
from tracelens.findings import Severity
from tracelens.timeline import duration_text


def describe_window(window: tuple[datetime, datetime]) -> str:
    """'2024-12-06 18:31:18 to 18:34:58 UTC' (the end's date only when it differs)."""
    start, end = window
    end_text = f"{end:%H:%M:%S}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M:%S}"
    return f"{start:%Y-%m-%d %H:%M:%S} to {end_text} UTC"


def verdict(analysis: Analysis) -> dict:
    """Headline and detail for the top of the report and the terminal."""
    inputs = analysis.tables["inputs"]
    files = inputs.height
    if not analysis.readable:
        return {
            "severity": "critical",
            "headline": "Nothing readable",
            "detail": f"None of the {files} input file(s) contained evidence tracelens understands.",
        }
    serious = [f for f in analysis.findings if f.severity >= Severity.WARNING]
    if not serious:
        minor = len(analysis.findings)
        return {
            "severity": "ok",
            "headline": "No problem found",
            "detail": f"{len(analysis.rules)} rules checked over {files} file(s)"
            + (f"; {minor} informational note(s)." if minor else "."),
        }
    # findings come ranked (analyze.run_rules): the first serious one is the cause with the most evidence
    top = serious[0]
    others = len(serious) - 1
    return {
        "severity": top.severity.label,
        "headline": top.title,
        "detail": top.summary + (f" ({others} more finding(s) below.)" if others else ""),
        "anchor": f"finding-{analysis.findings.index(top) + 1}",
        "cost": duration_text(top.cost_seconds) if top.cost_seconds else "",
        "window": describe_window(top.window) if top.window else "",
    }



def to_json(analysis: Analysis) -> dict:
    """Findings and input accounting, for tickets and scripts."""
    return {
        "tracelens_version": __version__,
        "target": str(analysis.target),
        "verdict": verdict(analysis),
        "findings": [f.to_json() for f in analysis.findings],
        "inputs": analysis.tables["inputs"].sort("file").to_dicts(),
        "notes": analysis.notes,
        "rules_checked": [r.id for r in analysis.rules],
    } | ({"comparison": analysis.comparison.to_json()} if analysis.comparison else {})
