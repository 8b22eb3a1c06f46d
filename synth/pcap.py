"""Synthetic packet captures: RoCEv2 conversations with injected faults, TCP streams, a bulk capture.

No public RoCE capture shows NAKs, CNPs or ECN-CE marks (see the shared corpus
README), so those cases are built here, with scapy's RoCE layers
(scapy.contrib.roce) and the layouts of docs/other-formats.md §3. They are
synthetic, and deterministic (fixed start time, no randomness).

The capture point is the responder's side of the link: a packet lost on the
way never appears, the next one arrives out of sequence, the responder NAKs
the PSN it expected and the requester goes back to it (go-back-N).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scapy.contrib.roce import AETH, BTH, cnp
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw
from scapy.utils import wrpcap

START = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
ROCE_PORT = 4791
SEND_ONLY, ACKNOWLEDGE = 0x04, 0x11
ACK_CREDITS = 0x1F  # AETH syndrome of a plain ACK (credit count "invalid/unlimited")
NAK_PSN_SEQUENCE = 0x60
RNR_NAK = 0x20 | 14  # RNR timer code 14
ECT0, CE = 2, 3

PACKET_GAP = 2e-6
NAK_TURNAROUND = 10e-6
RNR_DELAY = 1e-3
ACK_EVERY = 8


@dataclass(frozen=True)
class RoceFaults:
    """Which data packets (by index in the message stream) meet which trouble."""

    lost: tuple[int, ...] = ()  # lost before the capture point: NAK (PSN sequence error), go-back-N
    rnr: tuple[int, ...] = ()  # answered with an RNR NAK, resent after the RNR timer
    congested: tuple[int, ...] = ()  # marked ECN-CE on the way; the responder sends a CNP back


@dataclass(frozen=True)
class RoceQp:
    requester: str = "10.0.0.1"
    responder: str = "10.0.0.2"
    requester_qp: int = 0x11
    responder_qp: int = 0x48
    first_psn: int = 1000
    sport: int = 49152  # UDP source ports are flow entropy; any value


def roce_conversation(
    qp: RoceQp = RoceQp(), messages: int = 400, faults: RoceFaults = RoceFaults(), start: float = START
) -> list[Packet]:
    """One RC QP sending `messages` single-packet SENDs of 1 KiB, ACKed every ACK_EVERY, with `faults`."""
    out: list[Packet] = []
    t, i = start, 0
    lost, rnr = set(faults.lost), set(faults.rnr)

    def emit(packet: Packet) -> None:
        packet.time = t
        out.append(packet)

    while i < messages:
        t += PACKET_GAP
        psn = qp.first_psn + i
        if i in lost:
            lost.discard(i)
            if i + 1 < messages:  # the next packet shows the hole
                emit(_data(qp, psn + 1, ECT0, ack_req=False))
                t += PACKET_GAP
            emit(_response(qp, psn, NAK_PSN_SEQUENCE, msn=i))
            t += NAK_TURNAROUND
            continue
        if i in rnr:
            rnr.discard(i)
            emit(_data(qp, psn, ECT0, ack_req=True))
            t += PACKET_GAP
            emit(_response(qp, psn, RNR_NAK, msn=i))
            t += RNR_DELAY
            continue
        acked = (i + 1) % ACK_EVERY == 0 or i == messages - 1
        emit(_data(qp, psn, CE if i in faults.congested else ECT0, ack_req=acked))
        if i in faults.congested:
            emit(_ip(qp.responder, qp.requester, ECT0) / UDP(sport=qp.sport, dport=ROCE_PORT) / cnp(qp.requester_qp))
        if acked:
            t += PACKET_GAP
            emit(_response(qp, psn, ACK_CREDITS, msn=i + 1))
        i += 1
    return out


def _ip(src: str, dst: str, ecn: int) -> Packet:
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src=src, dst=dst, tos=ecn, flags="DF", id=0)


def _data(qp: RoceQp, psn: int, ecn: int, ack_req: bool) -> Packet:
    bth = BTH(opcode=SEND_ONLY, dqpn=qp.responder_qp, psn=psn & 0xFFFFFF, ackreq=int(ack_req))
    return _ip(qp.requester, qp.responder, ecn) / UDP(sport=qp.sport, dport=ROCE_PORT) / bth / Raw(b"\x5a" * 1024)


def _response(qp: RoceQp, psn: int, syndrome: int, msn: int) -> Packet:
    bth = BTH(opcode=ACKNOWLEDGE, dqpn=qp.requester_qp, psn=psn & 0xFFFFFF)
    return _ip(qp.responder, qp.requester, ECT0) / UDP(sport=qp.sport + 1, dport=ROCE_PORT) / bth / AETH(syndrome=syndrome, msn=msn)


def tcp_stream(
    client: str = "10.0.1.1",
    server: str = "10.0.1.2",
    segments: int = 200,
    lost: tuple[int, ...] = (),
    mirrored: bool = False,
    start: float = START,
    ports: tuple[int, int] = (40000, 5201),
) -> list[Packet]:
    """A handshake, then `segments` 1000-byte segments client -> server, each ACKed.

    A segment in `lost` is captured (at the sender) but never arrives: the server
    sends three duplicate ACKs and the client fast-retransmits it. With
    `mirrored`, every server frame is captured twice, 0.1 ms apart (same IP id
    and bytes): capture duplicates, not retransmissions.
    """
    rtt, mss, iss, irs = 100e-6, 1000, 5000, 90000
    out: list[Packet] = []
    t = start
    ip_ids = {client: 100, server: 7000}

    def emit(src: str, dst: str, **tcp) -> None:
        nonlocal t
        ip_ids[src] += 1
        sport, dport = ports if src == client else ports[::-1]
        payload = tcp.pop("payload", b"")
        frame = Ether() / IP(src=src, dst=dst, id=ip_ids[src]) / TCP(sport=sport, dport=dport, window=512, **tcp)
        copies = 2 if mirrored and src == server else 1
        for k in range(copies):
            packet = frame / Raw(payload) if payload else frame.copy()
            packet.time = t + k * 100e-6
            out.append(packet)
        t += rtt / 2

    emit(client, server, flags="S", seq=iss)
    emit(server, client, flags="SA", seq=irs, ack=iss + 1)
    emit(client, server, flags="A", seq=iss + 1, ack=irs + 1)
    for k in range(segments):
        seq = iss + 1 + k * mss
        emit(client, server, flags="PA", seq=seq, ack=irs + 1, payload=bytes([k % 256]) * mss)
        if k in lost:
            continue
        missing = [j for j in lost if j < k and k - j <= 3]
        acked = iss + 1 + (missing[0] if missing else k + 1) * mss
        emit(server, client, flags="A", seq=irs + 1, ack=acked)
        if missing and k - missing[0] == 3:  # third duplicate ACK: fast retransmit, then all is ACKed
            resend = iss + 1 + missing[0] * mss
            emit(client, server, flags="PA", seq=resend, ack=irs + 1, payload=bytes([missing[0] % 256]) * mss)
            emit(server, client, flags="A", seq=irs + 1, ack=seq + mss)
    return out


def write(path: Path, packets: list[Packet]) -> Path:
    """Write `packets` as a classic pcap (microseconds, Ethernet)."""
    wrpcap(str(path), packets)
    return path


def capture(packets: list[Packet], snaplen: int) -> bytes:
    """`packets` as the bytes of a classic pcap (microseconds, Ethernet) cut at `snaplen`, as
    `tcpdump -s SNAPLEN` writes it: each record keeps the frame's length on the wire."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1)]
    for packet in sorted(packets, key=lambda p: p.time):
        frame = bytes(packet)
        sec, usec = divmod(round(packet.time * 1_000_000), 1_000_000)
        out.append(struct.pack("<IIII", sec, usec, min(len(frame), snaplen), len(frame)) + frame[:snaplen])
    return b"".join(out)


# -- a bulk capture for the benchmark -----------------------------------------------------------

BULK_SNAPLEN = 128  # RoCE sniffers usually capture headers only (tcpdump -s 128)


def write_bulk_roce(path: Path, packets: int = 1_000_000, qps: int = 8) -> Path:
    """A RoCEv2 capture of `packets` frames over `qps` QPs, written with numpy from scapy templates.

    Per QP: 1 KiB SENDs snaplen-truncated to BULK_SNAPLEN, an ACK every 4th,
    a CNP every 64th; PSNs and timestamps are patched into each record.
    """
    qp_list = [RoceQp(requester=f"10.0.0.{q + 1}", responder="10.0.0.100", responder_qp=0x100 + q) for q in range(qps)]
    kinds = np.resize(np.array([0, 0, 0, 0, 1] * 12 + [0, 0, 0, 2]), packets)  # 0 data, 1 ACK, 2 CNP
    qp_of = np.arange(packets) % qps
    templates = [
        [bytes(_data(qp, 0, ECT0, ack_req=False)), bytes(_response(qp, 0, ACK_CREDITS, 0)),
         bytes(_ip(qp.responder, qp.requester, ECT0) / UDP(sport=qp.sport, dport=ROCE_PORT) / cnp(qp.requester_qp))]
        for qp in qp_list
    ]
    wire = np.array([[len(t) for t in per_qp] for per_qp in templates])[qp_of, kinds]
    caplen = np.minimum(wire, BULK_SNAPLEN)
    starts = 24 + np.concatenate([[0], np.cumsum(16 + caplen)[:-1]])
    out = np.zeros(24 + int((16 + caplen).sum()), np.uint8)
    out[:24] = np.frombuffer(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, BULK_SNAPLEN, 1), np.uint8)
    usec = np.arange(packets, dtype=np.int64)  # one packet per microsecond
    header = np.stack([int(START) + usec // 1_000_000, usec % 1_000_000, caplen, wire], axis=1).astype("<u4")
    out[starts[:, None] + np.arange(16)] = header.view(np.uint8).reshape(packets, 16)
    for q, per_qp in enumerate(templates):
        for kind, template in enumerate(per_qp):
            rows = np.flatnonzero((qp_of == q) & (kinds == kind))
            body = np.frombuffer(template[:BULK_SNAPLEN], np.uint8)
            out[(starts[rows] + 16)[:, None] + np.arange(len(body))] = body
    psn = np.zeros(packets, np.int64)
    for q in range(qps):  # consecutive PSNs per QP; an ACK names the last data PSN before it
        rows = np.flatnonzero(qp_of == q)
        psn[rows] = np.maximum(np.cumsum(kinds[rows] == 0) - 1, 0)
    psn_at = starts + 16 + 14 + 20 + 8 + 9
    for k in range(3):
        out[psn_at + k] = (psn >> (8 * (2 - k))) & 0xFF
    out.tofile(path)
    return path
