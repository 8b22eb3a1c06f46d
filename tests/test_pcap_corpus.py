"""The real captures of ../shared/corpus/pcap: read without error, RoCE fields equal tshark's and scapy's,
TCP retransmissions as tshark counts them, capture duplicates told apart."""

from __future__ import annotations

import polars as pl
import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.utils import rdpcap

from tests.helpers import corpus_dir, tshark
from tests.helpers.tshark import needs_tshark
from tracelens.derived.flows import analyze
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
from tracelens.tables import conform

ROCE = "oferby-proxy__roce.pcap"


def read(name: str) -> tuple[pl.DataFrame, object]:
    path = corpus_dir("pcap") / name
    result = pcap.ingest(InputFile(path, path.name, "pcap"))
    return conform("packets", result.tables["packets"]), result.account


def test_every_corpus_capture_reads_without_error():
    names = sorted(p.name for p in corpus_dir("pcap").iterdir() if p.suffix in (".pcap", ".pcapng"))
    assert len(names) == 9
    counts = {}
    for name in names:
        packets, account = read(name)
        assert account.errors == [] and account.unrecognized == 0, name
        counts[name] = (account.lines, packets.height)
    assert counts["tcpdump-tests__of13_ericsson.pcapng"] == (174, 174)  # pcapng
    assert counts["tcpdump-tests__tcp-handshake-nano.pcap"] == (3, 3)  # ns pcap, Linux cooked
    assert counts["tcpdump-tests__ipoib.pcap"] == (30, 30)


def test_nanosecond_linux_cooked_capture():
    packets, _ = read("tcpdump-tests__tcp-handshake-nano.pcap")
    assert packets["flags"].to_list() == [0x02, 0x12, 0x10]
    assert packets["ts"].dt.epoch("ns")[0] == 1418145369924505488  # nanoseconds kept
    assert packets["src"][0] == "131.155.215.69"


def test_ipoib_capture():
    packets, _ = read("tcpdump-tests__ipoib.pcap")
    assert packets["proto"].value_counts().sort("proto").rows() == [("arp", 4), ("icmp", 6), ("tcp", 20)]
    assert packets["src"][0] == "192.168.56.10"


def test_native_infiniband_in_erf():
    packets, _ = read("rdma-softroce-demo__infiniband_erf.pcap")
    acks = packets.filter(pl.col("opcode") == 17)
    assert acks["syndrome"].unique().to_list() == [31]
    assert acks["msn"].head(6).to_list() == [1, 2, 3, 4, 5, 6]
    assert packets.row(2, named=True)["src"] == "LID 5"  # a GRH frame: LRH, GRH, then BTH


@needs_tshark
def test_roce_fields_equal_tshark():
    packets, _ = read(ROCE)
    mine = packets.filter(pl.col("dport") == 4791).select("frame", "opcode", "dest_qp", "psn").rows()
    theirs = tshark.run(
        corpus_dir("pcap") / ROCE,
        "-d",
        "udp.port==4791,infiniband",
        "-d",
        "udp.port==69,infiniband",
        "-Y",
        "udp.dstport==4791",
        "-T",
        "fields",
        "-e",
        "frame.number",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "infiniband.bth.psn",
    )
    assert len(mine) == 105
    assert mine == [(int(f), int(op), int(qp, 16), int(psn)) for f, op, qp, psn in theirs]


def test_roce_fields_equal_scapy():
    packets, _ = read(ROCE)
    mine = packets.filter(pl.col("dport") == 4791).select("frame", "opcode", "dest_qp", "psn", "syndrome").rows()
    frames = rdpcap(str(corpus_dir("pcap") / ROCE))
    theirs = [
        (i + 1, f[BTH].opcode, f[BTH].dqpn, f[BTH].psn, f[AETH].syndrome if AETH in f else None)
        for i, f in enumerate(frames)
        if BTH in f
    ]
    assert mine == theirs


def test_real_roce_capture_is_healthy():
    packets, _ = read(ROCE)
    qps = analyze(packets).qps
    assert qps.select("qp", "packets", "retransmitted", "psn_gaps", "naks_seq", "cnps").rows() == [
        (0x45, 67, 0, 0, 0, 0),
        (0x48, 1, 0, 0, 0, 0),
    ]


def test_ssh_repacketized_retransmission_found():
    packets, _ = read("tcpdump-tests__ssh.pcap")
    analysis = analyze(packets)
    # tshark flags frame 49 a retransmission; the receiver's D-SACK in frame 54 (SLE=5186 SRE=5283,
    # below its ACK) says it had the bytes already: a spurious one, no loss
    retx = analysis.events.filter(pl.col("kind").str.starts_with("TCP"))
    assert retx.select("frame", "kind").rows() == [(49, "TCP spurious retransmission")]
    flow = analysis.tcp.filter(pl.col("retransmissions") > 0).row(0, named=True)
    assert (flow["src"], flow["retransmitted_bytes"]) == ("202.108.87.165", 96 + 1)  # 96 bytes and the FIN


def test_pptp_duplicates_are_capture_duplicates_not_retransmissions():
    packets, _ = read("tcpdump-tests__pptp.pcap")
    analysis = analyze(packets)
    kinds = analysis.events.group_by("kind").agg(pl.col("frame").sort()).rows()
    assert kinds == [("capture duplicate", [3, 7, 9, 12, 14, 18, 20, 23])]
    assert analysis.tcp["retransmissions"].sum() == 0


@needs_tshark
@pytest.mark.parametrize(
    "name",
    [
        "tcpdump-tests__ssh.pcap",
        "tcpdump-tests__mptcp-v0.pcap",
        "tcpdump-tests__of13_ericsson.pcapng",
        "tcpdump-tests__accecn_handshake.pcap",
    ],
)
def test_tcp_retransmissions_per_flow_match_tshark(name):
    packets, _ = read(name)
    theirs = tshark.per_flow(corpus_dir("pcap") / name, "tcp.analysis.retransmission")
    mine = analyze(packets).tcp.filter(pl.col("retransmissions") > 0)
    joined = mine.join(theirs, on=["src", "sport", "dst", "dport"], how="full", coalesce=True).fill_null(0)
    for row in joined.iter_rows(named=True):
        assert abs(row["retransmissions"] - row["len"]) <= 0.1 * row["len"], row
