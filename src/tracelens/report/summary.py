"""The verdict every output starts with, and the machine-readable JSON of an analysis."""

from __future__ import annotations

from tracelens import __version__
from tracelens.analyze import Analysis
from tracelens.findings import Reasons, Severity, Verdict
from tracelens.prose import count, duration, span


def verdict(analysis: Analysis) -> Verdict:
    """The answer: the top-ranked warning or critical finding (analyze.run_rules ranks the joined
    root cause first), or why there is none."""
    files = analysis.tables["inputs"].height
    if not analysis.readable:
        if not files:
            return Verdict(severity="unreadable", headline=f"Nothing readable: no file found in {analysis.target}")
        return Verdict(
            severity="unreadable",
            headline="Nothing readable",
            reasons=Reasons(because=[f"None of the {count(files, 'input file')} contained evidence tracelens understands."]),
        )
    serious = [f for f in analysis.findings if f.severity >= Severity.WARNING]
    if not serious:
        minor = len(analysis.findings)
        checked = f"{count(len(analysis.rules), 'rule')} checked over {count(files, 'file')}: none found a problem"
        return Verdict(
            severity="ok",
            headline="No problem found",
            reasons=Reasons(because=[checked + (f"; {count(minor, 'informational note')} below." if minor else ".")]),
        )
    top = serious[0]
    return Verdict(
        severity=top.severity.label,
        headline=top.title,
        where=top.scope,
        window=top.window,
        cost_seconds=top.cost_seconds,
        reasons=top.reasons if top.reasons else Reasons(because=[top.summary]),
        fix=top.fix,
        finding=analysis.findings.index(top) + 1,
        more=len(serious) - 1,
    )


def when_and_cost(v: Verdict) -> str:
    """'2024-12-06 18:31:30 to 18:34:30 UTC, 2.2 min lost' (either part may be missing)."""
    parts = [span(*v.window) if v.window else "", f"{duration(v.cost_seconds)} lost" if v.cost_seconds else ""]
    return ", ".join(p for p in parts if p)


def to_json(analysis: Analysis) -> dict:
    """Findings and input accounting, for tickets and scripts."""
    return {
        "tracelens_version": __version__,
        "target": str(analysis.target),
        "verdict": verdict(analysis).to_json(),
        "findings": [f.to_json() for f in analysis.findings],
        "inputs": analysis.tables["inputs"].sort("file").to_dicts(),
        "notes": analysis.notes,
        "rules_checked": [r.id for r in analysis.rules],
    } | ({"comparison": analysis.comparison.to_json()} if analysis.comparison else {})
