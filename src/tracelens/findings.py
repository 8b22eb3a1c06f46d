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
    def parse(cls, text: str) -> "Severity":
        return cls[text.strip().upper()]


@dataclass(frozen=True)
class Evidence:
    """One piece of proof: a line of a file (or a frame of a capture) and its text."""

    file: str
    line: int | None = None
    text: str = ""
    host: str | None = None
    frame: int | None = None

    @property
    def location(self) -> str:
        if self.frame is not None:
            return f"{self.file} frame {self.frame}"
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class Reasons:
    """Why a finding says what it says, as bullets a person can check one by one.

    because: each piece of evidence for it, with its numbers, its source and its place
        ("node02 mlx5_1 port 1: SymbolErrorCounter rose by 8,123 between the dumps at ...").
    against: what was checked and found normal, and the other causes considered with why
        they lost ("a bad link on node01: 3 sources, but none of them its own port's").
    not_available: the sources with nothing for this window, each with what to collect next time.
    """

    because: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)
    not_available: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.because or self.against or self.not_available)


@dataclass
class Finding:
    """A rule's conclusion, with numbers in the summary and a concrete fix."""

    rule_id: str
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
    # The case as bullets (the correlation rules fill it); `summary` stays the one-paragraph form.
    reasons: Reasons = field(default_factory=Reasons)

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
            {k: v for k, v in asdict(e).items() if v is not None} | {"location": e.location}
            for e in self.evidence
        ]
        return data


@dataclass
class Verdict:
    """The answer at the top of every output: what slowed the run, where, when and what it cost,
    with the case for it (`Reasons`) and the one fix of the cause it names.

    Built from the top-ranked finding (the correlation rules rank the joined root cause first);
    the terminal, the HTML and the Markdown all print this one value.
    """

    severity: str  # "critical", "warning", "ok" or "unreadable"
    headline: str
    where: str = ""
    window: tuple[datetime, datetime] | None = None
    cost_seconds: float | None = None
    reasons: Reasons = field(default_factory=Reasons)
    fix: str = ""
    finding: int | None = None  # 1-based index of the finding it rests on
    more: int = 0  # other warnings and criticals below it

    def to_json(self) -> dict:
        data = asdict(self)
        data["window"] = [t.isoformat() for t in self.window] if self.window else None
        return data
