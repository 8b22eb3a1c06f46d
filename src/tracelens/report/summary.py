"""The one-paragraph verdict and the machine-readable JSON of an analysis."""

from __future__ import annotations

from tracelens import __version__
from tracelens.analyze import Analysis
from tracelens.findings import Severity


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
    top = serious[0]
    others = len(serious) - 1
    return {
        "severity": top.severity.label,
        "headline": top.title,
        "detail": top.summary + (f" ({others} more finding(s) below.)" if others else ""),
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
    }
