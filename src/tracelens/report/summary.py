"""The verdict every output starts with, and the machine-readable JSON of an analysis."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime

from tracelens import __version__
from tracelens.analyze import Analysis, RuleFailure
from tracelens.findings import Severity
from tracelens.prose import clock, count, duration, span


@dataclass
class RunVerdict:
    """The answer at the top of every output: what slowed the run, where, when and what it cost, the
    case for it (the top finding's Verdict, or its summary) and the one fix of the cause it names.
    The terminal, the HTML and the Markdown all print this one value."""

    severity: str  # "critical", "warning", "ok" or "unreadable"
    headline: str
    where: str = ""
    window: tuple[datetime, datetime] | None = None
    cost_seconds: float | None = None
    because: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)
    not_available: list[str] = field(default_factory=list)
    fix: str = ""
    finding: int | None = None  # 1-based index of the finding it rests on
    more: int = 0  # other warnings and criticals below it

    def to_json(self) -> dict:
        data = asdict(self)
        data["window"] = [t.isoformat() for t in self.window] if self.window else None
        return data


def verdict(analysis: Analysis) -> RunVerdict:
    """The answer: the top-ranked warning or critical finding (analyze.run_rules ranks the joined
    root cause first), or why there is none."""
    files = analysis.tables["inputs"].height
    if not analysis.readable:
        if not files:
            return RunVerdict(severity="unreadable", headline=f"Nothing readable: no file found in {analysis.target}")
        return RunVerdict(
            severity="unreadable",
            headline="Nothing readable",
            because=[f"None of the {count(files, 'input file')} contained evidence tracelens understands."],
        )
    serious = [f for f in analysis.findings if f.severity >= Severity.WARNING]
    if not serious:
        minor = len(analysis.findings)
        checked = f"{count(len(analysis.checked), 'rule')} checked over {count(files, 'file')}: none found a problem"
        failed = ", ".join(f.rule.id for f in analysis.failed)
        return RunVerdict(
            severity="ok",
            headline="No problem found",
            because=[checked + (f"; {count(minor, 'informational note')} below." if minor else ".")]
            + ([f"Not checked: {failed} failed (a bug in tracelens)."] if failed else []),
        )
    top = serious[0]
    return RunVerdict(
        severity=top.severity.label,
        headline=top.title,
        where=top.scope,
        window=top.window,
        cost_seconds=top.cost_seconds,
        because=top.verdict.because if top.verdict else [top.summary],
        against=top.verdict.against if top.verdict else [],
        not_available=top.verdict.not_available if top.verdict else [],
        fix=top.fix,
        finding=analysis.findings.index(top) + 1,
        more=len(serious) - 1,
    )


def when_and_cost(v: RunVerdict) -> str:
    """'2024-12-06 18:31:30 to 18:34:30 UTC, 2.2 min lost' (either part may be missing)."""
    instant = v.window and v.window[0].replace(microsecond=0) == v.window[1].replace(microsecond=0)
    parts = [
        (clock(v.window[0]) if instant else span(*v.window)) if v.window else "",
        f"{duration(v.cost_seconds)} lost" if v.cost_seconds else "",
    ]
    return ", ".join(p for p in parts if p)


def failure_line(failure: RuleFailure) -> str:
    """'TL401 step-time-spikes failed: ValueError: ...', as every output lists a failed rule."""
    return f"{failure.rule.id} {failure.rule.name} failed: {failure.error}"


def to_json(analysis: Analysis) -> dict:
    """Findings and input accounting, for tickets and scripts."""
    return {
        "tracelens_version": __version__,
        "target": str(analysis.target),
        "verdict": verdict(analysis).to_json(),
        "findings": [f.to_json() for f in analysis.findings],
        "inputs": analysis.tables["inputs"].sort("file").to_dicts(),
        "notes": analysis.notes,
        "rules_checked": [r.id for r in analysis.checked],
        "rules_not_run": [{"rule": r.id, "needs": needs} for r, needs in analysis.not_run],
        "rules_failed": [f.to_json() for f in analysis.failed],
        "config": str(analysis.config.source) if analysis.config.source else None,
    } | ({"comparison": analysis.comparison.to_json()} if analysis.comparison else {})
