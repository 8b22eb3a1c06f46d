"""The lab matrix's real runs (fixtures/lab-matrix/<run>/, made by lab/matrix.py from lab/matrix.tsv)
are what their table row and expected.json say: the job's shape, the held-out part, each global
rank's steps in its own host's folder, the fault's window, the hang's stack dumps, a small size.

What the analysis concludes on them is tests/test_lab_matrix.py's; nothing here analyses a run.
"""

from __future__ import annotations

import csv
import gzip
import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers.lab import MATRIX, expected_of, runs_in

REPO = Path(__file__).resolve().parents[1]
RUNS = runs_in(MATRIX)
STEP = re.compile(rb"\[Rank (\d+)\] (?:step=\d+,|iteration +\d+/)")


def _table() -> dict[str, dict[str, str]]:
    with open(REPO / "lab" / "matrix.tsv") as f:
        rows = [line for line in f if not line.startswith("#")]
    return {row["id"]: row for row in csv.DictReader(rows, delimiter="\t")}


def test_the_matrix_is_recorded_and_small():
    assert len(RUNS) >= 40
    table = _table()
    assert {p.name for p in RUNS} <= set(table)
    total = sum(f.stat().st_size for f in MATRIX.rglob("*") if f.is_file())
    assert total < 0.5e6 * len(RUNS), f"lab-matrix takes {total / 1e6:.1f} MB for {len(RUNS)} runs"
    held = [p for p in RUNS if expected_of(p)["held_out"]]
    assert held and len(held) < len(RUNS)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_run_is_its_table_row(run):
    row, expected = _table()[run.name], expected_of(run)
    job = expected["job"]
    assert expected["real"] is True and expected["synthetic"] is False
    assert (job["engine"], job["world"], job["ranks_per_host"], job["grad_accum"], job["log_layout"]) == (
        row["engine"],
        int(row["world"]),
        int(row["per_host"]),
        int(row["grad_accum"]),
        row["layout"],
    )
    assert job["zero"] == (int(row["zero"]) if row["zero"] != "-" else None)
    assert expected["scenario"] == row["fault"].split(":")[0]
    # each held-out part was set before any of its runs (lab/README.md): its ids start with ho- (the
    # fourth part's with ho4-), and the first held out every 8-rank run
    assert expected["held_out"] == (row["held_out"] == "yes") == bool(re.match(r"ho\d?-", run.name))
    assert expected["held_out"] or job["world"] != 8
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == sorted(job["hosts"])
    readme = (run / "README.md").read_text()
    assert "a real run" in readme and re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", readme)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_global_rank_logs_its_steps_in_its_hosts_folder(run):
    """Under DeepSpeed's default printing rank 0 alone logs its steps (every 10th)."""
    job = expected_of(run)["job"]
    default = job.get("printing") == "default"
    for host in job["hosts"]:
        seen: dict[int, int] = {}
        for log in (run / host).glob("*.log.gz"):
            for m in STEP.finditer(gzip.decompress(log.read_bytes())):
                seen[int(m.group(1))] = seen.get(int(m.group(1)), 0) + 1
        mine = sorted(int(r) for r, h in job["rank_hosts"].items() if h == host and not (default and int(r)))
        if not mine:
            assert not seen, f"{run.name}/{host}: steps of ranks {sorted(seen)} under DeepSpeed's default printing"
            continue
        assert sorted(seen) == mine, f"{run.name}/{host}: steps of ranks {sorted(seen)}, expected {mine}"
        assert min(seen.values()) >= 20, f"{run.name}/{host}: a rank logged {min(seen.values())} steps"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_fault_window_follows_the_first_step(run):
    expected = expected_of(run)
    if expected["cause"] is None:
        assert expected["window"] is None and expected["hosts"] == [] and expected["ranks"] == []
        return
    start, end = (datetime.fromisoformat(t) for t in expected["window"])
    assert datetime.fromisoformat(expected["first_step"]) < start < end
    assert set(expected["hosts"]) <= set(expected["job"]["hosts"])
    assert set(expected["ranks"]) <= set(range(expected["job"]["world"]))
    if expected["scenario"] == "slow-rank":
        ((rank,),) = (expected["ranks"],)
        assert expected["hosts"] == [expected["job"]["rank_hosts"][str(rank)]]
    if expected["scenario"] == "clock-skew":
        assert set(expected["clock_offsets"]) <= set(expected["job"]["hosts"])


@pytest.mark.parametrize("run", [p for p in RUNS if expected_of(p)["scenario"] == "hang"], ids=lambda p: p.name)
def test_a_hang_has_a_stack_dump_of_every_rank(run):
    expected = expected_of(run)
    assert expected["alive_at_dump"] == list(range(expected["job"]["world"]))
    for rank, host in expected["job"]["rank_hosts"].items():
        dump = (run / host / f"pyspy-rank{rank}.txt").read_text()
        assert dump.startswith("Process ") and "Thread " in dump and "(idle)" in dump, f"{run.name} rank {rank}"
