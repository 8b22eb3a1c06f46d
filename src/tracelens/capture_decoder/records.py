"""The record stream of a pcap or pcapng file: where each captured frame lies, when, on which link.

Only the walk from one record to the next is sequential (a record's length
says where the next one starts), so that walk is the one Python step
(CaptureReader.walk): a comprehension reading a single length per record, whose
results numpy checks for the whole chunk at once (a record-by-record walk takes
over only where something is wrong, or at a pcapng section's headers). It says
where a chunk's records start (Walked), and may run in a process of its own
(tracelens.capture_decoder.walker). Everything else about a record (time, lengths,
interface) is gathered afterwards with numpy from the memory-mapped file, a
chunk of records at a time (CaptureReader.records): memory follows the chunk,
not the file.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracelens.capture_decoder.gather import ByteView, field

PCAP_MAGICS = {  # magic as stored -> (byte order, nanoseconds per timestamp fraction unit)
    b"\xd4\xc3\xb2\xa1": ("<", 1000),
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
PCAPNG_BOM = 0x1A2B3C4D

PCAP_HEADER = 24
PCAP_RECORD_HEADER = 16
CHUNK_RECORDS = 1 << 18  # records of a chunk at most: about 80 MB of decoded columns at once
CHUNK_BYTES = 128 << 20  # bytes of file a chunk spans at most: its pages stay mapped while it is decoded
PROBE_RECORDS = 1 << 12  # records read to guess how many a capture holds
MAX_CAPLEN = 1 << 24  # a record claiming more is corruption, not a packet
# A record header of zeros: where a capture runs into a hole or blocks never written. Read as an empty
# record it would lead to the next 16 zero bytes, and on through every byte of the zeros.
BLANK_RECORD = bytes(PCAP_RECORD_HEADER)
_ZERO_SCAN = 16 << 20  # bytes of a file's tail looked at at once for data after its last record

# pcapng block types
_SHB, _IDB, _PB, _SPB, _EPB = 0x0A0D0D0A, 1, 2, 3, 6
_OPT_TSRESOL, _OPT_TSOFFSET = 9, 14


class CaptureError(ValueError):
    """The file is not a capture this reader understands (the message says why)."""


@dataclass
class Records:
    """One chunk of captured frames, as columns."""

    frame: np.ndarray  # 1-based frame number in the file, as Wireshark counts
    offset: np.ndarray  # where the frame's captured bytes start in the file
    caplen: np.ndarray  # bytes captured
    origlen: np.ndarray  # bytes on the wire
    ts_ns: np.ndarray  # nanoseconds since the epoch
    ts_valid: np.ndarray  # False where the block carries no time (pcapng simple packet blocks)
    linktype: np.ndarray  # LINKTYPE_* of the frame's interface, -1 if the interface is unknown

    def __len__(self) -> int:
        return len(self.frame)


def mapped(path: Path) -> mmap.mmap:
    """The capture at `path` mapped read-only, read ahead of the walk: it goes through the file once, in
    order, and a capture of full-size frames touches every page of it."""
    with path.open("rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    mapping.madvise(mmap.MADV_SEQUENTIAL)
    return mapping


def is_capture(head: bytes) -> bool:
    """Whether `head` starts a pcap or pcapng file."""
    if head[:4] in PCAP_MAGICS:
        return True
    return head[:4] == PCAPNG_SHB and len(head) >= 12 and head[8:12] in (b"\x1a\x2b\x3c\x4d", b"\x4d\x3c\x2b\x1a")


@dataclass
class Walked:
    """Where one chunk's records start, as the walk found them (what Records are gathered from)."""

    starts: np.ndarray  # pcap: each record's header; pcapng: each packet block (int64)
    kinds: np.ndarray  # pcapng: each block's type (int8); empty for pcap
    before: int  # frames of the file before this chunk
    order: str  # byte order of the section ("<" or ">")
    interfaces: list[Interface]  # pcapng: the section's interfaces; empty for pcap
    notes: list[str]  # what the walk noted since the previous chunk (a cut record ...)
    padding: int = 0  # zero bytes the file ends in after its last record, once the walk is there


@dataclass
class Interface:
    """A pcapng interface description: its link type, snapshot length and clock."""

    linktype: int
    snaplen: int
    resol_base: int = 10  # timestamp unit is resol_base ** -resol_exp seconds
    resol_exp: int = 6
    offset_s: int = 0

    def to_ns(self, units: np.ndarray) -> np.ndarray:
        if self.resol_base == 2:
            whole = units >> self.resol_exp
            frac = units & ((1 << self.resol_exp) - 1)
            ns = whole * 1_000_000_000 + ((frac * 1_000_000_000) >> self.resol_exp)
        elif self.resol_exp <= 9:
            ns = units * 10 ** (9 - self.resol_exp)
        else:
            ns = units // 10 ** (self.resol_exp - 9)
        return ns + self.offset_s * 1_000_000_000


class CaptureReader:
    """Walks a capture held in `data` (a uint8 array, usually a memory map) chunk by chunk.

    `notes` collects what the reader had to stop at or skip (a record cut
    mid-way, a corrupt length), each as one sentence without the file name.
    """

    def __init__(self, data: np.ndarray, path: Path | None = None) -> None:
        self.data = data
        self.path = path  # the file `data` maps, if any: its holes are known zeros, not read
        self.view = ByteView(data)
        self.notes: list[str] = []
        self.linktypes: set[int] = set()
        head = bytes(data[:12])
        if head[:4] in PCAP_MAGICS:
            self.kind = "pcap"
            if len(data) < PCAP_HEADER:
                raise CaptureError(f"pcap file header cut short ({len(data)} of {PCAP_HEADER} bytes)")
            order = PCAP_MAGICS[head[:4]][0]
            self.linktype = struct.unpack_from(order + "I", data.data, 20)[0] & 0x0FFFFFFF  # upper bits: FCS length
            self.linktypes.add(self.linktype)
        elif is_capture(head):
            self.kind = "pcapng"
        elif not head:
            raise CaptureError("empty file")
        else:
            raise CaptureError(f"not a pcap or pcapng file (starts with {head[:4].hex()})")
        self.walk_notes: list[str] = []  # what the walk noted: each chunk it hands out carries the new ones
        self._noted = 0
        self.padding = 0

    def chunks(self) -> Iterator[Records]:
        """The frames of the capture in file order, CHUNK_RECORDS at a time."""
        for walked in self.walk():
            self.notes.extend(walked.notes)
            if len(walked.starts):
                yield self.records(walked)

    def walk(self, first: int | None = None) -> Iterator[Walked]:
        """Where the capture's records start, a chunk at a time: CHUNK_RECORDS records, or fewer where they
        span more than CHUNK_BYTES (`first`: the first chunk's records at most); what the walk notes (a
        cut or corrupt record) comes with the chunk it was noted in, or in a last one without records."""
        first = min(first or CHUNK_RECORDS, CHUNK_RECORDS)
        yield from self._pcap(first) if self.kind == "pcap" else self._pcapng(first)
        if len(self.walk_notes) > self._noted or self.padding:
            yield self._walked(np.zeros(0, np.int64), np.zeros(0, np.int8), 0, "<", [])

    @staticmethod
    def _chunk_records(frames: int, walked: int, first: int) -> int:
        """Records of the next chunk, after `frames` records in `walked` bytes: those of about CHUNK_BYTES
        of file, as the records so far go (a capture of full-size frames spans gigabytes in a few hundred
        thousand records); the walk stops a chunk at CHUNK_BYTES anyway."""
        if not frames:
            return first
        return max(1, min(CHUNK_RECORDS, CHUNK_BYTES * frames // max(walked, 1)))

    def estimated_records(self) -> int:
        """About how many records the capture holds, from the bytes of its first ones."""
        # a reader of its own: this one's notes stay as they are
        first = next(CaptureReader(self.data, self.path).walk(PROBE_RECORDS), None)
        if first is None or len(first.starts) < 2:
            return len(first.starts) if first is not None else 0
        per_record = (int(first.starts[-1]) - int(first.starts[0])) / (len(first.starts) - 1)
        return int(len(self.data) / per_record)

    def _walked(self, starts: np.ndarray, kinds: np.ndarray, before: int, order: str, interfaces: list) -> Walked:
        noted, self._noted = self.walk_notes[self._noted :], len(self.walk_notes)
        return Walked(starts, kinds, before, order, list(interfaces), noted, self.padding)

    def _padded(self, pos: int) -> bool:
        """Whether the file is zeros from `pos` to its end (what a capture preallocated, or copied onto
        a padded medium, ends in); if so they are the capture's `padding`, not a record cut short."""
        if not _zeros_to_end(self.data, self.path, pos):
            return False
        self.padding = len(self.data) - pos
        return True

    def records(self, walked: Walked) -> Records:
        """The columns of a chunk's records, gathered from the file where the walk found them."""
        if self.kind == "pcap":
            order, frac_ns = PCAP_MAGICS[bytes(self.data[:4])]
            return self._pcap_records(walked.starts, walked.before, order == "<", frac_ns, self.linktype)
        return self._pcapng_records(walked.starts, walked.kinds, walked.before, walked.order, walked.interfaces)

    def _zeros(self, pos: int, kept: int) -> None:
        """Zeros where a record's header should be at `pos`: the file's padding if nothing but zeros
        follows, else a hole in the middle of the capture."""
        if not self._padded(pos):
            self.walk_notes.append(
                f"record at byte {pos} (frame {kept + 1}) is all zeros (a hole, or blocks never written), not a "
                f"packet, so the file is corrupt from there; kept the {kept} packets before it"
            )

    def _cut(self, pos: int, frames: int) -> None:
        self.walk_notes.append(
            f"capture cut mid-record at byte {pos} (frame {frames + 1}); kept the {frames} whole packets before it"
        )

    def _pcap(self, first: int) -> Iterator[Walked]:
        data = self.data
        order = PCAP_MAGICS[bytes(data[:4])][0]
        caplen_at = struct.Struct(order + "I").unpack_from
        pos, frames, finished = PCAP_HEADER, 0, False
        while not finished:
            count = self._chunk_records(frames, pos - PCAP_HEADER, first)
            heads, pos, finished = self._walk_pcap(data.data, pos, frames, caplen_at, count)
            if len(heads):
                yield self._walked(heads, np.zeros(0, np.int8), frames, order, [])
                frames += len(heads)

    def _walk_pcap(self, raw: memoryview, pos: int, frames: int, caplen_at, count: int) -> tuple[np.ndarray, int, bool]:
        """Up to `count` record positions from `pos`; where the walk stopped, and whether at the end.

        The chain itself (each record's captured length says where the next starts) is one tight
        comprehension; what a record must satisfy (a sane length, inside the file, a header that is
        not all zeros) is checked afterwards for the whole chunk at once with numpy. Only where that
        finds something wrong, or at the end of the file, does the record-by-record walk take over
        to say what it is.
        """
        last_header = len(raw) - PCAP_RECORD_HEADER
        limit = min(last_header, pos + CHUNK_BYTES)
        p = pos
        ends = [p := p + PCAP_RECORD_HEADER + caplen_at(raw, p + 8)[0] for _ in range(count) if p <= limit]
        nexts = np.array(ends, np.int64)
        heads = np.concatenate([[pos], nexts[:-1]]) if len(ends) else nexts
        caplen = nexts - heads - PCAP_RECORD_HEADER
        bad = (caplen > MAX_CAPLEN) | (nexts > len(raw))
        if (empty := np.flatnonzero(caplen == 0)).size:
            header = self.view.block(heads[empty], PCAP_RECORD_HEADER)
            bad[empty] = (field(header, 0, 8) == 0) & (field(header, 8, 8) == 0)
        wrong = np.flatnonzero(bad)
        good = int(wrong[0]) if len(wrong) else len(ends)
        heads, pos = heads[:good], int(nexts[good - 1]) if good else pos
        if good == len(ends) and (good == count or pos <= last_header):  # every record sound, the file goes on
            return heads, pos, False
        tail = array("q")
        pos = self._walk_pcap_checked(raw, pos, tail, frames + good, caplen_at)
        return np.concatenate([heads, np.frombuffer(tail, np.int64)]), pos, True

    def _walk_pcap_checked(self, raw: memoryview, pos: int, starts: array, frames: int, caplen_at) -> int:
        """Record by record from `pos` to the end of the file or the first record that cannot be read
        (noted); the positions go to `starts`. Return where it stopped."""
        size, append = len(raw), starts.append
        last_header = size - PCAP_RECORD_HEADER
        while True:
            if pos > last_header:  # the end, or a record header cut short
                if pos != size and not self._padded(pos):
                    self._cut(pos, frames + len(starts))
                return pos
            caplen = caplen_at(raw, pos + 8)[0]
            end = pos + PCAP_RECORD_HEADER + caplen
            blank = caplen == 0 and raw[pos:end] == BLANK_RECORD
            if end <= size and caplen <= MAX_CAPLEN and not blank:  # the usual record
                append(pos)
                pos = end
                continue
            if blank:
                self._zeros(pos, frames + len(starts))
                return pos
            if caplen > MAX_CAPLEN:
                kept = frames + len(starts)
                order = caplen_at.__self__.format[0]
                other = ">" if order == "<" else "<"
                swapped = struct.unpack_from(other + "I", raw, pos + 8)[0]
                # the header's own version (2.4) says whether its byte order is its records': blame
                # the order only when the header reads right the other way round
                header_swapped = (
                    struct.unpack_from(order + "HH", raw, 4) != (2, 4) == struct.unpack_from(other + "HH", raw, 4)
                )
                why = (
                    "the file header's byte order does not match its records' (the header says "
                    f"{'little' if order == '<' else 'big'}-endian; the records read as the "
                    "other), so no packet can be read: the capture was damaged or its header rewritten"
                    if kept == 0 and swapped <= MAX_CAPLEN and header_swapped
                    else (
                        f"record at byte {pos} (frame {kept + 1}) claims {caplen:,} captured bytes, more than a "
                        f"packet can hold ({MAX_CAPLEN:,}), so the file is corrupt from there"
                    )
                )
                self.walk_notes.append(f"{why}; kept the {kept} packets before it")
                return pos
            self._cut(pos, frames + len(starts))
            return pos

    def _pcap_records(self, heads: np.ndarray, before: int, little: bool, frac_ns: int, linktype: int) -> Records:
        header = self.view.block(heads, PCAP_RECORD_HEADER)  # seconds, fraction, captured and wire lengths
        sec, frac = field(header, 0, 4, little), field(header, 4, 4, little)
        return Records(
            frame=np.arange(before + 1, before + 1 + len(heads), dtype=np.int64),
            offset=heads + PCAP_RECORD_HEADER,
            caplen=field(header, 8, 4, little),
            origlen=field(header, 12, 4, little),
            ts_ns=sec * 1_000_000_000 + frac * frac_ns,
            ts_valid=np.ones(len(heads), bool),
            linktype=np.full(len(heads), linktype, np.int64),
        )

    def _pcapng(self, first: int) -> Iterator[Walked]:
        data, size = self.data, len(self.data)
        raw = data.data  # the array's buffer as a memoryview
        pos, frames = 0, 0
        order = "<"
        interfaces: list[Interface] = []
        starts, kinds = array("q"), array("b")
        held: tuple[str, list[Interface]] = (order, interfaces)  # the section the records in `starts` are of
        while pos < size:
            if pos + 12 > size:
                if not self._padded(pos):
                    self._cut(pos, frames + len(starts))
                break
            if bytes(raw[pos : pos + 4]) == PCAPNG_SHB:
                bom = struct.unpack_from("<I", raw, pos + 8)[0]
                order, interfaces = ("<" if bom == PCAPNG_BOM else ">"), []
            btype, blen = struct.unpack_from(order + "II", raw, pos)
            if btype == blen == 0:
                self._zeros(pos, frames + len(starts))
                break
            if blen < 12 or blen % 4 or pos + blen > size:
                self._cut(pos, frames + len(starts))
                break
            if btype == _IDB:
                interfaces.append(self._interface(raw, pos, blen, order))
            elif btype in (_EPB, _SPB, _PB):
                # a new section's records join the chunk unless its byte order or interfaces differ:
                # captures concatenated with `cat` are thousands of sections of one interface
                if starts and held != (order, interfaces):
                    yield self._walked(*_arrays(starts, kinds), frames, *held)
                    frames += len(starts)
                    starts, kinds = array("q"), array("b")
                held = (order, interfaces)
                starts.append(pos)
                kinds.append(btype)
                count, limit = self._chunk_records(frames, starts[0], first), starts[0] + CHUNK_BYTES
                heads, types, pos = self._packet_blocks(raw, pos + blen, order, count - len(starts), limit)
                starts.frombytes(heads.tobytes())
                kinds.frombytes(types.astype(np.int8).tobytes())
                if len(starts) >= count or pos > limit:
                    yield self._walked(*_arrays(starts, kinds), frames, *held)
                    frames += len(starts)
                    starts, kinds = array("q"), array("b")
                continue
            pos += blen
        if starts:
            yield self._walked(*_arrays(starts, kinds), frames, *held)

    def _packet_blocks(
        self, raw: memoryview, pos: int, order: str, room: int, limit: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The packet blocks that follow from `pos` (up to `room`, starting at `limit` at the latest): where
        each starts, its type, and where the run of them ends. The run stops before the first block that
        is not a sound packet block (a section header, an interface, a cut block), left to the
        block-by-block walk. It is followed in steps growing fourfold: the blocks a step follows past the
        run's end are work thrown away, and a capture of many short sections (captures joined with `cat`)
        would pay for every block after each section's first packet."""
        heads, types, step = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 16
        while room > 0:
            run, kinds, end, whole = self._packet_run(raw, pos, order, min(step, room), limit)
            heads.append(run)
            types.append(kinds)
            room, pos, step = room - len(run), end, step * 4
            if not whole:
                break
        return np.concatenate(heads), np.concatenate(types), pos

    def _packet_run(
        self, raw: memoryview, pos: int, order: str, count: int, limit: int
    ) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Up to `count` packet blocks from `pos` (see _packet_blocks), and whether all `count` were
        sound. As for pcap records, the chain of block lengths is one comprehension and the checks are
        numpy's."""
        length_at = struct.Struct(order + "I").unpack_from
        last = min(len(raw) - 12, limit)
        p = pos
        ends = [p := p + length_at(raw, p + 4)[0] for _ in range(count) if p <= last]
        nexts = np.array(ends, np.int64)
        heads = np.concatenate([[pos], nexts[:-1]]).astype(np.int64) if len(ends) else nexts
        length = nexts - heads
        types = field(self.view.block(heads, 4), 0, 4, order == "<")
        sound = (length >= 12) & (length % 4 == 0) & (nexts <= len(raw)) & np.isin(types, (_EPB, _SPB, _PB))
        good = int(np.argmin(sound)) if not sound.all() else len(ends)
        end = int(nexts[good - 1]) if good else pos
        return heads[:good], types[:good], end, good == len(ends) == count

    @staticmethod
    def _interface(raw: memoryview, pos: int, blen: int, order: str) -> Interface:
        linktype, _, snaplen = struct.unpack_from(order + "HHI", raw, pos + 8)
        iface = Interface(linktype, snaplen)
        opt, end = pos + 16, pos + blen - 4
        while opt + 4 <= end:
            code, length = struct.unpack_from(order + "HH", raw, opt)
            if code == 0:
                break
            if code == _OPT_TSRESOL and length >= 1:
                resol = raw[opt + 4]
                iface.resol_base, iface.resol_exp = (2, resol & 0x7F) if resol & 0x80 else (10, resol)
            elif code == _OPT_TSOFFSET and length >= 8:
                iface.offset_s = struct.unpack_from(order + "q", raw, opt + 4)[0]
            opt += 4 + (length + 3) // 4 * 4
        return iface

    def _pcapng_records(
        self, block: np.ndarray, kind: np.ndarray, before: int, order: str, interfaces: list[Interface]
    ) -> Records:
        little = order == "<"
        simple = kind == _SPB
        timed = np.flatnonzero(~simple)  # enhanced and obsolete packet blocks: same layout, interface id width aside
        iface_id = np.zeros(len(block), np.int64)
        units = np.zeros(len(block), np.int64)
        header = self.view.block(block, 28)  # type, length, then a simple block's length or the timed blocks' fields
        length = field(header, 4, 4, little)
        origlen = field(header, 8, 4, little)  # right for simple blocks, replaced below for the others
        caplen = np.minimum(origlen, length - 16)
        timed_header = header[timed]
        iface_id[timed] = np.where(
            kind[timed] == _PB, field(timed_header, 8, 2, little), field(timed_header, 8, 4, little)
        )
        units[timed] = (field(timed_header, 12, 4, little) << 32) | field(timed_header, 16, 4, little)
        origlen[timed] = field(timed_header, 24, 4, little)
        caplen[timed] = np.minimum(field(timed_header, 20, 4, little), length[timed] - 32)
        ts_ns = np.zeros(len(block), np.int64)
        linktype = np.full(len(block), -1, np.int64)
        for i in np.unique(iface_id):
            mine = iface_id == i
            if i >= len(interfaces):
                self.notes.append(f"{int(mine.sum())} packets name interface {i}, which the file never describes")
                continue
            iface = interfaces[i]
            self.linktypes.add(iface.linktype)
            linktype[mine] = iface.linktype
            ts_ns[mine] = iface.to_ns(units[mine])
            if iface.snaplen:
                caplen[mine & simple] = np.minimum(caplen[mine & simple], iface.snaplen)
        return Records(
            frame=np.arange(before + 1, before + 1 + len(block), dtype=np.int64),
            offset=block + np.where(simple, 12, 28),
            caplen=np.maximum(caplen, 0),
            origlen=origlen,
            ts_ns=ts_ns,
            ts_valid=~simple,
            linktype=linktype,
        )


def _zeros_to_end(data: np.ndarray, path: Path | None, pos: int) -> bool:
    """Whether `data` is all zeros from `pos` on. Where it maps the file at `path`, only the file's
    data is read: a hole (a sparse file's terabyte that takes no disk) is zeros without a look."""
    fd = os.open(path, os.O_RDONLY) if path is not None else -1
    try:
        at, size = pos, len(data)
        while at < size:
            end = size
            if fd >= 0:
                try:
                    at = os.lseek(fd, at, os.SEEK_DATA)
                    end = min(size, os.lseek(fd, at, os.SEEK_HOLE))
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole from here
                        return True
                    os.close(fd)  # a file system that cannot tell: every byte is read
                    fd = -1
            for start in range(at, end, _ZERO_SCAN):
                if np.any(data[start : min(start + _ZERO_SCAN, end)]):
                    return False
            at = end
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def _arrays(starts: array, kinds: array) -> tuple[np.ndarray, np.ndarray]:
    return np.frombuffer(starts, np.int64), np.frombuffer(kinds, np.int8)
