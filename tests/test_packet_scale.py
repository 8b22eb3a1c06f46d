"""Captures of any size: the per-connection analysis bucket by bucket gives what it gives on the whole
table, and a big multi-flow capture finds what the small slice of trouble inside it finds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from synth.pcap import write_multiflow
from tests.helpers.pcap import T0, roce, section
from tracelens.analyze import analyze
from tracelens.derived import flows
from tracelens.ingest import InputFile, pcap
from tracelens.packets import records
from tracelens.report.summary import to_json
from tracelens.tables import conform

from .conftest import FIXTURES


def _packets(path: Path, spill: Path | None = None):
    result = pcap.ingest(InputFile(path, path.name, "pcap", size=path.stat().st_size, spill=spill))
    assert not result.account.errors
    return conform("packets", result.tables["packets"])


@pytest.fixture(scope="module")
def multiflow(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "multiflow.pcap"
    write_multiflow(path, 60_000, qps=300, tcp=300)
    return path


def _whole(packets: pl.DataFrame) -> flows.PacketAnalysis:
    return flows.analyze(packets.with_columns(bucket=pl.lit(0, pl.Int32)))


def test_analysis_in_buckets_equals_the_whole(multiflow, tmp_path, monkeypatch):
    monkeypatch.setattr(pcap, "BUCKET_PACKETS", 5_000)
    spilled = _packets(multiflow, tmp_path / "spill")  # a lazy scan of one Parquet file per bucket
    assert isinstance(spilled, pl.LazyFrame)
    files = list((tmp_path / "spill").rglob("bucket-*.parquet"))
    packets = spilled.collect()
    assert 10 <= len(files) == packets["bucket"].n_unique()  # about 60k frames / 5k, guessed from the file size
    whole = _whole(packets)
    for bucketed in (flows.analyze(spilled), flows.analyze(packets)):
        assert bucketed.qps.height == 301 and bucketed.tcp.height == 602
        assert_frame_equal(bucketed.qps, whole.qps)
        assert_frame_equal(bucketed.tcp, whole.tcp)
        assert_frame_equal(bucketed.events, whole.events)
    kinds = set(whole.events["kind"].to_list())
    assert {"NAK (PSN sequence error)", "RNR NAK", "CNP", "ECN-CE", "TCP retransmission"} <= kinds


def _damaged(multiflow: Path, tmp_path: Path, damage: str) -> Path:
    data = bytearray(multiflow.read_bytes())
    if damage == "cut":  # mid-record
        data = data[:-50]
    elif damage == "corrupt":  # a record in the fifth chunk claims 4 GB
        fifth = list(records.CaptureReader(np.frombuffer(bytes(data), np.uint8)).walk())[4]
        at = int(fifth.starts[100]) + 8
        data[at : at + 4] = b"\xff\xff\xff\xff"
    elif damage == "pcapng":  # two sections, their own byte order and interfaces, several chunks each
        frames = [(0, int(T0 * 1e6) + i, bytes(roce(psn=i))) for i in range(9)]
        data = bytearray(section("<", [(1, 0, None)], frames) + section(">", [(101, 0, 3), (1, 0, 9)], frames))
    path = tmp_path / f"{damage}.pcap"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("damage", ["none", "cut", "corrupt", "pcapng"])
def test_a_capture_walked_apart_reads_as_walked_in_process(multiflow, tmp_path, monkeypatch, damage):
    """A big capture's record walk runs in a child process (tracelens.packets.walker): the same rows,
    counts and notes, chunk after chunk, as the walk in the ingest's own process."""
    monkeypatch.setattr(records, "CHUNK_RECORDS", 7_000 if damage != "pcapng" else 4)
    path = _damaged(multiflow, tmp_path, damage)
    read = {}
    for apart in (False, True):
        monkeypatch.setattr(pcap, "WALK_APART_BYTES", 0 if apart else 1 << 62)
        result = pcap.ingest(InputFile(path, path.name, "pcap", size=path.stat().st_size))
        account = result.account
        read[apart] = result.tables["packets"], (account.lines, account.parsed, account.errors, account.samples)
    assert_frame_equal(read[True][0], read[False][0])
    assert read[True][1] == read[False][1]
    assert read[True][1][0] == {"none": 60_000, "cut": 59_999, "corrupt": 28_100, "pcapng": 18}[damage]


def test_a_bucket_holds_whole_connections_and_every_roce_qp_of_a_host_pair(multiflow, tmp_path, monkeypatch):
    """Both directions of a TCP connection share a bucket, and so do all the RoCE QPs between two hosts
    (a response names no data QP: it is paired among the hosts' QPs); the TCP connections between two
    hosts are spread over buckets (a socket transport's capture between two nodes is many of them)."""
    assert _packets(multiflow)["bucket"].n_unique() == 1  # 60k frames: one bucket of BUCKET_PACKETS
    monkeypatch.setattr(pcap, "BUCKET_PACKETS", 5_000)
    packets = _packets(multiflow).with_columns(pl.col("src", "dst").cast(pl.String))
    hosts = [pl.min_horizontal("src", "dst").alias("a"), pl.max_horizontal("src", "dst").alias("b")]
    ends = [pl.min_horizontal("sport", "dport").alias("p"), pl.max_horizontal("sport", "dport").alias("q")]
    roce = packets.filter(pl.col("proto") == "roce").group_by(hosts).agg(pl.col("bucket").n_unique())
    assert roce.height > 10 and roce["bucket"].max() == 1
    tcp = packets.filter(pl.col("proto") == "tcp")
    assert tcp.group_by(*hosts, *ends).agg(pl.col("bucket").n_unique())["bucket"].max() == 1
    # the lab's real capture: four connections between two network namespaces, 8,771 TCP frames
    lab = tmp_path / "lab-tcp-loss.pcap"
    lab.write_bytes(gzip.decompress((FIXTURES / "lab-tcp-loss" / "capture.pcap.gz").read_bytes()))
    monkeypatch.setattr(pcap, "BUCKET_PACKETS", 300)
    tcp = _packets(lab).filter(pl.col("proto") == "tcp").with_columns(pl.col("src", "dst").cast(pl.String))
    connections = tcp.group_by(*hosts, *ends).agg(pl.col("bucket").n_unique())
    assert connections.height == 4 and connections["bucket"].max() == 1
    assert tcp.group_by(hosts).agg(pl.col("bucket").n_unique())["bucket"].item() > 1


@pytest.mark.parametrize(
    "fixture", ["scenario-flaky-link", "scenario-socket-fallback", "lab-tcp-loss", "lab-clock-skew"]
)
def test_analysis_in_buckets_equals_the_whole_on_fixtures(fixture, tmp_path, monkeypatch):
    monkeypatch.setattr(pcap, "BUCKET_PACKETS", 300)
    captures = []
    for path in sorted((FIXTURES / fixture).rglob("*.pcap*")):
        if path.suffix == ".gz":
            (tmp_path / path.stem).write_bytes(gzip.decompress(path.read_bytes()))
            path = tmp_path / path.stem
        captures.append(path)
    assert captures
    spilled = pl.concat([_packets(c, tmp_path / "spill") for c in captures], how="diagonal_relaxed")
    packets = spilled.collect()
    whole, bucketed = _whole(packets), flows.analyze(spilled)
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


def test_a_run_reads_its_captures_lazily(tmp_path, multiflow, monkeypatch):
    """In `analyze`, the packets table is never read whole into memory: the rules and the report read
    the Parquet the ingest wrote in the run's working folder, a bucket or a few columns at a time,
    and the folder lives as long as the analysis."""
    from tracelens.report.html import write as write_html
    from tracelens.tables import RunTables

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "capture.pcap").write_bytes(multiflow.read_bytes())
    read_whole = RunTables.__getitem__

    def refuse_packets(self, name):
        assert name != "packets", "the packets table was read whole"
        return read_whole(self, name)

    monkeypatch.setattr(RunTables, "__getitem__", refuse_packets)
    analysis = analyze(tmp_path / "run")
    assert {f.rule_id for f in analysis.findings} >= {"TL301", "TL302", "TL303", "TL304"}
    write_html(analysis, tmp_path / "report.html")
    assert "Packet captures" in (tmp_path / "report.html").read_text()
    workdir = Path(analysis.workdir.name)
    assert list(workdir.rglob("bucket-*.parquet"))
    del analysis
    import gc

    gc.collect()
    assert not workdir.exists()
