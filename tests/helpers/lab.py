"""What a verdict must say about a real lab run (fixtures/lab-* and fixtures/lab-matrix/*), shared by
the lab tests and lab/score.py: the causes a finding names, their families, and the matrix's checks.

Each run's expected.json says what was injected (`cause`), where (`hosts`, `ranks`), when (`window`,
UTC) and, for a skewed clock, by how much (`clock_offsets`). A finding names a cause through its
title, the headline a person reads first, or its structured verdict's cause; the runner-up a title
names as such is not blamed. Rules that are evidence of one cause by nature (TL404 a straggler,
TL2xx/TL3xx the network) blame it whatever their wording.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from tests.helpers import FIXTURES
from tracelens.analyze import Analysis
from tracelens.findings import Finding, Severity

MATRIX = FIXTURES / "lab-matrix"

# What a title must say to name each injected cause.
NAMES = {
    "link": r"bad link|packet loss|lossy",
    "congestion": r"congest|bandwidth|rate limit|throttl",
    "straggler": r"straggler|slow rank",
    "contention": r"contention|every rank|all ranks",
    "input": r"input pipeline|data[ -]?loader|input stall",
    "checkpoint": r"checkpoint|input pipeline or checkpoint",
    "hang": r"\bhang|\bhung|desync|stuck|stopped",
}
FAMILY = {
    "link": "network",
    "congestion": "network",
    "socket": "network",
    "receiver": "network",
    "failure": "network",
    "comm": "network",
    "straggler": "straggler",
    "contention": "contention",
    "input": "input",
    "checkpoint": "input",
    "hang": "hang",
}
NETWORK_RULES = re.compile(r"TL(10[79]|2\d\d|30[0-46-9])$")  # TL305 (capture duplicates) is an artefact
CONFIGURATION_RULES = re.compile(r"TL5\d\d$")  # what a clean run may still be told: its settings
WINDOW_SLACK = timedelta(seconds=6)  # a verdict's window edges, against the injected ones
OFFSET_SLACK_S = 0.2  # a stated clock offset, against the injected one


def expected_of(folder: Path) -> dict:
    return json.loads((folder / "expected.json").read_text())


def runs_in(folder: Path) -> list[Path]:
    """The lab's runs in `folder` (each a folder with its expected.json), by name."""
    return sorted(p.parent for p in folder.glob("*/expected.json"))


def matrix_runs(held_out: bool) -> list[Path]:
    """The lab matrix's runs, the held-out part or the rest (lab/README.md)."""
    return [p for p in runs_in(MATRIX) if expected_of(p).get("held_out", False) == held_out]


STEPS_PER_PRINT = 10  # DeepSpeed's default steps_per_print
_RANK_TAG = re.compile(r"\[Rank (\d+)\]")
_PROGRESS = re.compile(r"\] step=(\d+),|global_step=(\d+),")


def _printed_by_default(line: str) -> bool:
    tag = _RANK_TAG.search(line)
    if (tag and tag.group(1) != "0") or "comm op:" in line:  # other ranks' lines; the comms logger's
        return False
    progress = _PROGRESS.search(line)
    return not progress or int(progress.group(1) or progress.group(2)) % STEPS_PER_PRINT == 0


def rank0_view(folder: Path, into: Path) -> Path:
    """A DeepSpeed lab run (the lab prints every rank's timers, progress and comms logger lines at every
    step) as DeepSpeed prints it by default: timers and progress lines on rank 0 only, progress lines every
    STEPS_PER_PRINT steps, no comms logger. The same real run, seen through the logging most jobs keep;
    written to `into`/<run> once, its job's `printing` set to "default" (what is knowable there: as_printed)."""
    view = into / folder.name
    if view.exists():
        return view
    shutil.copytree(folder, view)
    for log in [*view.rglob("*.log"), *view.rglob("*.log.gz")]:
        opener = gzip.open if log.suffix == ".gz" else open
        with opener(log, "rt", errors="replace") as f:
            lines = [line for line in f if _printed_by_default(line)]
        with opener(log, "wt") as f:
            f.writelines(lines)
    run = expected_of(folder)
    run["job"]["printing"] = "default"
    (view / "expected.json").write_text(json.dumps(run, indent=2))
    return view


def as_printed(run: dict) -> dict:
    """What a run's checks can ask of it, given what its logs print. Plain DDP prints one elapsed time per
    iteration: a slow rank, contention or a slow loader raise every rank's alike, so none is knowable
    (`unseen`) without profiler traces (fixtures/lab-traces). Under DeepSpeed's default printing
    (rank 0's timers only) a slow rank or a contended host that is not rank 0's shows in no log's timers,
    nor does rank 0's own work under ZeRO-3 (its forward all-gathers), so no cause is knowable (`unseen`:
    the verdict must name none); rank 0's own work rising alone cannot tell a straggler from contention on
    every rank (`causes`: either, on rank 0); one host's steps measure no clock offset. A profiler trace
    of every rank (`traces`) times each rank's own work and arrival: with them every cause is knowable."""
    job = run.get("job", {})
    traced = bool(run.get("traces"))
    if job.get("engine") == "ddp" and not traced and run["cause"] in ("straggler", "contention", "input"):
        return {**run, "unseen": True}  # one time per iteration: no timer splits own work, waiting or loading
    if job.get("printing") != "default":
        return run
    run = dict(run)
    if run["cause"] in ("straggler", "contention") and not traced:
        if 0 in run["ranks"] and job.get("zero") != 3:
            run["causes"] = ["straggler", "contention"]
            run["ranks"], run["hosts"] = [0], [job["rank_hosts"]["0"]]
        else:
            run["unseen"] = True
    run.pop("clock_offsets", None)
    return run


def named(finding: Finding) -> set[str]:
    """The causes a finding names: those its title words, and its verdict's cause when it has one (the
    title's words then only describe that cause: "slower collectives on every rank" is no contention,
    "an input pipeline or checkpoint stall" names both)."""
    title = re.sub(r" \(runner-up: [^)]*\)", "", finding.title)
    said = {cause for cause, words in NAMES.items() if re.search(words, title, re.I)}
    verdict = finding.verdict
    if verdict and verdict.cause:
        return {verdict.cause} | {c for c in said if FAMILY.get(c) == FAMILY.get(verdict.cause)}
    return said


def families(finding: Finding) -> set[str]:
    """The cause families a finding blames."""
    blamed = {FAMILY.get(cause, cause) for cause in named(finding)}
    if finding.rule_id == "TL404":
        blamed.add("straggler")
    if NETWORK_RULES.match(finding.rule_id):
        blamed.add("network")
    return blamed


def loud_of(analysis: Analysis) -> list[Finding]:
    return [f for f in analysis.findings if f.severity >= Severity.WARNING]


def listing(findings: list[Finding]) -> str:
    return "\n".join(
        f"  {f.rule_id} {f.severity.label} hosts={f.hosts} ranks={f.ranks} window={span(f.window)}: {f.title}"
        for f in findings[:8]
    )


def span(window) -> str:
    return f"{window[0].isoformat()} .. {window[1].isoformat()}" if window else "none"


def window_of(run: dict) -> tuple[datetime, datetime]:
    start, end = (datetime.fromisoformat(t) for t in run["window"])
    return start, end


def stated_offsets(analysis: Analysis, host: str) -> list[float]:
    """The clock offsets (s) the analysis's notes state for `host`."""
    return [
        float(m.group(1))
        for n in analysis.notes
        if host in n and re.search(r"clock|offset|ahead|behind", n, re.I)
        for m in re.finditer(r"([+-]?[0-9]+(?:\.[0-9]+)?) ?s\b", n)
    ]


MATRIX_CHECKS = ("cause", "window", "where", "offset")


def matrix_check(folder: Path, analysis: Analysis, check: str) -> str | None:
    """One of issue 34's checks of a lab matrix run: "" when it passes, why when it fails, None when it
    does not apply. cause: the top finding names the injected cause (a clean run: no warning beyond
    its configuration); window: its window within WINDOW_SLACK of the injected one; where: a slow rank's
    rank and host; offset: a skewed clock's offset stated within OFFSET_SLACK_S."""
    run = as_printed(expected_of(folder))
    cause = run["cause"]
    findings = analysis.findings
    top = findings[0] if findings else None
    context = f"\n{listing(findings)}"
    if check == "cause":
        if cause is None:
            noisy = [f for f in loud_of(analysis) if not CONFIGURATION_RULES.match(f.rule_id)]
            return f"a clean run got warnings:\n{listing(noisy)}" if noisy else ""
        if run.get("unseen"):
            blamed = families(top) if top is not None and top.severity >= Severity.WARNING else set()
            return f"the slow rank logs no timers, yet the top finding blames {blamed}{context}" if blamed else ""
        if top is None or top.severity < Severity.WARNING:
            return f"no warning names {cause}{context}"
        wanted = {FAMILY[c] for c in run.get("causes") or [cause]}
        return "" if wanted & families(top) else f"the top finding does not name {cause}{context}"
    if cause is None:
        return None
    if check == "window":
        if run.get("unseen") and (top is None or top.window is None):  # no cause to name: the stretch that warns
            top = next((f for f in loud_of(analysis) if f.window), None)
        if top is None or top.window is None:
            return f"the top finding has no window{context}"
        start, end = window_of(run)
        far = abs(top.window[0] - start) > WINDOW_SLACK or (cause != "hang" and abs(top.window[1] - end) > WINDOW_SLACK)
        return f"window {span(top.window)}, injected {span((start, end))}{context}" if far else ""
    if check == "where":
        if cause != "straggler" or run.get("unseen"):
            return None
        if top is None or (top.ranks, top.hosts) != (run["ranks"], run["hosts"]):
            return f"expected ranks {run['ranks']} on {run['hosts']}{context}"
        return ""
    if check == "offset":
        offsets = run.get("clock_offsets") or {}
        if not offsets:
            return None
        ((host, offset),) = offsets.items()
        stated = stated_offsets(analysis, host)
        ok = any(abs(abs(v) - abs(offset)) <= OFFSET_SLACK_S for v in stated)
        return "" if ok else f"no note states {host}'s {offset:+} s within {OFFSET_SLACK_S} s: {analysis.notes}"
    raise ValueError(check)
