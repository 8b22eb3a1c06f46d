"""The promise "deterministic": the same input gives the same report in every process. Python salts
string hashes per process (PYTHONHASHSEED), so a set iterated into output, a sort on counts without
a tie-breaker or a polars group_by without maintain_order shows up here as reports that differ between
processes on fixtures whose items tie (equal counter deltas, equal IB completion counts, equal-sized
evidence groups, Flight Recorder groups)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CORPUS, FIXTURES, REPO
from tracelens.report.html import render
from tracelens.report.summary import to_json

# Fixtures with ties the reports once ordered differently from run to run.
TIE_PRONE = [
    FIXTURES / "scenario-congestion",  # rp_cnp_handled and np_ecn_marked_roce_packets moved by the same count
    FIXTURES / "scenario-hang",  # the two IB completion statuses (TL411), equal traffic counters
    FIXTURES / "ib-retry-exceeded",  # IBV_WC_RETRY_EXC_ERR and IBV_WC_WR_FLUSH_ERR, 8 each
    FIXTURES / "scenario-socket-fallback",  # evidence lines of equal time, NET transports with equal channel counts
    FIXTURES / "scenario-flaky-link",  # packet kinds stacked in the same time bin
    FIXTURES / "lab-hang-kill",  # fr_groups rows
    FIXTURES / "lab-hang-size",
]
CORPUS_LOGS = [
    CORPUS
    / "nccl"
    / "016_nccl1610_platform_timestamp_prefix_watchdog_socket.log",  # two watchdog hangs at the same time
    CORPUS / "deepspeed" / "gh_deepspeed_issue255_2020_forward_microstep.log",  # step lines of the same second (chart)
]

# One process per seed analyses every target (starting one process per report would triple the time).
DRIVER = """
import sys
from tests.test_determinism import write_reports
write_reports(sys.argv[1], sys.argv[2:])
"""


def write_reports(out: str, targets: list[str]) -> None:
    """`tracelens analyze TARGET --json OUT/i.json -o OUT/i.html` for each target, in this process."""
    from tracelens.cli import app

    for i, target in enumerate(targets):
        app(["analyze", target, "--json", f"{out}/{i}.json", "-o", f"{out}/{i}.html"], standalone_mode=False)


def _reports(targets: list[Path], seed: int, out: Path) -> list[tuple[str, str]]:
    """The reports of the targets written by `tracelens analyze` in a process started with PYTHONHASHSEED=seed."""
    out.mkdir()
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(out), *map(str, targets)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [((out / f"{i}.json").read_text(), (out / f"{i}.html").read_text()) for i in range(len(targets))]


def _reports_here(targets: list[Path], analysis_of) -> list[tuple[str, str]]:
    """The reports of the targets as this process renders them, from the session's analyses (each made
    here, under this process's seed, by the call `tracelens analyze` makes)."""
    return [(json.dumps(to_json(a), indent=2, default=str), render(a)) for a in map(analysis_of, targets)]


def test_reports_are_identical_whatever_the_hash_seed(tmp_path, analysis_of):
    """Three hash seeds: this process's own (random, or whatever PYTHONHASHSEED says) and two more in
    fresh processes, chosen unlike it (a process is the costly part: only two are started)."""
    corpus = [log for log in CORPUS_LOGS if log.is_file()]
    targets = [path.resolve() for path in (*TIE_PRONE, *corpus)]  # as analysis_of names them (a symlinked corpus too)
    own = os.environ.get("PYTHONHASHSEED")
    assert own is not None or sys.flags.hash_randomization, "this process hashes with a seed of its own"
    seeds = [seed for seed in (1, 2, 3) if str(seed) != own][:2]
    runs = {None: _reports_here(targets, analysis_of)} | {
        seed: _reports(targets, seed, tmp_path / str(seed)) for seed in seeds
    }
    for seed in seeds:
        for target, first, other in zip(targets, runs[None], runs[seed], strict=True):
            assert first[0] == other[0], (
                f"JSON findings of {target.name} differ between this process and PYTHONHASHSEED={seed}"
            )
            assert first[1] == other[1], (
                f"HTML report of {target.name} differs between this process and PYTHONHASHSEED={seed}"
            )
    if len(corpus) < len(CORPUS_LOGS):
        pytest.skip(
            f"fixtures checked; corpus logs not found in {CORPUS} (it lives in ../shared/corpus beside the repo)"
        )
