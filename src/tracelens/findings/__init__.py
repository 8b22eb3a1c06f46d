"""What a rule reports: a Finding with its Evidence, scope and fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import IntEnum


class Severity(IntEnum):
    """Ordered so that `max()` gives the worst; `info` findings never fail a run."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.strip().upper()]


EVIDENCE_CHARS = 2000


@dataclass(frozen=True)
class Evidence:
    """One piece of proof: a line of a file (or a frame of a capture) and its text."""

    file: str
    line: int | None = None
    text: str = ""
    host: str | None = None
    frame: int | None = None

    def __post_init__(self) -> None:
        if len(self.text) > EVIDENCE_CHARS:  # a 200 MB line is quoted by its head, not copied whole
            clipped = f"{self.text[:EVIDENCE_CHARS]}... ({len(self.text) - EVIDENCE_CHARS:,} more characters)"
            object.__setattr__(self, "text", clipped)

    @property
    def location(self) -> str:
        if self.frame is not None:
            return f"{self.file} frame {self.frame}"
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class Verdict:
    """The diagnosis of one slow window as data, for the report to render as bullets: the best-supported
    cause (None: undetermined), how sure, the signals that rose for it (`because`), the checked signals
    that stayed at their baseline and rule other causes out (`against`), what the run did not record
    (`not_available`), and the fix for the named cause only."""

    cause: str | None
    confidence: str  # "high", "medium", "low" or "undetermined"
    headline: str
    because: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)
    not_available: list[str] = field(default_factory=list)
    fix: str = ""


@dataclass
class Finding:
    """A rule's conclusion, with numbers in the summary and a concrete fix."""

    rule_id: str = field(default="", kw_only=True)  # stamped by Rule.run; a finding made elsewhere (a test) passes it
    severity: Severity
    title: str
    summary: str
    fix: str = ""  # empty: the rule's documented "How to fix" is used
    evidence: list[Evidence] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    window: tuple[datetime, datetime] | None = None
    cost_seconds: float | None = None
    ports: list[str] = field(default_factory=list)  # HCA ports as `mlx5_1:1` (or a netdev name)
    # How strongly the evidence points here, for ordering: 0 for single-source findings; the
    # correlation rules (TL41x) give the number of independent sources that agree plus a
    # fraction for the time lost, so a joined root cause ranks above its separate symptoms.
    score: float = 0.0
    verdict: Verdict | None = None  # the correlation rules' diagnosis of a slow window

    MAX_EVIDENCE = 50

    def __post_init__(self) -> None:
        self.hosts = sorted({h for h in self.hosts if h})
        self.ranks = sorted({int(r) for r in self.ranks if r is not None})
        self.evidence_total = len(self.evidence)
        self.evidence = self.evidence[: self.MAX_EVIDENCE]

    @property
    def scope(self) -> str:
        """Where, in a few words: 'node02 (mlx5_1:1)', 'node01, node02 +3 more'."""
        hosts = self.hosts[:3] + ([f"+{len(self.hosts) - 3} more"] if len(self.hosts) > 3 else [])
        where = ", ".join(hosts)
        return f"{where} ({', '.join(self.ports)})" if self.ports and where else where or ", ".join(self.ports)

    def to_json(self) -> dict:
        data = asdict(self)
        data["severity"] = self.severity.label
        data["evidence_total"] = self.evidence_total
        data["window"] = [t.isoformat() for t in self.window] if self.window else None
        data["evidence"] = [
            {k: v for k, v in asdict(e).items() if v is not None} | {"location": e.location} for e in self.evidence
        ]
        return data
