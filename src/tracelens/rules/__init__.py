"""The rule registry: every module in this package registers its rules with `@rule`.

A rule reads RunTables and yields Findings; it never reads files. Its
docstring has three parts, always in this order and with these headings:
What it finds / Why it slows the run / How to fix.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tracelens.findings import Finding, Severity
from tracelens.tables import RunTables

RuleFunc = Callable[[RunTables], Iterable[Finding]]

_SECTIONS = ("What it finds", "Why it slows the run", "How to fix")


@dataclass(frozen=True)
class Rule:
    """A registered check: its id and name, default severity, and the function that yields findings."""

    id: str
    name: str
    severity: Severity
    func: RuleFunc

    @property
    def docs(self) -> dict[str, str]:
        """The three documented parts of the rule, parsed from its docstring."""
        return parse_doc(self.func.__doc__ or "")

    def run(self, tables: RunTables) -> list[Finding]:
        findings = list(self.func(tables))
        for finding in findings:
            finding.fix = finding.fix or self.docs["How to fix"]
        return findings


_REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str, name: str, severity: Severity) -> Callable[[RuleFunc], RuleFunc]:
    """Register a rule function under `rule_id` (TL1xx transport ... TL5xx config)."""

    def register(func: RuleFunc) -> RuleFunc:
        if rule_id in _REGISTRY:
            raise ValueError(f"rule id {rule_id} registered twice")
        missing = [s for s in _SECTIONS if s + ":" not in (func.__doc__ or "")]
        if missing:
            raise ValueError(f"rule {rule_id} docstring lacks: {', '.join(missing)}")
        _REGISTRY[rule_id] = Rule(rule_id, name, severity, func)
        return func

    return register


def parse_doc(doc: str) -> dict[str, str]:
    """Split a rule docstring into its three sections, whitespace folded."""
    pattern = "|".join(re.escape(s) for s in _SECTIONS)
    parts = re.split(rf"^\s*({pattern}):", doc, flags=re.MULTILINE)
    out: dict[str, str] = {}
    for title, body in zip(parts[1::2], parts[2::2]):
        text = " ".join(body.split())
        out[title] = text[:1].upper() + text[1:]
    return out


def all_rules() -> list[Rule]:
    """Every registered rule, sorted by id (imports the rule modules once)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def select_rules(select: list[str] | None = None, ignore: list[str] | None = None) -> list[Rule]:
    """Rules whose id starts with one of `select` (all if empty) and none of `ignore`."""
    chosen = all_rules()
    if select:
        chosen = [r for r in chosen if any(r.id.startswith(s) for s in select)]
    if ignore:
        chosen = [r for r in chosen if not any(r.id.startswith(s) for s in ignore)]
    return chosen
