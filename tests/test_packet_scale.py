"""Captures of any size: the per-connection analysis bucket by bucket gives what it gives on the whole
table, and a big multi-flow capture finds what the small slice of trouble inside it finds."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from synth.pcap import write_mix, write_multiflow
from tests.helpers.pcap import T0, roce, section
from tracelens.analyze import analyze
from tracelens.capture_decoder import decode, records
from tracelens.derived import flows
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
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


def _unpacked(path: Path, tmp_path: Path) -> Path:
    """A capture of the repo, gunzipped into `tmp_path` when it is kept gzipped."""
    if path.suffix != ".gz":
        return path
    (tmp_path / path.stem).write_bytes(gzip.decompress(path.read_bytes()))
    return tmp_path / path.stem


def _capture(name: str, tmp_path: Path) -> Path:
    """A capture of the repo by its path under fixtures/ or tests/captures/, unpacked."""
    path = next(root / name for root in (FIXTURES, Path(__file__).parent / "captures") if (root / name).exists())
    return _unpacked(path, tmp_path)


def _assert_same_analysis(a: flows.PacketAnalysis, b: flows.PacketAnalysis) -> None:
    assert_frame_equal(a.qps, b.qps)
    assert_frame_equal(a.tcp, b.tcp)
    assert_frame_equal(a.events, b.events)


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
        _assert_same_analysis(bucketed, whole)
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
    """A big capture's record walk runs in a child process (tracelens.capture_decoder.walker): the same rows,
    counts and notes, chunk after chunk, as the walk in the ingest's own process."""
    monkeypatch.setattr(records, "CHUNK_RECORDS", 7_000 if damage != "pcapng" else 4)
    path = _damaged(multiflow, tmp_path, damage)
    read = {}
    for apart in (False, True):
        monkeypatch.setattr(pcap, "WALK_APART_RECORDS", 0 if apart else 1 << 62)
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
    lab = _capture("lab-tcp-loss/capture.pcap.gz", tmp_path)
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
    captures = [_unpacked(path, tmp_path) for path in sorted((FIXTURES / fixture).rglob("*.pcap*"))]
    assert captures
    spilled = pl.concat([_packets(c, tmp_path / "spill") for c in captures], how="diagonal_relaxed")
    packets = spilled.collect()
    _assert_same_analysis(flows.analyze(spilled), _whole(packets))


@pytest.mark.parametrize(
    "capture, piece",
    [
        ("lab-tcp-loss/capture.pcap.gz", 211),  # real kernel resends, SACK and D-SACK, four connections
        ("lab-loss/capture.pcap.gz", 1_500),
        ("kernel_retransmissions/loss-seen.pcap", 61),  # fast retransmissions after duplicate ACKs
        ("kernel_retransmissions/duplicates.pcap", 61),  # the same frames captured twice
        ("scenario-flaky-link/node02/capture-node02-mlx5_1.pcap", 29),  # NAKs and their resends
        ("scenario-congestion/node02/capture-node02-mlx5_0.pcap", 29),  # CNPs and CE marks
    ],
)
def test_a_bucket_in_pieces_gives_what_it_gives_whole(capture, piece, tmp_path, monkeypatch):
    """A bucket bigger than PIECE_FRAMES is analysed a piece at a time, each piece starting where the
    one before left every direction and QP: pieces of a few dozen frames give the whole's results."""
    packets = _packets(_capture(capture, tmp_path))
    whole = flows.analyze(packets)
    monkeypatch.setattr(flows, "PIECE_FRAMES", piece)
    assert len(flows._pieces(packets.lazy())) >= 10
    _assert_same_analysis(flows.analyze(packets), whole)
    assert whole.events.height > 0 or capture.endswith("duplicates.pcap")


def test_one_big_connection_and_one_big_qp_in_pieces(tmp_path, monkeypatch):
    """The shape that held a connection whole: one RoCE QP and one TCP connection, with the multi-flow
    capture's slice of trouble (NAKs, an RNR NAK, CNPs, CE marks, TCP losses) inside, spilled the way
    a run reads it and cut into pieces that each start mid-flow."""
    path = tmp_path / "one-flow.pcap"
    write_multiflow(path, 40_000, qps=1, tcp=1)
    spilled = _packets(path, tmp_path / "spill")
    whole = flows.analyze(spilled)
    monkeypatch.setattr(flows, "PIECE_FRAMES", 2_500)
    _assert_same_analysis(flows.analyze(spilled), whole)
    kinds = set(whole.events["kind"].to_list())
    assert {"NAK (PSN sequence error)", "RNR NAK", "CNP", "ECN-CE", "TCP retransmission"} <= kinds
    assert whole.qps["packets"].max() > 10_000 and whole.tcp["segments"].max() > 5_000


# a TCP connection where each state a piece carries decides something (ms after START, sender, flags,
# seq, ack, bytes): a fast retransmission after duplicate ACKs, a keep-alive's answer (not a duplicate
# ACK), a resend that is a loss and not reordering only because of when the sequence last advanced,
# and a frame captured twice
EDGES = [
    (0.0, "c", "S", 0, 0, 0),
    (1.0, "s", "SA", 100, 1, 0),
    (1.1, "c", "A", 1, 101, 0),  # the handshake's round trip, 1.1 ms: the out-of-order window
    (2.0, "c", "PA", 1, 101, 100),
    (2.05, "s", "A", 101, 101, 0),
    (2.1, "c", "PA", 101, 101, 100),
    (2.15, "s", "A", 101, 201, 0),
    (2.16, "s", "A", 101, 201, 0),  # the same frame again (same IP id): a capture duplicate
    (2.2, "c", "PA", 301, 101, 100),  # 201-300 lost
    (2.25, "s", "A", 101, 201, 0),  # duplicate ACK 1
    (2.3, "s", "A", 101, 201, 0),  # duplicate ACK 2
    (2.35, "c", "PA", 201, 101, 100),  # fast retransmission
    (2.4, "s", "A", 101, 401, 0),
    (10.0, "c", "A", 400, 101, 0),  # keep-alive
    (10.1, "s", "A", 101, 401, 0),  # its answer
    (20.0, "c", "PA", 401, 101, 100),
    (20.05, "s", "A", 101, 501, 0),
    (20.1, "c", "PA", 601, 101, 100),  # 501-600 lost; the sequence last advanced here
    (20.5, "c", "A", 701, 101, 0),
    (21.3, "c", "PA", 501, 101, 100),  # 1.2 ms after the advance: a retransmission, not reordering
]


def _tcp_frames(rows: list[tuple]) -> list:
    """Frames of one connection from (ms after START, sender, flags, seq, ack, bytes[, SACK block]);
    a frame from the same sender under 0.02 ms after the one before is the same frame again."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    from synth.pcap import START

    hosts = {"c": ("10.0.1.1", "10.0.1.2", 40000, 5201), "s": ("10.0.1.2", "10.0.1.1", 5201, 40000)}
    ip_ids = {"c": 100, "s": 7000}
    packets = []
    for i, (ms, who, flags, seq, ack, size, *sack) in enumerate(rows):
        src, dst, sport, dport = hosts[who]
        again = i and ms - rows[i - 1][0] < 0.02 and who == rows[i - 1][1]
        ip_ids[who] += 0 if again else 1
        options = [("SAck", sack[0])] if sack else []
        tcp = TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=512, options=options)
        packet = Ether() / IP(src=src, dst=dst, id=ip_ids[who]) / tcp / Raw(b"x" * size)
        packet.time = START + ms / 1000
        packets.append(packet)
    return packets


def _edges_capture(path: Path) -> Path:
    from synth.pcap import START, RoceFaults, RoceQp, roce_conversation, write

    faults = RoceFaults(lost=(4,), rnr=(9,), congested=(14,))
    wrapping = RoceQp(first_psn=(1 << 24) - 6)  # the PSNs wrap around 24 bits mid-conversation
    roce = roce_conversation(wrapping, messages=20, faults=faults, start=START + 0.03)
    return write(path, _tcp_frames(EDGES) + roce)


def test_every_carry_of_a_piece_across_every_frame(tmp_path, monkeypatch):
    """Pieces of one frame each: every state one piece hands the next decides an event here."""
    packets = _packets(_edges_capture(tmp_path / "edges.pcap"))
    whole = flows.analyze(packets)
    kinds = whole.events.group_by("kind").len().sort("kind").rows()
    assert kinds == [
        ("CNP", 1),
        ("ECN-CE", 1),
        ("NAK (PSN sequence error)", 1),
        ("PSN gap", 1),
        ("RNR NAK", 1),
        ("RoCE retransmission", 3),  # go-back-N after the NAK (two), the RNR NAK's resend
        ("TCP retransmission", 2),
        ("capture duplicate", 1),
    ]
    client = whole.tcp.filter(pl.col("sport") == 40000).row(0, named=True)
    assert (client["fast_retransmissions"], client["loss_retransmissions"]) == (1, 2)
    assert whole.tcp.filter(pl.col("sport") == 5201)["dup_acks"].item() == 2  # not the keep-alive's answer
    assert whole.qps["nak_to_resend_ms"].item() > 0
    monkeypatch.setattr(flows, "PIECE_FRAMES", 1)
    assert len(flows._pieces(packets.lazy())) == packets.height
    _assert_same_analysis(flows.analyze(packets), whole)


def test_a_d_sack_across_the_sequence_wrap_names_its_resend(tmp_path):
    """A D-SACK block is matched with the resends in the 64 KB stretches of sequence space it covers,
    across the 32-bit wrap too: here the block starts 50 bytes before the wrap, the resend after it."""
    from synth.pcap import write

    near_wrap = (1 << 32) - 50
    rows = [
        (0.0, "c", "PA", near_wrap, 1, 100),
        (0.1, "c", "PA", 50, 1, 100),
        (200.0, "c", "PA", 50, 1, 100),  # resent, though the receiver had it: a D-SACK says so
        (200.5, "s", "A", 1, 150, 0, (near_wrap, 150)),
    ]
    analysis = flows.analyze(_packets(write(tmp_path / "wrap.pcap", _tcp_frames(rows))))
    resends = analysis.events.filter(pl.col("kind").str.starts_with("TCP"))
    assert resends.select("frame", "kind").rows() == [(3, flows.TCP_SPURIOUS)]


def test_the_median_psn_from_bins_is_the_median():
    """A QP's median PSN (what pairs its ACKs) is found from counts per bin of PSNs and a second
    reading of the middle bins only: it equals the median of all its PSNs, odd and even counts, PSNs
    in one bin or spread over thousands, read in one piece or in three."""
    rng = np.random.default_rng(3)
    sizes, spreads = [1, 2, 7, 1_000, 1_001, 30_000], [10, 4_096, 1 << 24]
    qps = [(q, n, spread) for q, (n, spread) in enumerate((n, s) for n in sizes for s in spreads)]
    psn = np.concatenate([rng.integers(0, spread, n) for _, n, spread in qps])
    frames = pl.DataFrame(
        {
            "file": "f",
            "src": "a",
            "dst": "b",
            "dest_qp": np.repeat([q for q, _, _ in qps], [n for _, n, _ in qps]),
            "psn": psn,
            "proto": "roce",
            "duplicate": False,
            "opcode": 4,
        }
    ).sample(fraction=1.0, shuffle=True, seed=1)
    expected = flows._roce_data_frames(frames).group_by(flows.DATA_QP).agg(data_psn=pl.col("psn").median())
    for pieces in (1, 3):
        bounds = np.linspace(0, frames.height, pieces + 1).astype(int)
        slices = [frames.slice(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
        data = [flows._roce_data_frames(part) for part in slices]
        counts = pl.concat(d.group_by(*flows.DATA_QP, flows._psn_bin()).agg(n=pl.len()) for d in data)
        counts = counts.group_by(*flows.DATA_QP, "bin").agg(pl.col("n").sum()).sort(*flows.DATA_QP, "bin")
        medians = flows._median_psns(counts, lambda columns, slices=slices: iter(slices))
        assert_frame_equal(medians, expected, check_row_order=False)


def test_pieces_cover_a_bucket_whatever_its_frames(monkeypatch):
    """Pieces are cut by frame number where the bucket's frames are, not by even ranges: a bucket whose
    frames crowd into a few stretches of the capture still gets pieces of about PIECE_FRAMES."""
    frame = np.concatenate([np.arange(0, 50_000), np.arange(10_000_000, 10_000_500), np.arange(90_000_000, 90_040_000)])
    bucket = pl.LazyFrame({"frame": frame})
    monkeypatch.setattr(flows, "PIECE_FRAMES", 10_000)
    sizes = [piece.select(pl.len()).collect().item() for piece in flows._pieces(bucket)]
    assert sum(sizes) == frame.size
    assert len(sizes) >= 9 and max(sizes) <= 10_000 + 1_400  # one edge's frames over at most


def test_a_qp_of_more_than_2_gb_adds_up(tmp_path):
    """Byte counts are 64-bit: a long QP's bytes once wrapped around at 2 GB (a sum of 32-bit lengths)."""
    packets = _packets(_capture("scenario-flaky-link/node02/capture-node02-mlx5_1.pcap", tmp_path))
    big = packets.with_columns(length=pl.lit(1_000_000_000, pl.Int32), payload=pl.lit(1_000_000_000, pl.Int32))
    qps = flows.analyze(big).qps
    data = packets.filter(pl.col("proto") == "roce").height
    assert qps["bytes"].sum() > 2**31 and qps["bytes"].sum() % 1_000_000_000 == 0
    assert qps["bytes"].sum() < data * 1_000_000_000


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


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "mix.pcap"
    assert write_mix(path, 3_000) == 3_000
    return path


def test_the_mix_holds_full_frames_of_roce_and_tcp(mix):
    packets = _packets(mix)
    assert packets.height == 3_000
    assert set(packets["proto"].unique()) == {"roce", "tcp"}
    assert packets["length"].max() > 9_000  # merged TCP segments, captured whole
    opcodes = set(packets.filter(pl.col("proto") == "roce")["opcode"].unique())
    assert opcodes >= {0x06, 0x07, 0x09, 0x11}  # RDMA WRITE first, middle, last with immediate; ACK
    assert packets.filter(pl.col("sack_left").is_not_null()).height == 0  # no loss in so few frames
    assert mix.stat().st_size > 3_000 * 3_000


@pytest.mark.parametrize("name", ["mix", "lab-tcp-loss/capture.pcap.gz", "kernel_retransmissions/duplicates.pcap"])
def test_headers_read_from_the_copy_of_frame_heads_are_the_files(name, mix, tmp_path, monkeypatch):
    """Frames far apart have their first bytes copied together before the headers are read: the
    same rows as every header read from the file (the copy off), whatever the frames hold."""
    path = mix if name == "mix" else _capture(name, tmp_path)
    read = []
    for sparse in (0, 1 << 40):  # frames always far apart (every chunk copied), never
        monkeypatch.setattr(decode, "SPARSE_BYTES", sparse)
        read.append(_packets(path))
    assert_frame_equal(read[0], read[1])
    assert read[0].height > 1_000


def test_a_chunk_spans_about_chunk_bytes_of_file(mix, monkeypatch):
    """A capture of full-size frames is walked in chunks of about CHUNK_BYTES of file, not of
    CHUNK_RECORDS records (gigabytes mapped at once); its rows are those of a walk in bigger chunks,
    but for the bucket, guessed from the first chunk's bytes per frame."""
    whole = _packets(mix).drop("bucket")
    monkeypatch.setattr(records, "CHUNK_BYTES", 1 << 20)
    with mix.open("rb") as fh:
        data = np.frombuffer(fh.read(), np.uint8)
    chunks = [chunk.starts for chunk in records.CaptureReader(data).walk()]
    assert len(chunks) > 10 and sum(map(len, chunks)) == 3_000
    assert max(int(starts[-1] - starts[0]) for starts in chunks) <= 1 << 20
    assert_frame_equal(_packets(mix).drop("bucket"), whole)
    assert 2_500 < records.CaptureReader(data).estimated_records() < 3_500


def test_reading_a_capture_imports_neither_pandas_nor_arrow_compute(mix):
    """pa.array imports pandas (and pyarrow.compute) on its first call when pandas is installed: most
    of a second, more than reading a capture of a few hundred thousand frames takes."""
    check = (
        "import sys; from pathlib import Path; from tracelens.ingest import InputFile;"
        "from tracelens.ingest.packets import pcap; p = Path(sys.argv[1]);"
        "r = pcap.ingest(InputFile(p, p.name, 'pcap', size=p.stat().st_size, spill=Path(sys.argv[2])));"
        "assert r.tables['packets'].collect().height == 3000;"
        "print(sorted(m for m in ('pandas', 'pyarrow.compute') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", check, str(mix), str(mix.parent / "spill")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
