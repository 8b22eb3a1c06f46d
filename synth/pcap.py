"""Synthetic packet captures: RoCEv2 conversations with injected faults, TCP streams, a bulk capture.

No public RoCE capture shows NAKs, CNPs or ECN-CE marks, so those cases are
built here, with scapy's RoCE layers (scapy.contrib.roce) and the layouts of
docs/formats/captures.md. They are
synthetic, and deterministic (fixed start time, no randomness).

The capture point is the responder's side of the link: a packet lost on the
way never appears, the next one arrives out of sequence, the responder NAKs
the PSN it expected and the requester goes back to it (go-back-N).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scapy.contrib.roce import AETH, BTH, CNPPadding, cnp
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import NoPayload, Packet, Raw
from scapy.utils import checksum

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
            emit(_cnp(qp))
        if acked:
            t += PACKET_GAP
            emit(_response(qp, psn, ACK_CREDITS, msn=i + 1))
        i += 1
    return out


def _stack(*layers: Packet) -> Packet:
    """`layers[0] / layers[1] / ...` without the copies `/` makes of both sides at every step: each
    layer becomes the payload of the one before (the same bytes, built several times faster).
    Each layer is marked explicit (every field a value, none a set of values to iterate over), so that
    building its bytes does not first clone it once per combination of field values: a third less."""
    for layer in layers:
        layer.explicit = True
    for layer in layers[1:]:
        layers[0].add_payload(layer)
    return layers[0]


def _ip(src: str, dst: str, ecn: int) -> tuple[Packet, Packet]:
    """The Ethernet and IPv4 layers of a RoCEv2 frame, for `_stack`."""
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02"), IP(src=src, dst=dst, tos=ecn, flags="DF", id=0)


def _data(qp: RoceQp, psn: int, ecn: int, ack_req: bool) -> Packet:
    bth = BTH(opcode=SEND_ONLY, dqpn=qp.responder_qp, psn=psn & 0xFFFFFF, ackreq=int(ack_req))
    return _stack(*_ip(qp.requester, qp.responder, ecn), UDP(sport=qp.sport, dport=ROCE_PORT), bth, Raw(b"\x5a" * 1024))


def _response(qp: RoceQp, psn: int, syndrome: int, msn: int) -> Packet:
    bth = BTH(opcode=ACKNOWLEDGE, dqpn=qp.requester_qp, psn=psn & 0xFFFFFF)
    udp = UDP(sport=qp.sport + 1, dport=ROCE_PORT)
    return _stack(*_ip(qp.responder, qp.requester, ECT0), udp, bth, AETH(syndrome=syndrome, msn=msn))


def _cnp(qp: RoceQp) -> Packet:
    """The responder's congestion notification to the requester."""
    return _stack(*_ip(qp.responder, qp.requester, ECT0), UDP(sport=qp.sport, dport=ROCE_PORT), cnp(qp.requester_qp))


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
        copies = 2 if mirrored and src == server else 1
        for k in range(copies):
            headers = Ether(), IP(src=src, dst=dst, id=ip_ids[src]), TCP(sport=sport, dport=dport, window=512, **tcp)
            packet = _stack(*headers, Raw(payload)) if payload else _stack(*headers)
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
    """Write `packets`, in their order, as a classic pcap (microseconds, Ethernet)."""
    path.write_bytes(_pcap(packets, 0xFFFF, _wrpcap_stamp))
    return path


def _wrpcap_stamp(t: float) -> tuple[int, int]:
    """Seconds and microseconds of a packet's time, rounded as scapy's wrpcap rounds them."""
    return int(t), round((t - int(t)) * 1_000_000)


def capture(packets: list[Packet], snaplen: int) -> bytes:
    """`packets` as the bytes of a classic pcap (microseconds, Ethernet) cut at `snaplen`, as
    `tcpdump -s SNAPLEN` writes it: each record keeps the frame's length on the wire."""
    return _pcap(sorted(packets, key=lambda p: p.time), snaplen, lambda t: divmod(round(t * 1_000_000), 1_000_000))


def _pcap(packets: list[Packet], snaplen: int, stamp: Callable[[float], tuple[int, int]]) -> bytes:
    """Records of `packets` in the order given, each stamped (seconds, microseconds) by `stamp`."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1)]
    shapes: dict[tuple, bytes] = {}
    for packet in packets:
        frame = _frame(packet, shapes)
        sec, usec = stamp(packet.time)
        out.append(struct.pack("<IIII", sec, usec, min(len(frame), snaplen), len(frame)) + frame[:snaplen])
    return b"".join(out)


# The fields that vary from packet to packet of one conversation: patched into the bytes of the first
# packet of the same shape (every other field equal), the checksums and the ICRC computed again.
_PATCHED = {IP: ("id",), BTH: ("psn",), AETH: ("msn",), TCP: ("seq", "ack"), Raw: ("load",)}
# Fields whose value scapy derives from the rest: a packet that sets one is built by scapy.
_DERIVED = frozenset({"len", "chksum", "ihl", "dataofs", "icrc"})


def _frame(packet: Packet, shapes: dict[tuple, bytes]) -> bytes:
    """The bytes of `packet`, as scapy builds them. A conversation's packets are a few shapes (data,
    ACK, NAK, CNP; TCP segment, ACK) that differ in a PSN, an MSN, an IP id, TCP sequence numbers and
    the payload's bytes: scapy builds the first of each shape, the rest are its bytes with
    those fields written in and the checksums and ICRC computed again (much cheaper)."""
    layers = _shape_layers(packet)
    if layers is None:
        return _built(packet)
    key = tuple(
        (
            type(layer),
            tuple((k, _hashable(v)) for k, v in sorted(layer.fields.items()) if k not in _PATCHED.get(type(layer), ())),
        )
        for layer in layers
    ) + ((len(layers[-1].load),) if type(layers[-1]) is Raw else ())
    first = shapes.get(key)
    if first is None:
        shapes[key] = first = _built(packet)
        return first
    frame = bytearray(first)
    by_type = {type(layer): layer for layer in layers}
    ip = 14
    l4 = ip + (frame[ip] & 0x0F) * 4
    frame[ip + 4 : ip + 6] = by_type[IP].id.to_bytes(2, "big")
    if Raw in by_type:
        load = by_type[Raw].load
        end = len(frame) - (4 if BTH in by_type else 0)  # a RoCE frame ends with its ICRC
        frame[end - len(load) : end] = load
    if TCP in by_type:
        frame[l4 + 4 : l4 + 8] = by_type[TCP].seq.to_bytes(4, "big")
        frame[l4 + 8 : l4 + 12] = by_type[TCP].ack.to_bytes(4, "big")
    if BTH in by_type:
        frame[l4 + 8 + 9 : l4 + 8 + 12] = by_type[BTH].psn.to_bytes(3, "big")
    if AETH in by_type:
        frame[l4 + 8 + 12 + 1 : l4 + 8 + 12 + 4] = by_type[AETH].msn.to_bytes(3, "big")
    frame[ip + 10 : ip + 12] = b"\0\0"
    frame[ip + 10 : ip + 12] = struct.pack("!H", checksum(bytes(frame[ip:l4])))
    if BTH in by_type:
        _roce_checks(frame, l4)
    elif TCP in by_type:
        frame[l4 + 16 : l4 + 18] = b"\0\0"
        frame[l4 + 16 : l4 + 18] = struct.pack("!H", _segment_checksum(frame, l4, 6))
    return bytes(frame)


def _shape_layers(packet: Packet) -> list[Packet] | None:
    """The layers of an Ethernet/IPv4 frame of UDP and RoCE, or TCP, layers whose bytes `_frame` can
    patch (no derived field set by hand, a payload only last); None for any other packet."""
    layers = []
    layer = packet
    while isinstance(layer, Packet) and type(layer) is not NoPayload:
        if any(layer.fields.get(k) is not None for k in _DERIVED) or (layers and type(layers[-1]) is Raw):
            return None
        layers.append(layer)
        layer = layer.payload
    kinds = [type(layer) for layer in layers]
    roce = kinds[:4] == [Ether, IP, UDP, BTH] and set(kinds[4:]) <= {AETH, Raw, CNPPadding}
    tcp = kinds[:3] == [Ether, IP, TCP] and set(kinds[3:]) <= {Raw}
    return layers if roce or tcp else None


def _hashable(value: object) -> object:
    return value if isinstance(value, (int, float, str, bytes)) else repr(value)


def _built(packet: Packet) -> bytes:
    """The bytes of `packet`. A RoCEv2 frame (Ethernet, IPv4) is built with a zero ICRC, which is then
    computed here from those bytes, with the UDP checksum that covers it: the same bytes as scapy's
    BTH gives, at half the cost (it copies and rebuilds the packet for the ICRC alone)."""
    bth = packet.getlayer(BTH)
    if bth is None or bth.icrc is not None or type(packet) is not Ether or type(packet.payload) is not IP:
        return bytes(packet)
    bth.icrc = 0
    try:
        frame = bytearray(bytes(packet))
    finally:
        bth.icrc = None
    _roce_checks(frame, 14 + (frame[14] & 0x0F) * 4)
    return bytes(frame)


def _roce_checks(frame: bytearray, udp: int) -> None:
    """Write the ICRC of a RoCEv2 frame, then the UDP checksum (if it has one) that covers it."""
    frame[-4:] = _icrc(frame[14:-4], udp - 14)
    if frame[udp + 6 : udp + 8] != b"\0\0":  # a UDP checksum (0 means none): it covers the ICRC
        frame[udp + 6 : udp + 8] = b"\0\0"
        frame[udp + 6 : udp + 8] = struct.pack("!H", _segment_checksum(frame, udp, 17) or 0xFFFF)


def _segment_checksum(frame: bytearray, at: int, protocol: int) -> int:
    """The checksum of the TCP or UDP segment at `at` (its own checksum zeroed) with the IPv4 pseudo-header."""
    segment = bytes(frame[at:])
    return checksum(bytes(frame[26:34]) + struct.pack("!BBH", 0, protocol, len(segment)) + segment)


def _icrc(ip: bytearray, header: int) -> bytes:
    """RoCEv2 ICRC (IBTA Annex A17) of an IPv4 packet without its ICRC: the CRC-32 of 8 bytes of ones
    and the packet, with the fields a router may change (TOS, TTL, IP and UDP checksums, the BTH's
    FECN/BECN byte) set to ones; little-endian on the wire."""
    masked = bytearray(b"\xff" * 8) + ip
    masked[9] = masked[16] = 0xFF  # TOS, TTL
    masked[18:20] = b"\xff\xff"  # IP header checksum
    udp = 8 + header
    masked[udp + 6 : udp + 8] = b"\xff\xff"  # UDP checksum
    masked[udp + 12] = 0xFF  # BTH: FECN, BECN, reserved
    return struct.pack("<I", zlib.crc32(masked) & 0xFFFFFFFF)


# -- a bulk capture for the benchmark -----------------------------------------------------------

BULK_SNAPLEN = 128  # RoCE sniffers usually capture headers only (tcpdump -s 128)


def write_bulk_roce(path: Path, packets: int = 1_000_000, qps: int = 8) -> Path:
    """A RoCEv2 capture of `packets` frames over `qps` QPs, written with numpy from one scapy-built
    frame per shape (data, ACK, CNP).

    Per QP: 1 KiB SENDs snaplen-truncated to BULK_SNAPLEN, an ACK every 4th,
    a CNP every 64th; PSNs and timestamps are patched into each record.
    """
    qp_list = [RoceQp(requester=f"10.0.0.{q + 1}", responder="10.0.0.100", responder_qp=0x100 + q) for q in range(qps)]
    kinds = np.resize(np.array([0, 0, 0, 0, 1] * 12 + [0, 0, 0, 2]), packets)  # 0 data, 1 ACK, 2 CNP
    qp_of = np.arange(packets) % qps
    shape_frames = [
        [
            bytes(_data(qp, 0, ECT0, ack_req=False)),
            bytes(_response(qp, 0, ACK_CREDITS, 0)),
            bytes(_cnp(qp)),
        ]
        for qp in qp_list
    ]
    wire = np.array([[len(t) for t in per_qp] for per_qp in shape_frames])[qp_of, kinds]
    caplen = np.minimum(wire, BULK_SNAPLEN)
    starts = 24 + np.concatenate([[0], np.cumsum(16 + caplen)[:-1]])
    out = np.zeros(24 + int((16 + caplen).sum()), np.uint8)
    out[:24] = np.frombuffer(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, BULK_SNAPLEN, 1), np.uint8)
    usec = np.arange(packets, dtype=np.int64)  # one packet per microsecond
    header = np.stack([int(START) + usec // 1_000_000, usec % 1_000_000, caplen, wire], axis=1).astype("<u4")
    out[starts[:, None] + np.arange(16)] = header.view(np.uint8).reshape(packets, 16)
    for q, per_qp in enumerate(shape_frames):
        for kind, frame in enumerate(per_qp):
            rows = np.flatnonzero((qp_of == q) & (kinds == kind))
            body = np.frombuffer(frame[:BULK_SNAPLEN], np.uint8)
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


# -- a large multi-flow capture (benchmarks/capture.py) ----------------------------------------

MULTIFLOW_SNAPLEN = 96
MULTIFLOW_CHUNK = 1_000_000
_IP_AT, _L4_AT = 14, 34


def trouble_slice() -> bytes:
    """The slice's records (pcap, microseconds, Ethernet), without the file header: lost RoCE packets
    answered by NAKs and resent, an RNR NAK, ECN-CE marks with CNPs; a TCP stream with lost segments."""
    packets = [
        *roce_conversation(
            RoceQp("10.0.0.1", "10.0.0.2", 0x11, 0x48),
            400,
            RoceFaults(lost=(50, 200), rnr=(120,), congested=(10, 11, 12)),
        ),
        *tcp_stream("10.0.1.1", "10.0.1.2", segments=300, lost=(40, 150, 151)),
    ]
    packets.sort(key=lambda p: float(p.time))
    return _pcap(packets, 0xFFFF, _wrpcap_stamp)[24:]  # as wrpcap wrote them: whole frames, written directly


def shape_frames() -> list[bytes]:
    """One Ethernet frame per shape (RoCE SEND, RoCE ACK, TCP data, TCP ACK), its varying fields
    patched per record."""
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    return [
        bytes(
            eth
            / IP(tos=2, flags="DF")
            / UDP(sport=49152, dport=4791)
            / BTH(opcode=0x04, ackreq=0)
            / Raw(b"\x5a" * 1024)
        ),
        bytes(eth / IP(tos=2, flags="DF") / UDP(sport=49153, dport=4791) / BTH(opcode=0x11) / AETH(syndrome=0x1F)),
        bytes(eth / IP(flags="DF") / TCP(sport=40000, dport=5201, flags="PA", window=512) / Raw(b"\x33" * 1000)),
        bytes(eth / IP(flags="DF") / TCP(sport=5201, dport=40000, flags="A", window=512)),
    ]


def _hosts(base: int, index: np.ndarray) -> np.ndarray:
    """10.<base>.x.y addresses as big-endian uint32, one host per index."""
    return (10 << 24) | (base << 16) | ((index // 250) << 8) | (index % 250 + 1)


def _patch(out: np.ndarray, at: np.ndarray, values: np.ndarray, width: int) -> None:
    for k in range(width):
        out[at + k] = (values >> (8 * (width - 1 - k))) & 0xFF


class Background:
    """Healthy flows of a multi-flow capture, a chunk of records at a time."""

    def __init__(self, qps: int, tcp: int, start_us: int) -> None:
        self.qps, self.tcp = qps, tcp
        frames = shape_frames()
        self.bodies = [np.frombuffer(f[:MULTIFLOW_SNAPLEN], np.uint8) for f in frames]
        self.wire = np.array([len(f) for f in frames])
        self.flows = qps + tcp
        self.next_us = start_us
        self.step = 0

    def chunk(self, n: int) -> bytes:
        # round-robin over flows: record g is flow g % flows's (g // flows)-th record; of each `every` + 1
        # records of a flow the last is the ACK of the `every` data records before it
        index = self.step + np.arange(n, dtype=np.int64)
        self.step += n
        flow, turn = index % self.flows, index // self.flows
        roce = flow < self.qps
        every = np.where(roce, 8, 2)
        cycle = every + 1
        ack = (turn % cycle == every).astype(np.int64)
        data_before = turn // cycle * every + np.minimum(turn % cycle, every)  # the flow's data records before this one
        kind = np.where(roce, 0, 2) + ack
        caplen = np.minimum(self.wire[kind], MULTIFLOW_SNAPLEN)
        starts = np.concatenate([[0], np.cumsum(16 + caplen)[:-1]])
        out = np.zeros(int((16 + caplen).sum()), np.uint8)
        usec = self.next_us + np.arange(n, dtype=np.int64)
        self.next_us += n
        header = np.stack([usec // 1_000_000, usec % 1_000_000, caplen, self.wire[kind]], axis=1).astype("<u4")
        out[starts[:, None] + np.arange(16)] = header.view(np.uint8).reshape(n, 16)
        for k, body in enumerate(self.bodies):
            rows = np.flatnonzero(kind == k)
            out[(starts[rows] + 16)[:, None] + np.arange(len(body))] = body
        frame = starts + 16
        client = np.where(roce, _hosts(1, flow), _hosts(3, flow - self.qps))
        server = np.where(roce, _hosts(2, flow % 250), _hosts(4, (flow - self.qps) % 250))
        src, dst = np.where(ack == 1, server, client), np.where(ack == 1, client, server)
        _patch(out, frame + _IP_AT + 12, src, 4)
        _patch(out, frame + _IP_AT + 16, dst, 4)
        _patch(out, frame + _IP_AT + 4, (data_before + ack * 7919) & 0xFFFF, 2)  # IP id: per direction, moving
        r, t = np.flatnonzero(roce), np.flatnonzero(~roce)
        psn = (1000 + np.maximum(data_before[r] - ack[r], 0)) & 0xFFFFFF  # an ACK names the last data PSN
        # data to the responder's QP, ACKs to the requester's
        qp = np.where(ack[r] == 1, 0x10000 + flow[r], 0x20000 + flow[r])
        _patch(out, frame[r] + _L4_AT + 8 + 5, qp, 3)
        _patch(out, frame[r] + _L4_AT + 8 + 9, psn, 3)
        _patch(out, frame[r] + _L4_AT, 49152 + ack[r], 2)
        port = 40000 + (flow[t] - self.qps) % 20000
        _patch(out, frame[t] + _L4_AT, np.where(ack[t] == 1, 5201, port), 2)
        _patch(out, frame[t] + _L4_AT + 2, np.where(ack[t] == 1, port, 5201), 2)
        client_seq = 5000 + data_before[t] * 1000
        _patch(out, frame[t] + _L4_AT + 4, np.where(ack[t] == 1, 90000, client_seq), 4)  # seq
        _patch(out, frame[t] + _L4_AT + 8, np.where(ack[t] == 1, client_seq, 90000), 4)  # ack
        return out.tobytes()


def write_multiflow(path: Path, packets: int, qps: int = 2000, tcp: int = 2000) -> int:
    """A capture of `packets` records: the trouble slice, then `qps` healthy RC QPs and `tcp` healthy TCP
    connections round-robin (see benchmarks/capture.py); the number of records written."""
    trouble = trouble_slice()
    total = 0
    with path.open("wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, MULTIFLOW_SNAPLEN, 1))
        out.write(trouble)
        total += _count(trouble)
        background = Background(qps, tcp, start_us=(1_700_000_000 + 1) * 1_000_000)
        while total < packets:
            n = min(MULTIFLOW_CHUNK, packets - total)
            out.write(background.chunk(n))
            total += n
    return total


def _count(records: bytes) -> int:
    pos, n = 0, 0
    while pos < len(records):
        pos += 16 + struct.unpack_from("<I", records, pos + 8)[0]
        n += 1
    return n


# -- a real-size mix: full frames of RoCE and TCP training traffic (benchmarks/bench_pcap.py) ----------

MIX_SNAPLEN = 262_144  # tcpdump's default: every frame whole
ROCE_MTU = 4096  # the RoCE path MTU of a 9000-byte Ethernet fabric
TCP_MSS = 8948  # TCP on the same jumbo-frame interfaces
RETH_LEN, IMMDT_LEN, ICRC_LEN = 16, 4, 4
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST_IMM = 0x06, 0x07, 0x09
MIX_MESSAGE = 128  # packets of a NCCL chunk written by one RDMA WRITE (512 KiB)
MIX_ACK_EVERY = 16  # the requester asks for an ACK every this many packets, and at a message's end
MIX_WINDOW = 6  # packets a requester has sent past a lost one before the NAK reaches it


@dataclass(frozen=True)
class _MixKind:
    header: bytes  # the frame up to its payload, as scapy builds it
    trailer: int  # bytes after the payload (a RoCE frame's ICRC)


def _mix_kinds() -> list[_MixKind]:
    """The frame shapes of the mix, by index: RDMA WRITE first, middle, last with immediate, ACK/NAK,
    CNP; TCP data, ACK, ACK with a SACK block (TCP with timestamps, as Linux sends it)."""
    eth, ip = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02"), IP(tos=ECT0, flags="DF")
    udp = UDP(sport=49152, dport=ROCE_PORT)
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (100, 200))]
    sack = [*ts, ("NOP", None), ("NOP", None), ("SAck", (0, 0))]

    def tcp(flags: str, options: list) -> bytes:
        return bytes(eth / IP(flags="DF") / TCP(sport=40000, dport=5201, flags=flags, window=1024, options=options))

    def roce(*layers: Packet, extension: int = 0) -> _MixKind:  # scapy ends a RoCE frame with its ICRC
        frame = bytes(_stack(eth.copy(), ip.copy(), udp.copy(), *layers))
        return _MixKind(frame[:-ICRC_LEN] + bytes(extension), ICRC_LEN)

    return [
        roce(BTH(opcode=WRITE_FIRST), extension=RETH_LEN),
        roce(BTH(opcode=WRITE_MIDDLE)),
        roce(BTH(opcode=WRITE_LAST_IMM), extension=IMMDT_LEN),
        roce(BTH(opcode=ACKNOWLEDGE), AETH(syndrome=ACK_CREDITS)),
        roce(cnp(0)),
        _MixKind(tcp("PA", ts), 0),
        _MixKind(tcp("A", ts), 0),
        _MixKind(tcp("A", sack), 0),
    ]


_FIRST, _MIDDLE, _LAST, _RESPONSE, _CNP, _TCP_DATA, _TCP_ACK, _TCP_SACK = range(8)
# the fields of a record of the mix, set per record; the rest comes from its kind's header
_MIX_FIELDS = ("t_ns", "kind", "src", "dst", "sport", "dport", "ip_id", "ecn", "a", "b", "c", "d", "payload")


class _MixFlows:
    """The records of the mix's flows, appended flow by flow (each in time order): for RoCE `a` is the
    destination QP, `b` the PSN, `c` the AETH (syndrome << 24 | MSN) or the ack-request bit; for TCP `a`
    is the sequence number, `b` the acknowledgement, `c` and `d` the SACK block's edges."""

    def __init__(self, seed: int) -> None:
        self.rows: list[tuple[int, ...]] = []
        self.starts: list[int] = []  # where each flow's records start
        self.rng = np.random.default_rng(seed)

    def roce_qp(self, requester: int, responder: int, qp: int, packets: int, start_ns: int, sent_here: bool) -> None:
        """One RC QP writing `packets` packets in 512 KiB messages, ACKed every MIX_ACK_EVERY. A packet
        lost on the way is seen (`sent_here`: the capture is at the requester) or missing (at the
        responder); the responder NAKs the PSN it expected and the requester goes back to it."""
        emit, rng = self.rows.append, self.rng
        self.starts.append(len(self.rows))
        t, psn, ids = start_ns, 1000 + qp, {requester: 0, responder: 0}
        sport = 49152 + qp % 16000
        loss = set((rng.random(packets) < 1 / 20_000).nonzero()[0].tolist())
        congested = rng.random(packets) < 0.002  # ECN-CE marked on the way: the responder sends a CNP
        i, emitted, msn = 0, 0, 0

        def packet(src: int, dst: int, kind: int, a: int, b: int, c: int, payload: int, ecn: int = ECT0) -> None:
            nonlocal emitted
            ids[src] = (ids[src] + 1) & 0xFFFF
            emit((t, kind, src, dst, sport, ROCE_PORT, ids[src], ecn, a, b & 0xFFFFFF, c, 0, payload))
            emitted += 1

        while emitted < packets:
            position = i % MIX_MESSAGE
            kind = _FIRST if position == 0 else _LAST if position == MIX_MESSAGE - 1 else _MIDDLE
            asks = position == MIX_MESSAGE - 1 or (i + 1) % MIX_ACK_EVERY == 0
            t += 1_400 + (200_000 if position == 0 else 0)  # a message, then a pause (compute between chunks)
            if i in loss:
                loss.discard(i)
                if sent_here:
                    packet(requester, responder, kind, qp, psn + i, int(asks), ROCE_MTU)
                for k in range(1, MIX_WINDOW + 1):  # sent on before the NAK comes back; the responder drops them
                    t += 1_400
                    after = (i + k) % MIX_MESSAGE
                    later = _FIRST if after == 0 else _LAST if after == MIX_MESSAGE - 1 else _MIDDLE
                    packet(requester, responder, later, qp, psn + i + k, 0, ROCE_MTU)
                t += 3_000
                packet(responder, requester, _RESPONSE, qp + 1, psn + i, NAK_PSN_SEQUENCE << 24 | msn, 0)
                t += 2_000
                continue  # go back to packet i
            mark = CE if congested[i] else ECT0
            packet(requester, responder, kind, qp, psn + i, int(asks), ROCE_MTU, mark)
            if position == MIX_MESSAGE - 1:
                msn += 1
            if mark == CE:
                packet(responder, requester, _CNP, qp + 1, 0, 0, 0)
            if asks:
                t += 2_500
                packet(responder, requester, _RESPONSE, qp + 1, psn + i, ACK_CREDITS << 24 | msn, 0)
            i += 1

    def tcp(self, client: int, server: int, port: int, packets: int, start_ns: int, bulk: bool) -> None:
        """A connection sending `packets` frames' worth of data one way, ACKed every second segment: bulk
        segments of 1 to 4 MSS (a host's capture sees TSO's and GRO's merged frames), or small messages.
        A segment lost after the capture point is answered by three duplicate ACKs with SACK, then
        resent."""
        emit, rng = self.rows.append, self.rng
        self.starts.append(len(self.rows))
        t, seq, ack, ids = start_ns, 1_000_000 + port, 5_000_000, {client: 0, server: 0}
        sizes = rng.choice([1, 1, 1, 1, 2, 4], packets) * TCP_MSS if bulk else rng.integers(40, 400, packets)
        loss = rng.random(packets) < (1 / 5_000 if bulk else 0)
        emitted = 0

        def segment(src: int, dst: int, kind: int, a: int, b: int, payload: int, sack: tuple = (0, 0)) -> None:
            nonlocal emitted
            ids[src] = (ids[src] + 1) & 0xFFFF
            sport, dport = (port, 5201) if src == client else (5201, port)
            left, right = (edge & 0xFFFFFFFF for edge in sack)
            emit((t, kind, src, dst, sport, dport, ids[src], 0, a & 0xFFFFFFFF, b & 0xFFFFFFFF, left, right, payload))
            emitted += 1

        for k in range(packets):
            if emitted >= packets:
                break
            size = int(sizes[k])
            t += 8_000 if bulk else 400_000
            segment(client, server, _TCP_DATA, seq, ack, size)
            if loss[k]:
                lost_seq = seq
                for _ in range(3):  # the next segments arrive; each is answered by a duplicate ACK
                    seq += size
                    t += 8_000
                    segment(client, server, _TCP_DATA, seq, ack, size)
                    t += 30_000
                    segment(server, client, _TCP_SACK, ack, lost_seq, 0, (lost_seq + size, seq + size))
                t += 5_000
                segment(client, server, _TCP_DATA, lost_seq, ack, size)  # the fast retransmission
                seq += size
                t += 30_000
                segment(server, client, _TCP_ACK, ack, seq, 0)
                continue
            seq += size
            if k % 2 or not bulk:
                t += 30_000
                segment(server, client, _TCP_ACK, ack, seq, 0)


def write_mix(path: Path, packets: int = 1_000_000, seed: int = 7) -> dict:
    """A capture of about `packets` full frames (snaplen MIX_SNAPLEN) as tcpdump on a training node's
    interface writes it: eight RoCEv2 RC QPs (RDMA WRITEs of 4 KiB packets and their ACKs; four QPs
    this node writes on, four it is written to; a lost packet now and then, answered by a NAK and a
    go-back-N resend, and ECN-CE marks answered by CNPs), two bulk TCP connections (merged segments
    of up to 4 x 8948 bytes, ACKs every second segment, a loss now and then fast-retransmitted after
    duplicate ACKs with SACK) and two connections of small messages. Deterministic for a `seed`.
    Returns the number of records written."""
    flows = _MixFlows(seed)
    node, peers = _hosts(0, np.array([0]))[0], _hosts(0, np.arange(1, 5))
    roce, tcp = int(packets * 0.86) // 8, int(packets * 0.12) // 2
    for q in range(8):
        peer, sent_here = int(peers[q % 2]), q < 4  # writes to the next node, written to by the one before
        requester, responder = (node, peer) if sent_here else (peer, node)
        flows.roce_qp(int(requester), int(responder), 0x100 + 2 * q, roce, q * 333, sent_here)
    for c in range(2):
        flows.tcp(int(node), int(peers[2 + c]), 40_000 + c, tcp, c * 777, bulk=True)
        flows.tcp(int(node), int(peers[2 + c]), 29_500 + c, max(packets // 100, 10), 50_000 + c, bulk=False)
    rows = np.array(flows.rows, np.int64)
    span = packets * 1_000  # every flow spread over the same time: a frame per microsecond in all
    for first, last in itertools.pairwise(flows.starts + [len(rows)]):
        t = rows[first:last, 0]
        rows[first:last, 0] = t[0] + (t - t[0]) * span // max(int(t[-1] - t[0]), 1)
    rows = rows[np.argsort(rows[:, 0], kind="stable")][:packets]  # merged in time; each flow in its own order
    _write_mix(path, {name: rows[:, k] for k, name in enumerate(_MIX_FIELDS)})
    return len(rows)


def _write_mix(path: Path, rec: dict[str, np.ndarray]) -> None:
    """Write the records as a classic pcap (microseconds, Ethernet), a million at a time."""
    kinds = _mix_kinds()
    header_len = np.array([len(k.header) for k in kinds])
    trailer = np.array([k.trailer for k in kinds])
    with path.open("wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, MIX_SNAPLEN, 1))
        for first in range(0, len(rec["kind"]), MULTIFLOW_CHUNK):
            part = {name: values[first : first + MULTIFLOW_CHUNK] for name, values in rec.items()}
            out.write(_mix_records(part, kinds, header_len, trailer).data)


def _mix_records(
    rec: dict[str, np.ndarray], kinds: list[_MixKind], header_len: np.ndarray, trailer: np.ndarray
) -> np.ndarray:
    kind, n = rec["kind"], len(rec["kind"])
    wire = header_len[kind] + rec["payload"] + trailer[kind]
    starts = np.concatenate([[0], np.cumsum(16 + wire)[:-1]])
    out = np.full(int((16 + wire).sum()), 0x5A, np.uint8)  # payload bytes
    usec = rec["t_ns"] // 1000 + int(START) * 1_000_000
    header = np.stack([usec // 1_000_000, usec % 1_000_000, wire, wire], axis=1).astype("<u4")
    out[starts[:, None] + np.arange(16)] = header.view(np.uint8).reshape(n, 16)
    frame = starts + 16
    for k, shape in enumerate(kinds):
        rows = np.flatnonzero(kind == k)
        body = np.frombuffer(shape.header, np.uint8)
        out[(frame[rows])[:, None] + np.arange(len(body))] = body
    roce, tcp = np.flatnonzero(kind < _TCP_DATA), np.flatnonzero(kind >= _TCP_DATA)
    ip_len = wire - _IP_AT
    _patch(out, frame + _IP_AT + 1, rec["ecn"], 1)
    _patch(out, frame + _IP_AT + 2, ip_len, 2)
    _patch(out, frame + _IP_AT + 4, rec["ip_id"], 2)
    _patch(out, frame + _IP_AT + 12, rec["src"], 4)
    _patch(out, frame + _IP_AT + 16, rec["dst"], 4)
    _patch(out, frame + _L4_AT, rec["sport"], 2)
    _patch(out, frame + _L4_AT + 2, rec["dport"], 2)
    at = frame[roce] + _L4_AT
    _patch(out, at + 4, ip_len[roce] - 20, 2)  # UDP length
    _patch(out, at + 8 + 5, rec["a"][roce], 3)  # destination QP
    _patch(out, at + 8 + 9, rec["b"][roce], 3)  # PSN
    data = roce[kind[roce] <= _LAST]
    out[frame[data] + _L4_AT + 8 + 8] = (rec["c"][data] << 7).astype(np.uint8)  # AckReq
    response = roce[kind[roce] == _RESPONSE]
    _patch(out, frame[response] + _L4_AT + 8 + 12, rec["c"][response], 4)  # AETH: syndrome, MSN
    at = frame[tcp] + _L4_AT
    _patch(out, at + 4, rec["a"][tcp], 4)
    _patch(out, at + 8, rec["b"][tcp], 4)
    sacked = tcp[kind[tcp] == _TCP_SACK]
    options = frame[sacked] + _L4_AT + 20 + 12 + 2  # past the timestamps and two NOPs: kind, length, edges
    _patch(out, options + 2, rec["c"][sacked], 4)
    _patch(out, options + 6, rec["d"][sacked], 4)
    return out
