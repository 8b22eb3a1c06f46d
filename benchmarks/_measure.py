"""What every benchmark here shares: run one measurement in a fresh process, read its peak RSS.

Peak RSS is the child's `ru_maxrss`, from `os.wait4` (the per-child form of RUSAGE_CHILDREN).
Linux carries a process's RSS high-water mark across fork+exec into the children it starts,
so the process that launches the measurements must stay small: it imports nothing heavy and
generates its workloads in a child too (`python(__file__, "--generate", ...)`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # workloads; git-ignored
# The fixture generator (`synth/`) lives at the repository root, outside the installed package:
# this process and the children it starts import it from there.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


@dataclass(frozen=True)
class Child:
    seconds: float  # wall clock, launch to exit (imports included)
    rss_mb: float  # the child's peak RSS, MiB
    last_line: str  # the last non-empty line of its stdout: a JSON report, a count ...
    cpu_s: float = (
        0.0  # user + system CPU seconds of the child (all its threads): what a loaded machine does not inflate
    )

    def report(self) -> dict:
        """The JSON object a benchmark child prints as its last line."""
        return json.loads(self.last_line)


def python(*args: str) -> list[str]:
    """argv for a fresh interpreter, the one running this benchmark."""
    return [sys.executable, *args]


def run(argv: list[str], quiet: bool = False) -> Child:
    """Run `argv` to the end in a fresh process (its stderr discarded if `quiet`); fail loudly if it fails."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None, text=True)
    last = ""
    for line in child.stdout:  # read as it comes, kept only the last: a tool may print a line per packet
        last = line.strip() or last
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if code := os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {code})")
    return Child(seconds, usage.ru_maxrss / 1024, last, usage.ru_utime + usage.ru_stime)  # ru_maxrss is in KiB on Linux


@dataclass(frozen=True)
class Runs:
    """Several runs of one command, each measure sorted."""

    seconds: list[float]
    rss_mb: list[float]
    cpu_seconds: list[float]


def repeated(argv: list[str], times: int, out: Path) -> Runs:
    """Run `argv` `times` times, `out` removed before each."""
    children = []
    for _ in range(times):
        shutil.rmtree(out, ignore_errors=True)
        children.append(run(argv, quiet=True))
    return Runs(*(sorted(getattr(c, k) for c in children) for k in ("seconds", "rss_mb", "cpu_s")))


def import_rss_mb(module: str) -> float:
    """Peak RSS of a process that only imports `module`: the floor under every measurement."""
    return run(python("-c", f"import {module}")).rss_mb


def load() -> str:
    """The machine's CPUs and load average, for the table's title."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.2f} (1 min), {five:.2f} (5 min)"
