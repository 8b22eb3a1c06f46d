"""The report of a run with hundreds of hosts and thousands of evidence lines stays small and short:
evidence past the first lines and files read in full are folded with their counts, and the
timeline gives the hosts the findings name their own lanes and folds the rest into one.
(benchmarks/bench_large_report.py measures a generated 512-host run end to end.)"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl

from tests.helpers import tables_from
from tracelens.analyze import Analysis
from tracelens.derived import RunContext
from tracelens.findings import Evidence, Finding, Severity
from tracelens.report.html import render
from tracelens.report.sections import timeline
from tracelens.rules import all_rules

HOSTS = [f"node{i:03d}" for i in range(1, 513)]
T0 = datetime(2024, 12, 6, 18, 31, tzinfo=timezone.utc)


def _big_analysis() -> Analysis:
    inputs = [
        {
            "file": f"{h}/{name}",
            "format": "log",
            "host": h,
            "size": 123_456,
            "lines": 2000,
            "parsed": 1990,
            "ignored": 10,
            "unrecognized": 0,
            "errors": [],
            "samples": [],
        }
        for h in HOSTS
        for name in ("train.log", "nccl.log", "sysfs-1.txt")
    ]
    findings = [
        Finding(
            rule_id="TL201",
            severity=Severity.WARNING,
            title="Physical-layer errors on a port",
            summary=f"{h} mlx5_1 port 1: SymbolErrorCounter +8,123",
            hosts=[h],
            ports=["mlx5_1:1"],
            evidence=[
                Evidence(
                    file=f"{h}/sysfs-1.txt", line=n, text=f"SymbolErrorCounter: {n * 45} (was {(n - 1) * 45})", host=h
                )
                for n in range(2000)
            ],
        )
        for h in HOSTS[:300]
    ]
    return Analysis(
        target=Path("run512"), context=RunContext(tables_from(inputs=inputs)), findings=findings, rules=all_rules()
    )


def test_a_512_host_report_stays_under_5_mb_with_evidence_folded_and_counted():
    html = render(_big_analysis())
    assert len(html.encode()) < 5_000_000
    assert html.count("Evidence (2,000, first 50 shown)") == 300
    assert html.count("<summary>42 more lines</summary>") == 300  # past the first 8 of the 50 kept
    folded = html[html.index('id="inputs"') :]
    assert "<summary>1,486 more files, each read in full</summary>" in folded  # 1,536 files, 50 open
    assert folded.index("<summary>1,486 more files") < folded.index("node512/train.log")


def test_the_timeline_folds_hosts_no_finding_names_into_one_lane():
    events = pl.DataFrame({
        "source": ["counters"] * len(HOSTS) + ["NCCL"] * len(HOSTS),
        "cause": ["link"] * 2 * len(HOSTS),
        "host": HOSTS * 2,
        "count": [5] * 2 * len(HOSTS),
        "lo": [T0 + timedelta(seconds=i % 60) for i in range(2 * len(HOSTS))],
        "hi": [T0 + timedelta(seconds=60 + i % 60) for i in range(2 * len(HOSTS))],
    })  # fmt: skip
    affected = {"node013", "node397"}
    lanes = timeline._lanes(events, affected)
    order = timeline._lane_order(lanes, affected)
    assert order == [
        "node013 · NCCL",
        "node013 · counters",
        "node397 · NCCL",
        "node397 · counters",
        "510 other hosts · NCCL",
        "510 other hosts · counters",
    ]
    assert lanes.filter(pl.col("lane") == "510 other hosts · counters").height == 510  # every rise kept, in one lane
    assert not any(re.match(r"node(?!013|397)", lane) for lane in order)


def test_events_that_name_no_host_get_a_lane_of_their_own_not_the_folded_one():
    events = pl.DataFrame({
        "source": ["NCCL"] * 3,
        "cause": ["comm"] * 3,
        "host": ["node01", None, "node02"],
        "count": [1, 1, 1],
        "lo": [T0, T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)],
        "hi": [None, None, None],
    }, schema_overrides={"hi": pl.Datetime("us", "UTC")})  # fmt: skip
    order = timeline._lane_order(timeline._lanes(events, {"node01"}), {"node01"})
    assert order == ["node01 · NCCL", "? · NCCL", "1 other host · NCCL"]  # was "0 other hosts" for the host-less rows
    assert timeline._lane_order(timeline._lanes(events, set()), set()) == ["? · NCCL", "node01 · NCCL", "node02 · NCCL"]
