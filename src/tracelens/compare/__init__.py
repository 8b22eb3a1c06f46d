"""Compare a healthy run with a slow one: what changed, ranked by how much of the slowdown it explains.

Each side is read from its own tables: the facts of its set-up (NCCL, DeepSpeed, ports), its
event rates (packets, counters), its step times and its findings. Hosts are matched by name where
the runs share names, else by role (the value distribution over "the 16 hosts of each run").

The ranking model, for every change found:

    score = prior x (0.5 + 0.5 x coverage) x link

- `prior`: how much a change of that kind usually costs a data-parallel run (a socket fallback or
  a port down more than a new NCCL version, which more than a logging setting); see PRIOR.
- `coverage`: the share of the slow run's hosts it touches (one host in sixteen on sockets slows
  every collective too, hence the 0.5 floor).
- `link`: when the step time rose significantly, a change whose part of the step (all-reduce,
  optimizer step, compute ...) rose with it gets 1 + 2 x the share of the rise it accounts for; a
  change whose part did not move gets 0.5; with no step timers to tell, 1.

A difference counts only when it is real: facts differ or they do not; a rate counts when the
conditional Poisson test puts its rise at p < 0.001 and it at least doubled; the step time and
each part of it when a Mann-Whitney test gives p < 0.001 and the shift is at least 5% of the good
step (tracelens.compare.timing). So two runs of the same healthy job rank nothing.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import polars as pl

from tracelens.compare.facts import run_facts, sources
from tracelens.compare.rates import Rate, run_rates
from tracelens.compare.timing import PaceChange, compare_pace, pace
from tracelens.prose import count
from tracelens.stats import rate_rise_p

if TYPE_CHECKING:
    from tracelens.analyze import Analysis, RuleFailure
    from tracelens.config_file import Config

# The input each area of change is read from (tracelens.compare.facts.sources).
SOURCE_OF = {"NCCL setting": "NCCL", "DeepSpeed config": "DeepSpeed"}

# A fact's part of the step (tracelens.compare.facts) as the step timers split it.
PHASE_GROUPS = {"compute": ("forward", "backward compute")}

RATE_P = 0.001
RATE_RATIO = 2.0
MAX_HOSTS_NAMED = 4

# (area, pattern on the key) -> prior; the first match wins.
PRIOR: tuple[tuple[str, str, float], ...] = (
    ("NCCL", r"^(?:network|inter-node transport)$", 1.0),
    ("fabric", r" state$", 1.0),
    ("fabric", r" (?:rate|width)$", 0.9),
    ("packets", r".", 0.8),
    ("counters", r".", 0.8),
    (
        "NCCL setting",
        r"^NCCL_(?:IB_DISABLE|NET|IB_HCA|NET_GDR_LEVEL|NET_GDR_READ|P2P_DISABLE|SHM_DISABLE|SOCKET_IFNAME)$",
        0.8,
    ),
    ("NCCL", r"^HCAs used$", 0.7),
    ("DeepSpeed config", r"overlap_comm|offload", 0.7),
    ("fabric", r" active MTU$", 0.6),
    ("NCCL", r"^(?:intra-node transport|net plugin)$", 0.6),
    ("DeepSpeed config", r"zero_optimization\.stage|micro_batch|gradient_accumulation|train_batch_size", 0.6),
    ("NCCL", r".", 0.5),
    ("NCCL setting", r".", 0.5),
    ("DeepSpeed config", r"bucket_size|precision|^(?:bf16|fp16)\.", 0.5),
    ("run", r".", 0.5),
    ("DeepSpeed", r".", 0.4),
    ("findings", r".", 0.3),
    ("DeepSpeed config", r".", 0.3),
)


@dataclass(frozen=True)
class Change:
    """One difference between the runs, with where it is and how much of the slowdown it explains."""

    area: str  # NCCL, NCCL setting, DeepSpeed config, fabric, packets, counters, run, findings
    what: str
    good: str  # as the good run had it
    bad: str
    hosts: tuple[str, ...]  # the slow run's hosts where it changed (empty: run-wide)
    coverage: float
    phase: str | None  # the part of the step it acts on
    detail: str = ""
    change: str = ""  # "from -> to" for the changed hosts, when they all changed the same way
    explains_ms: float | None = None  # the rise of that part per step, when it rose significantly
    score: float = 0.0  # see the module doc; set by _scored

    @property
    def where(self) -> str:
        if not self.hosts:
            return ""
        named = ", ".join(self.hosts[:MAX_HOSTS_NAMED]) + (" ..." if len(self.hosts) > MAX_HOSTS_NAMED else "")
        return f"{len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''} ({named})"

    @property
    def sentence(self) -> str:
        if self.change and self.where:
            return f"{self.area} {self.what}: {self.change} on {self.where}"
        return f"{self.area} {self.what}: {self.good} -> {self.bad}"

    def to_json(self) -> dict:
        return {
            "area": self.area, "what": self.what, "good": self.good, "bad": self.bad, "hosts": list(self.hosts),
            "coverage": round(self.coverage, 3), "phase": self.phase,
            "explains_ms": None if self.explains_ms is None else round(self.explains_ms, 1),
            "score": round(self.score, 3), "detail": self.detail, "change": self.change, "sentence": self.sentence,
        }  # fmt: skip


@dataclass
class Comparison:
    """What changed from the good run to the bad one, most explaining first."""

    good: str
    bad: str
    pace: PaceChange | None
    changes: list[Change]
    unchanged: list[str] = field(default_factory=list)  # areas compared that did not change
    unavailable: list[str] = field(default_factory=list)  # areas only one run (or neither) has
    gone_findings: list[str] = field(default_factory=list)  # findings of the good run the bad one lacks
    config: Config | None = None  # the config file the runs were read with (the slow run's)
    failed: list[tuple[str, RuleFailure]] = field(default_factory=list)  # rules that failed, by run ("good", "slow")

    @property
    def config_label(self) -> str:
        """How the reports name the config: its path, or none (defaults)."""
        return self.config.label if self.config else "none (defaults)"

    @property
    def verdict(self) -> str:
        top = self.changes[0] if self.changes else None
        pace = self.pace
        if pace and pace.slower:
            lead = _pace_text(pace) if pace.significant and pace.delta_ms > 0 else pace.slow_steps.text
            return (
                f"{lead}; most likely: {top.sentence}."
                if top
                else f"{lead}; no change in set-up, fabric or traffic was found to explain it."
            )
        if pace and pace.significant:  # significantly faster: nothing to explain
            lead = f"The slow run's steps were not slower ({_pace_text(pace)})"
        elif pace:
            lead = f"The step time did not change significantly ({_pace_text(pace)})"
        else:
            lead = "No step timings to compare"
        if top:
            return f"{lead}; {count(len(self.changes), 'change')} found, first: {top.sentence}."
        if pace and not pace.significant:
            return f"No significant difference: {_pace_text(pace)}, and no setting, transport, port or rate changed."
        return f"{lead}; no difference found in set-up, fabric or traffic."

    def to_json(self) -> dict:
        data: dict = {
            "good": self.good, "bad": self.bad, "verdict": self.verdict,
            "changes": [c.to_json() for c in self.changes],
            "unchanged": self.unchanged, "unavailable": self.unavailable, "gone_findings": self.gone_findings,
            "config": str(self.config.source) if self.config and self.config.source else None,
            "rules_failed": [{"run": run, **f.to_json()} for run, f in self.failed],
        }  # fmt: skip
        if self.pace:
            data["steps"] = {
                "good": _pace_json(self.pace.good), "bad": _pace_json(self.pace.bad),
                "delta_ms": round(self.pace.delta_ms, 1), "p": self.pace.p, "significant": self.pace.significant,
                "slow_steps": {"threshold_ms": round(self.pace.slow_steps.threshold_ms, 1),
                               "good": self.pace.slow_steps.good, "bad": self.pace.slow_steps.bad,
                               "p": self.pace.slow_steps.p, "significant": self.pace.slow_steps.significant},
                "phases": [{"phase": p.phase, "good_ms": round(p.good_ms, 1), "bad_ms": round(p.bad_ms, 1),
                            "delta_ms": round(p.delta_ms, 1), "p": p.p, "significant": p.significant}
                           for p in self.pace.phases],
            }  # fmt: skip
        return data


def _pace_json(side) -> dict:
    return {
        "steps": side.per_step.height, "mean_ms": round(side.mean_ms, 1), "median_ms": round(side.median_ms, 1),
        "p95_ms": round(side.p95_ms, 1), "samples_per_sec": side.samples_per_sec, "comm_share": side.comm_share,
    }  # fmt: skip


def _pace_text(change: PaceChange) -> str:
    good, bad = change.good.mean_ms, change.bad.mean_ms
    text = f"{good / 1000:.2f} s -> {bad / 1000:.2f} s per step ({change.relative:+.0%})"
    rising = [p for p in change.phases if p.significant and p.delta_ms > 0]
    if change.significant and rising:
        top = max(rising, key=lambda p: p.delta_ms)
        if top.delta_ms >= 0.95 * change.delta_ms:
            text += f", all of it in the {top.phase} ({top.delta_ms:+,.0f} ms)"
        else:
            text += f", the {top.phase} {top.delta_ms:+,.0f} ms of the {change.delta_ms:+,.0f} ms"
    return text


def compare(good: Analysis, bad: Analysis) -> Comparison:
    """Compare two analysed runs."""
    have_good, have_bad = sources(good.tables), sources(bad.tables)
    both = have_good & have_bad
    unavailable = [
        f"{area}: only in the {'good' if area in have_good else 'slow'} run" for area in sorted(have_good ^ have_bad)
    ]
    good_pace = pace(good.context) if "steps" in both else None
    bad_pace = pace(bad.context) if "steps" in both else None
    pace_change = compare_pace(good_pace, bad_pace) if good_pace and bad_pace else None

    raw = [
        *_fact_changes(run_facts(good.context), run_facts(bad.context), both),
        *_rate_changes(run_rates(good.context), run_rates(bad.context)),
        *_run_changes(good, bad),
        *_finding_changes(good, bad),
    ]
    host_count = max(1, len(_hosts(bad)))
    changes = sorted((_scored(c, pace_change, host_count) for c in raw), key=lambda c: (-c.score, c.area, c.what))
    changed_sources = {SOURCE_OF.get(c.area, c.area) for c in changes}
    if pace_change and pace_change.significant:
        changed_sources.add("steps")
    unchanged = sorted(both - changed_sources)
    gone = sorted({f"{f.rule_id} {f.title}" for f in good.findings} - {f"{f.rule_id} {f.title}" for f in bad.findings})
    failed = [("good", f) for f in good.failed] + [("slow", f) for f in bad.failed]
    return Comparison(
        str(good.target), str(bad.target), pace_change, changes, unchanged, unavailable, gone, bad.config, failed
    )


def _hosts(analysis: Analysis) -> set[str]:
    hosts: set[str] = set()
    for name in ("nccl_events", "steps", "ib_ports", "deepspeed_settings"):
        hosts.update(
            h
            for h in analysis.tables.scan(name).select(pl.col("host").unique()).collect(engine="streaming")["host"]
            if h
        )
    return hosts


def _distribution(values: dict[str, str]) -> str:
    counts = Counter(values.values())
    total = len(values)
    if len(counts) == 1:
        value = next(iter(counts))
        return value if total == 1 else f"{value} on all {total} hosts"
    parts = []
    for value, n in counts.most_common():
        hosts = sorted(h for h, v in values.items() if v == value)
        named = ", ".join(hosts[:MAX_HOSTS_NAMED]) + (" ..." if n > MAX_HOSTS_NAMED else "")
        parts.append(f"{value} on {n} of {total} hosts ({named})")
    return "; ".join(parts)


def _fact_changes(good: pl.DataFrame, bad: pl.DataFrame, both: set[str]) -> list[Change]:
    """Facts that differ, per (area, key), hosts matched by name where the runs share them, else by role."""
    out = []
    keys = pl.concat([good.select("area", "key", "phase"), bad.select("area", "key", "phase")]).unique(["area", "key"])
    for area, key, phase in keys.sort("area", "key").iter_rows():
        if SOURCE_OF.get(area, area) not in both:
            continue
        g = dict(good.filter(pl.col("area") == area, pl.col("key") == key).select("host", "value").iter_rows())
        b = dict(bad.filter(pl.col("area") == area, pl.col("key") == key).select("host", "value").iter_rows())
        changed = _changed_hosts(g, b)
        if not changed:
            continue
        pairs = {(g.get(h, "(not seen)"), b.get(h, "(not seen)")) for h in changed}
        change = "{} -> {}".format(*pairs.pop()) if len(pairs) == 1 and g.keys() & set(changed) else ""
        out.append(Change(area, key, _distribution(g) if g else "(not seen)", _distribution(b) if b else "(not seen)",
                        tuple(changed), len(changed) / max(1, len(b)), phase, change=change))  # fmt: skip
    return out


def _changed_hosts(good: dict[str, str], bad: dict[str, str]) -> list[str]:
    """The slow run's hosts whose value differs: from the same host's value where hosts match by
    name, else from what the good run's hosts had (by role)."""
    if not good or not bad:
        return sorted(bad) if bad else (["(all)"] if good else [])
    common = good.keys() & bad.keys()
    if common and len(common) * 2 >= min(len(good), len(bad)):
        changed = {h for h in common if good[h] != bad[h]}
        changed |= {h for h in bad.keys() - common if bad[h] not in good.values()}
        return sorted(changed)
    seen = set(good.values())
    changed = {h for h, v in bad.items() if v not in seen}
    if not changed:  # same values, other proportions: the hosts whose value gained share
        g_share = {v: n / len(good) for v, n in Counter(good.values()).items()}
        b_share = {v: n / len(bad) for v, n in Counter(bad.values()).items()}
        grew = {v for v, s in b_share.items() if s > g_share.get(v, 0.0) + 1e-9}
        changed = {h for h, v in bad.items() if v in grew} if g_share != b_share else set()
    return sorted(changed)


def _rate_changes(good: dict[tuple[str, str], Rate], bad: dict[tuple[str, str], Rate]) -> list[Change]:
    """Event rates that rose significantly (both runs must have observed the same kind of source)."""
    out = []
    for key in sorted(good.keys() & bad.keys()):
        g, b = good[key], bad[key]
        p = rate_rise_p(b.count, b.exposure_s, g.count, g.exposure_s)
        ratio = b.per_s / g.per_s if g.per_s else float("inf")
        if b.count and p < RATE_P and ratio >= RATE_RATIO:
            detail = f"{b.count:,} in {b.exposure_s:,.0f} s vs {g.count:,} in {g.exposure_s:,.0f} s (p = {p:.1e})"
            out.append(Change(b.area, b.what, f"{g.per_s:.3g}/s", f"{b.per_s:.3g}/s", (), 1.0, "all-reduce", detail))
    return out


def _run_changes(good: Analysis, bad: Analysis) -> list[Change]:
    """The job's shape: how many hosts and ranks took part."""
    out = []
    sizes = {
        "hosts": (len(_hosts(good)), len(_hosts(bad))),
        "ranks": tuple(
            a.tables.scan("nccl_comms").select(pl.col("rank").n_unique()).collect().item() for a in (good, bad)
        ),
    }
    for what, (g, b) in sizes.items():
        if g and b and g != b:
            out.append(Change("run", what, str(g), str(b), (), 1.0, "whole step"))
    return out


def _finding_changes(good: Analysis, bad: Analysis) -> list[Change]:
    """Warnings and criticals the slow run has and the good one does not."""
    before = {f.rule_id for f in good.findings}
    new: dict[str, list] = {}
    for f in bad.findings:
        if f.rule_id not in before and f.severity > 0:
            new.setdefault(f.rule_id, []).append(f)
    out = []
    for rule_id, found in new.items():
        worst = max(found, key=lambda f: f.severity)
        hosts = tuple(sorted({h for f in found for h in f.hosts}))
        times = f" ({len(found)} findings)" if len(found) > 1 else ""
        out.append(
            Change(
                "findings",
                f"{rule_id} {worst.title}",
                "absent",
                worst.severity.label + times,
                hosts,
                1.0,
                None,
                worst.summary,
            )
        )
    return out


def _prior(area: str, what: str) -> float:
    return next((p for a, pattern, p in PRIOR if a == area and re.search(pattern, what)), 0.3)


def _scored(raw: Change, change: PaceChange | None, host_count: int) -> Change:
    link, explains = 1.0, None
    if change and change.slower and raw.phase:
        if raw.phase == "whole step":
            link, explains = 1.5, (change.delta_ms if change.delta_ms > 0 else None)
        else:
            moved = [p for name in PHASE_GROUPS.get(raw.phase, (raw.phase,)) if (p := change.phase(name))]
            rose = sum(p.delta_ms for p in moved if p.significant and p.delta_ms > 0)
            if rose:
                explains = rose
                link = 1 + 2 * min(1.0, rose / max(change.delta_ms, rose))
            elif moved:
                link = 0.5
    coverage = min(1.0, raw.coverage)
    score = _prior(raw.area, raw.what) * (0.5 + 0.5 * coverage) * link
    hosts = tuple(h for h in raw.hosts if h != "(all)")
    return replace(raw, hosts=hosts, coverage=coverage, explains_ms=explains, score=score)
