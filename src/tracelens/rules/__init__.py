"""The rule registry: every module in this package registers its rules with `@rule`.

A rule reads the RunContext (tracelens.derived: aligned tables and shared derived results)
and yields Findings; it never reads files. `@rule` declares what it needs, its kind and its
settings (see tracelens.derived for an example). Its docstring has three parts, always in
this order and with these headings: What it finds / Why it slows the run / How to fix.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tracelens.derived import SHARED, RunContext
from tracelens.findings import Finding, Severity
from tracelens.tables import INPUTS, SCHEMAS, RunTables

RuleFunc = Callable[..., Iterable[Finding]]  # (ctx: RunContext, *, setting=default, ...) -> findings
Kind = Literal["symptom", "cause", "root cause"]
KINDS: tuple[Kind, ...] = ("symptom", "cause", "root cause")

_SECTIONS = ("What it finds", "Why it slows the run", "How to fix")


@dataclass(frozen=True)
class Setting:
    """What a rule's keyword-only parameter means: its unit and one sentence. The default is the
    parameter's own default; `value` is filled in from it when the rule is registered. A value must
    be `below` this, when given (a confidence of 1 bounds nothing)."""

    unit: str
    help: str
    name: str = ""
    default: Any = None
    below: float | None = None


@dataclass(frozen=True)
class Rule:
    """A registered check: its id and name, default severity, kind, the tables it needs, its
    settings, and the function that yields findings."""

    id: str
    name: str
    severity: Severity
    func: RuleFunc
    kind: Kind = "cause"
    needs: tuple[str, ...] = ()  # names of tables (tracelens.tables.SCHEMAS); "a|b": either
    settings: tuple[Setting, ...] = field(default=())
    shared: tuple[str, ...] = ()  # groups of shared settings (tracelens.derived.SHARED) beyond those its needs imply

    @property
    def shared_settings(self) -> tuple[str, ...]:
        """The groups of shared settings ([steps], [baseline], [packets]) the rule's results depend on:
        those it declares `shared`, and steps or packets when it needs the table of that name."""
        needed = {name for need in self.needs for name in need.split("|")}
        return tuple(s for s in SHARED if s in self.shared or s in needed)

    @property
    def docs(self) -> dict[str, str]:
        """The three documented parts of the rule, parsed from its docstring."""
        return parse_doc(self.func.__doc__ or "")

    def missing(self, tables: RunTables) -> list[str]:
        """The needs this run's tables do not meet (an empty table does not meet a need)."""
        return [need for need in self.needs if not any(tables.height(name) for name in need.split("|"))]

    def missing_inputs(self, tables: RunTables) -> list[str]:
        """What input would let the rule run, one phrase per unmet need."""
        return [" or ".join(INPUTS.get(name, name) for name in need.split("|")) for need in self.missing(tables)]

    def values(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every setting's value: its default unless `overrides` (from a config file) sets it."""
        overrides = overrides or {}
        return {s.name: overrides.get(s.name, s.default) for s in self.settings}

    def run(
        self, ctx: RunContext, settings: Mapping[str, Any] | None = None, severity: Severity | None = None
    ) -> list[Finding]:
        """The rule's findings, stamped with its id (and `severity`, when a config sets one), the
        documented fix where the rule gave none."""
        findings = list(self.func(ctx, **self.values(settings)))
        for finding in findings:
            finding.rule_id = self.id
            finding.fix = finding.fix or self.docs["How to fix"]
            if severity is not None:
                finding.severity = severity
        return findings


_REGISTRY: dict[str, Rule] = {}


def rule(
    rule_id: str,
    name: str,
    severity: Severity,
    *,
    kind: Kind = "cause",
    needs: tuple[str, ...] = (),
    settings: Mapping[str, Setting] | None = None,
    shared: tuple[str, ...] = (),
) -> Callable[[RuleFunc], RuleFunc]:
    """Register a rule function under `rule_id` (TL1xx transport ... TL6xx host). `settings`
    describes each keyword-only parameter of the function (whose default is the setting's); `shared`
    names the groups of shared settings its derived results depend on besides its needs' (e.g. "baseline")."""

    def register(func: RuleFunc) -> RuleFunc:
        if rule_id in _REGISTRY:
            raise ValueError(f"rule id {rule_id} registered twice")
        missing = [s for s in _SECTIONS if s + ":" not in (func.__doc__ or "")]
        if missing:
            raise ValueError(f"rule {rule_id} docstring lacks: {', '.join(missing)}")
        tables = [n for need in needs for n in need.split("|") if n not in SCHEMAS]
        if tables:
            raise ValueError(f"rule {rule_id}: needs unknown table(s) {tables} (tracelens.tables.SCHEMAS)")
        unknown = [s for s in shared if s not in SHARED]
        if unknown:
            raise ValueError(f"rule {rule_id}: unknown group(s) of shared settings {unknown} (one of {list(SHARED)})")
        if kind not in KINDS:
            raise ValueError(f"rule {rule_id}: unknown kind {kind!r} (one of {list(KINDS)})")
        declared = _declared(rule_id, func, settings or {})
        _REGISTRY[rule_id] = Rule(rule_id, name, severity, func, kind, needs, declared, shared)
        return func

    return register


def _declared(rule_id: str, func: RuleFunc, described: Mapping[str, Setting]) -> tuple[Setting, ...]:
    """The rule's settings: its keyword-only parameters, each described in the decorator."""
    params = {p.name: p for p in inspect.signature(func).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if set(params) != set(described) or any(p.default is p.empty for p in params.values()):
        raise ValueError(
            f"rule {rule_id}: keyword-only parameters with defaults {sorted(params)} "
            f"must match the settings described {sorted(described)}"
        )
    return tuple(replace(described[n], name=n, default=params[n].default) for n in params)


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
    """Every registered rule, sorted by id. The rule modules are found in this package (every module
    of it is imported once, in name order): a new rule module needs no import list."""
    for name in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{name}")
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def select_rules(select: list[str] | None = None, ignore: list[str] | None = None) -> list[Rule]:
    """Rules whose id starts with one of `select` (all if empty) and none of `ignore`."""
    chosen = all_rules()
    if select:
        chosen = [r for r in chosen if any(r.id.startswith(s) for s in select)]
    if ignore:
        chosen = [r for r in chosen if not any(r.id.startswith(s) for s in ignore)]
    return chosen
