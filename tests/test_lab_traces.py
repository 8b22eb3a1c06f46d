"""The real lab runs with a profiler trace of every rank (fixtures/lab-traces, lab/traces.tsv): the
slow-window verdict names the rank that arrived last and the cause, a clean run names none, and the
traces are what make the verdict on a DDP job, whose logs print only iteration times, and on a
DeepSpeed job as it prints by default (timers on rank 0 only)."""

from __future__ import annotations

import gzip
import json
import shutil

import polars as pl
import pytest

from tests.helpers import FIXTURES
from tests.helpers.lab import expected_of, runs_in
from tracelens.analyze import analyze
from tracelens.findings import Finding

TRACES = FIXTURES / "lab-traces"
RUNS = runs_in(TRACES)


def _verdicts(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.rule_id == "TL410" and f.verdict is not None and f.verdict.cause]


def test_the_runs_are_real_small_and_traced():
    assert {expected_of(p)["scenario"] for p in RUNS} == {"clean", "slow-rank", "loss", "contention-all"}
    assert {expected_of(p)["job"]["world"] for p in RUNS} == {2, 4}
    assert {expected_of(p)["job"]["engine"] for p in RUNS} == {"ddp", "deepspeed"}
    assert sum(f.stat().st_size for f in TRACES.rglob("*") if f.is_file()) < 18e6
    for run in RUNS:
        expected = expected_of(run)
        assert expected["real"] is True and expected["synthetic"] is False
        assert "a real run (not synthetic)" in (run / "README.md").read_text()
        for rank, host in expected["job"]["rank_hosts"].items():
            (trace,) = (run / host).glob(f"rank{rank}.pt.trace.json.gz")
            with gzip.open(trace, "rt") as f:
                head = json.loads(f.read())
            assert head["distributedInfo"]["rank"] == int(rank) and head["distributedInfo"]["backend"] == "gloo"
            steps = [e["name"] for e in head["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
            first, last = expected["traces"]["steps"][rank]
            assert steps[0] == f"ProfilerStep#{first}" and steps[-1] == f"ProfilerStep#{last}"


@pytest.mark.parametrize("run", [p for p in RUNS if expected_of(p)["cause"]], ids=lambda p: p.name)
def test_the_verdict_names_the_cause_and_the_last_rank(run, analysis_of):
    expected = expected_of(run)
    top = _verdicts(analysis_of(run).findings)[0]
    assert top.verdict is not None and top.verdict.cause == expected["cause"]
    if expected["cause"] == "straggler":
        assert top.ranks == expected["ranks"] and top.hosts == expected["hosts"]
        assert top.verdict.confidence == "high"
        assert any("which arrived last at the collectives" in line for line in top.verdict.because)
        assert any("from its profiler trace" in line for line in top.verdict.because)
        last = [f for f in analysis_of(run).findings if f.rule_id == "TL431"]
        assert all(f.ranks == expected["ranks"] and f.hosts == expected["hosts"] for f in last)
        assert last  # TL431 names the rank and host too, by the time the others waited for it


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_traces_hosts_are_named_as_the_runs_folders_name_them(run, analysis_of):
    """Every trace says `host_name: vm` (the lab's one machine); the run's folders name the hosts, as
    they do for the ranks' logs beside the traces, and the traces' clock is the machine's."""
    expected = expected_of(run)
    tables = analysis_of(run).context.tables
    ranks = tables["trace_ranks"]
    assert ranks["host_name"].unique().to_list() == ["vm"]
    assert {str(r): h for r, h in ranks.select("rank", "host").iter_rows()} == expected["job"]["rank_hosts"]
    spans = tables["trace_spans"].group_by("rank").agg(pl.col("host").unique())
    assert {str(r): h for r, h in spans.iter_rows()} == {r: [h] for r, h in expected["job"]["rank_hosts"].items()}
    # one machine, one clock: no offset is measured between the hosts the folders name
    arrived = analysis_of(run).context.collective_arrivals
    assert arrived["host"].n_unique() == 2 and arrived["clock_offset_us"].unique().to_list() == [0.0]


def test_a_clean_run_names_no_cause_and_no_last_rank(analysis_of):
    (clean,) = [p for p in RUNS if not expected_of(p)["cause"]]
    findings = analysis_of(clean).findings
    assert _verdicts(findings) == [] and [f for f in findings if f.rule_id == "TL431"] == []


@pytest.mark.parametrize("name", ["tr-ddp4-02-slow-rank-r3", "tr-ds4z2ov5p-01-slow-rank-r1x3"])
def test_without_the_traces_the_slow_rank_is_undetermined(tmp_path, name):
    run = TRACES / name
    bare = shutil.copytree(run, tmp_path / run.name)
    for trace in bare.glob("*/rank*.pt.trace.json.gz"):
        trace.unlink()
    with analyze(bare) as analysis:
        assert _verdicts(analysis.findings) == []
