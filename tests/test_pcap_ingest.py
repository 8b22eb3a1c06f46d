"""pcap/pcapng ingest: containers, link types, truncation and bad input, checked against scapy's dissection."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import polars as pl
import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import CookedLinux, CookedLinuxV2, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import PcapNgWriter, PcapWriter, rdpcap

from synth import pcap as synth
from tests.helpers.pcap import T0, classic, read, roce, section


@pytest.mark.parametrize("nano", [False, True])
@pytest.mark.parametrize("little", [False, True])
def test_classic_pcap_both_resolutions_and_byte_orders(tmp_path, nano, little):
    path = classic(tmp_path / "c.pcap", [bytes(roce(psn=p)) for p in (7, 8)], nano=nano, little=little)
    packets, account = read(path)
    assert (account.lines, account.parsed, account.errors) == (2, 2, [])
    assert packets["psn"].to_list() == [7, 8]
    assert packets["ts"].dt.epoch("ns")[0] == int(T0) * 10**9 + (123_456_789 if nano else 123_456_000)


def test_scapy_written_pcap_and_pcapng_with_two_interfaces(tmp_path):
    frames = [roce(psn=p) for p in range(5)]
    for i, f in enumerate(frames):
        f.time = T0 + i / 1000
    writer = PcapWriter(str(tmp_path / "s.pcap"), linktype=1, nano=True, endianness=">")
    writer.write(frames)
    writer.close()
    packets, account = read(tmp_path / "s.pcap")
    assert packets["psn"].to_list() == list(range(5)) and account.errors == []

    ng = PcapNgWriter(str(tmp_path / "s.pcapng"))
    ng.write(frames[:2])
    ng.close()
    packets, account = read(tmp_path / "s.pcapng")
    assert (account.lines, account.errors) == (2, [])
    assert packets["psn"].to_list() == [0, 1]
    assert packets["ts"].dt.epoch("us").to_list() == [int(T0 * 1e6), int(T0 * 1e6) + 1000]


def pcapng(path: Path, interfaces: list[tuple[int, bytes]], packets: list[tuple[int, int, bytes]]) -> Path:
    """SHB, one IDB per (linktype, options), then EPBs (interface, timestamp units, frame)."""

    def block(kind: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", kind, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    for linktype, options in interfaces:
        out += block(1, struct.pack("<HHI", linktype, 0, 0) + options)
    for iface, units, frame in packets:
        out += block(6, struct.pack("<IIIII", iface, units >> 32, units & 0xFFFFFFFF, len(frame), len(frame)) + frame)
    out += block(3, struct.pack("<I", len(bytes(roce(psn=99)))) + bytes(roce(psn=99)))  # a simple packet block
    path.write_bytes(out)
    return path


def test_pcapng_interfaces_with_their_own_link_type_and_resolution(tmp_path):
    ns_resol = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
    raw_ip = bytes(
        IP(src="10.0.0.3", dst="10.0.0.4")
        / UDP(dport=4791)
        / BTH(opcode=17, dqpn=5, psn=3)
        / AETH(syndrome=0x60, msn=2)
    )
    path = pcapng(
        tmp_path / "m.pcapng",
        [(1, b""), (101, ns_resol)],
        [(0, int(T0 * 1e6), bytes(roce(psn=1))), (1, int(T0 * 1e9) + 5, raw_ip)],
    )
    packets, account = read(path)
    assert (account.lines, account.parsed, account.errors) == (3, 3, [])
    assert packets["psn"].to_list() == [1, 3, 99]
    assert packets["syndrome"].to_list() == [None, 0x60, None]
    assert packets["ts"].dt.epoch("ns").to_list()[:2] == [int(T0) * 10**9, int(T0 * 1e9) + 5]
    assert packets["ts_quality"].to_list() == ["exact", "exact", "none"]  # simple packet blocks carry no time


@pytest.mark.parametrize(
    "linktype, frame",
    [
        (
            1,
            Ether()
            / Dot1Q(vlan=5)
            / Dot1Q(vlan=6)
            / IP(src="10.0.0.1", dst="10.0.0.2", tos=3)
            / UDP(dport=4791)
            / BTH(psn=42, dqpn=9),
        ),
        (
            113,
            CookedLinux(proto=0x0800)
            / IP(src="10.0.0.1", dst="10.0.0.2", tos=3)
            / UDP(dport=4791)
            / BTH(psn=42, dqpn=9),
        ),
        (
            276,
            CookedLinuxV2(proto=0x0800)
            / IP(src="10.0.0.1", dst="10.0.0.2", tos=3)
            / UDP(dport=4791)
            / BTH(psn=42, dqpn=9),
        ),
        (101, IP(src="10.0.0.1", dst="10.0.0.2", tos=3) / UDP(dport=4791) / BTH(psn=42, dqpn=9)),
        (
            242,
            Raw(bytes(40) + b"\x08\x00\x00\x00")
            / IP(src="10.0.0.1", dst="10.0.0.2", tos=3)
            / UDP(dport=4791)
            / BTH(psn=42, dqpn=9),
        ),
    ],
    ids=["ethernet-qinq", "linux-cooked-v1", "linux-cooked-v2", "raw-ip", "ipoib"],
)
def test_link_types(tmp_path, linktype, frame):
    packets, account = read(classic(tmp_path / "l.pcap", [bytes(frame)], linktype=linktype))
    assert account.errors == [] and account.parsed == 1
    row = packets.row(0, named=True)
    assert (row["src"], row["dst"], row["proto"], row["ecn"], row["psn"], row["dest_qp"]) == (
        "10.0.0.1",
        "10.0.0.2",
        "roce",
        3,
        42,
        9,
    )


def test_ipv6_roce_and_tcp_sack(tmp_path):
    v6 = (
        Ether(dst="02:00:00:00:00:02")  # a MAC of its own: scapy would ask the network for fd00::2's (1 s)
        / IPv6(src="fd00::1", dst="fd00::2", tc=0x03)
        / UDP(sport=1, dport=4791)
        / BTH(opcode=0x81, becn=1, dqpn=77)
    )
    tcp = (
        Ether()
        / IP(src="10.1.1.1", dst="10.1.1.2", id=9)
        / TCP(
            sport=22,
            dport=5000,
            seq=100,
            ack=200,
            flags="A",
            window=0,
            options=[("NOP", None), ("NOP", None), ("SAck", (300, 400))],
        )
    )
    packets, _ = read(classic(tmp_path / "v6.pcap", [bytes(v6), bytes(tcp)]))
    a, b = packets.rows(named=True)
    assert (a["src"], a["ecn"], a["opcode"], a["becn"], a["dest_qp"]) == ("fd00::1", 3, 0x81, True, 77)
    assert (b["seq"], b["ack"], b["flags"], b["window"], b["ip_id"], b["sack_left"], b["sack_right"]) == (
        100,
        200,
        0x10,
        0,
        9,
        300,
        400,
    )


def test_roce_by_destination_port_only(tmp_path):
    reply = Ether() / IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=4791, dport=69) / Raw(b"\x11" * 16)
    packets, _ = read(classic(tmp_path / "p.pcap", [bytes(roce()), bytes(reply)]))
    assert packets["proto"].to_list() == ["roce", "udp"]
    assert packets["opcode"].to_list() == [4, None]


def test_snaplen_truncated_frames_keep_the_fields_they_have(tmp_path):
    ack = (
        Ether()
        / IP(src="10.0.0.2", dst="10.0.0.1")
        / UDP(dport=4791)
        / BTH(opcode=17, dqpn=3, psn=11)
        / AETH(syndrome=0x60, msn=4)
    )
    cut = 14 + 20 + 8 + 12  # through the BTH, the AETH is cut off
    packets, account = read(classic(tmp_path / "t.pcap", [bytes(ack)], caplen=cut))
    row = packets.row(0, named=True)
    assert account.parsed == 1
    assert (row["psn"], row["dest_qp"], row["syndrome"], row["msn"]) == (11, 3, None, None)
    assert row["length"] == len(bytes(ack)) and row["payload"] == 0

    packets, _ = read(classic(tmp_path / "t2.pcap", [bytes(ack)], caplen=14 + 20 + 8 + 8))  # BTH up to the QP
    row = packets.row(0, named=True)
    assert (row["opcode"], row["dest_qp"], row["psn"]) == (17, 3, None)


def test_capture_cut_mid_record_keeps_whole_packets(tmp_path):
    path = classic(tmp_path / "cut.pcap", [bytes(roce(psn=p)) for p in range(3)])
    path.write_bytes(path.read_bytes()[:-10])
    packets, account = read(path)
    assert packets["psn"].to_list() == [0, 1]
    assert account.errors == [
        f"cut.pcap: capture cut mid-record at byte {24 + 2 * (16 + len(bytes(roce())))} "
        "(frame 3); kept the 2 whole packets before it"
    ]


@pytest.mark.parametrize("zeros", [64 << 20, 1 << 40])
def test_zeros_to_the_end_after_the_last_record_are_padding_read_past_fast(tmp_path, zeros: int):
    """A capture followed by zeros (a sparse file's hole, space preallocated and never written): 16 zero
    bytes read as an empty record, and each one as the next, so the walk went through every byte of
    the zeros, a terabyte of them in a sparse file. Zeros up to the end are the file's padding, said
    as such: no record was cut."""
    path = classic(tmp_path / "z.pcap", [bytes(roce(psn=p)) for p in range(3)])
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size + zeros)
    started = time.perf_counter()
    packets, account = read(path)
    assert time.perf_counter() - started < 10
    assert packets["psn"].to_list() == [0, 1, 2] and (account.lines, account.parsed) == (3, 3)
    assert account.errors == []
    assert account.notes == [
        f"ends in {zeros:,} zero bytes after its 3 packets (padding, or space allocated and never written), "
        "not a record cut short"
    ]


def test_zeros_where_a_record_should_be_with_data_after_them_are_corruption(tmp_path):
    path = classic(tmp_path / "z.pcap", [bytes(roce(psn=p)) for p in range(3)])
    whole = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(whole + (64 << 20))
        fh.write(b"after the hole")
    packets, account = read(path)
    assert packets["psn"].to_list() == [0, 1, 2] and account.notes == []
    assert account.errors == [
        f"z.pcap: record at byte {whole} (frame 4) is all zeros (a hole, or blocks never written), not a "
        "packet, so the file is corrupt from there; kept the 3 packets before it"
    ]


@pytest.mark.parametrize("tail", [4, 12, 8192])
def test_a_pcapng_ending_in_zeros_says_padding_not_a_cut_block(tmp_path, tail: int):
    frames = [(0, int(T0) * 10**6 + p, bytes(roce(psn=p))) for p in range(2)]
    path = tmp_path / "z.pcapng"
    path.write_bytes(section("<", [(1, 0, None)], frames) + bytes(tail))
    packets, account = read(path)
    assert packets["psn"].to_list() == [0, 1] and account.errors == []
    assert account.notes == [
        f"ends in {tail:,} zero bytes after its 2 packets (padding, or space allocated and never written), "
        "not a record cut short"
    ]
    path.write_bytes(section("<", [(1, 0, None)], frames) + bytes(tail + 12) + b"\x01")  # data after them: a hole
    packets, account = read(path)
    assert packets["psn"].to_list() == [0, 1] and account.notes == []
    assert account.errors == [
        f"z.pcapng: record at byte {len(section('<', [(1, 0, None)], frames))} (frame 3) is all zeros (a hole, or "
        "blocks never written), not a packet, so the file is corrupt from there; kept the 2 packets before it"
    ]


@pytest.mark.parametrize(
    "content", [section("<", [(1, 0, None)], []), struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
)
def test_a_capture_of_headers_only_says_it_holds_no_packets(tmp_path, content: bytes):
    path = tmp_path / "h.pcap"
    path.write_bytes(content)
    packets, account = read(path)
    assert packets is None and account.errors == []
    assert account.notes == ["a capture of no packets: its headers and nothing after them"]
    path.write_bytes(content + bytes(100))
    assert read(path)[1].notes == [
        "ends in 100 zero bytes after its headers, before any packet (padding, or space allocated and never "
        "written), not a record cut short"
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "e.pcap: empty file, not a capture"),
        (b"\xd4\xc3\xb2\xa1\x02\x00", "e.pcap: pcap file header cut short (6 of 24 bytes)"),
        (b"GIF89a garbage" * 4, "e.pcap: not a pcap or pcapng file (starts with 47494638)"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, content, message):
    path = tmp_path / "e.pcap"
    path.write_bytes(content)
    packets, account = read(path)
    assert packets is None and account.errors == [message]


def test_unknown_link_type_and_malformed_frames(tmp_path):
    packets, account = read(classic(tmp_path / "u.pcap", [b"\x00" * 30, b"\x01" * 30], linktype=147))
    assert account.errors == ["u.pcap: link type 147 is not one tracelens decodes; its packets were skipped"]
    assert (account.lines, account.parsed, account.unrecognized) == (2, 0, 2)

    short_ip = bytes(Ether() / IP())[:20]
    packets, account = read(classic(tmp_path / "m.pcap", [short_ip, bytes(Ether(type=0x88CC) / Raw(b"lldp"))]))
    assert (account.parsed, account.ignored, account.unrecognized) == (0, 1, 1)
    assert account.samples == [(1, "Ethernet frame of 20 captured bytes: network header cut off or malformed")]


def test_decoder_agrees_with_scapy_on_synthetic_captures(tmp_path):
    """scapy is the oracle: every field the decoder fills equals scapy's dissection of the same frames."""
    frames = synth.roce_conversation(
        messages=120, faults=synth.RoceFaults(lost=(10,), rnr=(30,), congested=(50, 51))
    ) + synth.tcp_stream(segments=20, lost=(5,))
    path = synth.write(tmp_path / "o.pcap", frames)
    packets, _ = read(path)
    expected = []
    for frame in rdpcap(str(path)):
        ip = frame[IP]
        row = {"src": ip.src, "dst": ip.dst, "ecn": ip.tos & 3, "ip_id": ip.id, "length": len(frame)}
        if BTH in frame:
            bth = frame[BTH]
            row |= {
                "opcode": bth.opcode,
                "dest_qp": bth.dqpn,
                "psn": bth.psn,
                "ack_req": bool(bth.ackreq),
                "fecn": bool(bth.fecn),
                "becn": bool(bth.becn),
            }
            row |= (
                {"syndrome": frame[AETH].syndrome, "msn": frame[AETH].msn}
                if AETH in frame
                else {"syndrome": None, "msn": None}
            )
        else:
            tcp = frame[TCP]
            row |= {
                "seq": tcp.seq,
                "ack": tcp.ack,
                "flags": int(tcp.flags),
                "window": tcp.window,
                "payload": len(tcp.payload),
            }
        expected.append(row)
    decoded = packets.select(
        pl.col(c).cast(pl.String) if c in ("src", "dst") else c
        for c in [
            "src",
            "dst",
            "ecn",
            "ip_id",
            "length",
            "opcode",
            "dest_qp",
            "psn",
            "ack_req",
            "fecn",
            "becn",
            "syndrome",
            "msn",
            "seq",
            "ack",
            "flags",
            "window",
            "payload",
        ]
    )
    for want, got in zip(expected, decoded.rows(named=True), strict=True):
        assert {k: got[k] for k in want} == want


def test_rocev1_grh(tmp_path):
    from scapy.contrib.roce import GRH

    frame = (
        Ether(type=0x8915)
        / GRH(sgid=0xFE80 << 112 | 1, dgid=0xFE80 << 112 | 2, paylen=12 + 64 + 4)
        / BTH(opcode=4, dqpn=0x48, psn=77)
        / Raw(b"x" * 64)
    )
    packets, account = read(classic(tmp_path / "v1.pcap", [bytes(frame)]))
    row = packets.row(0, named=True)
    assert (row["proto"], row["src"], row["dst"], row["psn"], row["dest_qp"], row["payload"]) == (
        "roce",
        "fe80::1",
        "fe80::2",
        77,
        0x48,
        64,
    )
