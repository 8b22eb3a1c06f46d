"""Captures of any size: the per-connection analysis bucket by bucket gives what it gives on the whole
table, and a big multi-flow capture finds what the small slice of trouble inside it finds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from synth.pcap import write_multiflow
from tracelens.analyze import analyze
from tracelens.derived import flows
from tracelens.ingest import InputFile, pcap
from tracelens.report.summary import to_json
from tracelens.tables import conform

from .conftest import FIXTURES


def _packets(path: Path):
    result = pcap.ingest(InputFile(path, path.name, "pcap", size=path.stat().st_size))
    assert not result.account.errors
    return conform("packets", result.tables["packets"])


@pytest.fixture(scope="module")
def multiflow(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "multiflow.pcap"
    write_multiflow(path, 60_000, qps=300, tcp=300)
    return path


def test_analysis_in_buckets_equals_the_whole(multiflow):
    packets = _packets(multiflow)
    whole = flows.analyze(packets, bucket_packets=packets.height)
    bucketed = flows.analyze(packets, bucket_packets=5_000)
    assert bucketed.qps.height == 301 and bucketed.tcp.height == 602
    assert_frame_equal(bucketed.qps, whole.qps)
    assert_frame_equal(bucketed.tcp, whole.tcp)
    assert_frame_equal(bucketed.events, whole.events)
    kinds = set(bucketed.events["kind"].to_list())
    assert {"NAK (PSN sequence error)", "RNR NAK", "CNP", "ECN-CE", "TCP retransmission"} <= kinds


@pytest.mark.parametrize(
    "fixture", ["scenario-flaky-link", "scenario-socket-fallback", "lab-tcp-loss", "lab-clock-skew"]
)
def test_analysis_in_buckets_equals_the_whole_on_fixtures(fixture, tmp_path):
    captures = []
    for path in sorted((FIXTURES / fixture).rglob("*.pcap*")):
        if path.suffix == ".gz":
            (tmp_path / path.stem).write_bytes(gzip.decompress(path.read_bytes()))
            path = tmp_path / path.stem
        captures.append(path)
    assert captures
    packets = pl.concat([_packets(c) for c in captures], how="diagonal_relaxed")
    whole = flows.analyze(packets, bucket_packets=packets.height)
    bucketed = flows.analyze(packets, bucket_packets=max(packets.height // 7, 1))
    assert_frame_equal(bucketed.events, whole.events)
    assert_frame_equal(bucketed.qps, whole.qps)
    assert_frame_equal(bucketed.tcp, whole.tcp)


def test_a_big_capture_finds_what_its_slice_of_trouble_finds(tmp_path, multiflow):
    (tmp_path / "slice").mkdir()
    write_multiflow(tmp_path / "slice" / "capture.pcap", 0)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "capture.pcap").write_bytes(multiflow.read_bytes())

    def findings(folder: Path) -> list[tuple]:
        report = json.loads(json.dumps(to_json(analyze(folder)), default=str))
        return sorted((f["rule_id"], f["title"], f["summary"], json.dumps(f["evidence"])) for f in report["findings"])

    small, big = findings(tmp_path / "slice"), findings(tmp_path / "big")
    assert {f[0] for f in small} == {"TL301", "TL302", "TL303", "TL304"}
    assert big == small
