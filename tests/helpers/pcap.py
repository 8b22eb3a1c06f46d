"""Captures for tests: a RoCE frame, a classic pcap and pcapng sections written byte by byte, and a capture
read back."""

from __future__ import annotations

import struct
from pathlib import Path

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from synth import pcap as synth
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap

T0 = synth.START


def roce(psn: int = 7, opcode: int = 4, **ip) -> Ether:
    return (
        Ether()
        / IP(src="10.0.0.1", dst="10.0.0.2", tos=2, **ip)
        / UDP(sport=69, dport=4791)
        / BTH(opcode=opcode, dqpn=0x48, psn=psn, ackreq=1)
        / Raw(b"x" * 64)
    )


def classic(
    path: Path,
    frames: list[bytes],
    linktype: int = 1,
    nano: bool = False,
    little: bool = True,
    caplen: int | None = None,
) -> Path:
    """A classic pcap written byte by byte (so tests control caplen, byte order and resolution)."""
    order = "<" if little else ">"
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for i, frame in enumerate(frames):
        kept = frame[:caplen] if caplen else frame
        frac = 123_456_789 if nano else 123_456
        out += struct.pack(order + "IIII", int(T0) + i, frac, len(kept), len(frame)) + kept
    path.write_bytes(out)
    return path


def read(path: Path):
    result = pcap.ingest(InputFile(path, path.name, "pcap"))
    return result.tables.get("packets"), result.account


def block(order: str, kind: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    return struct.pack(order + "II", kind, len(body) + 12) + body + struct.pack(order + "I", len(body) + 12)


def section(order: str, interfaces: list[tuple[int, int, int | None]], packets: list[tuple[int, int, bytes]]) -> bytes:
    """SHB, IDBs (linktype, snaplen, if_tsresol byte or None), then EPBs (interface, units, frame)."""
    out = block(order, 0x0A0D0D0A, struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1))
    for linktype, snaplen, resol in interfaces:
        options = b"" if resol is None else struct.pack(order + "HHB3x", 9, 1, resol) + struct.pack(order + "HH", 0, 0)
        out += block(order, 1, struct.pack(order + "HHI", linktype, 0, snaplen) + options)
    for iface, units, frame in packets:
        head = struct.pack(order + "IIIII", iface, units >> 32, units & 0xFFFFFFFF, len(frame), len(frame))
        out += block(order, 6, head + frame)
    return out
