"""Decode a chunk of captured frames into `packets` rows, a protocol layer at a time for all frames at once.

Each layer computes, for every frame, where the next header starts and what it
is, copies that header out of the file with one gather and reads its fields
from the copy (`gather`). A field that lies past a frame's captured end
(snaplen truncation) is null; the fields before it are kept. Layers:

- link: Ethernet and Linux cooked v1 (113) and v2 (276), each with up to two VLAN tags,
  raw IP (101, 228, 229, and DLT_RAW 12/14), IPoIB (242), ERF (197) carrying
  Ethernet or native InfiniBand, native InfiniBand (247);
- network: IPv4 (first fragments only carry transport headers), IPv6 (with
  hop-by-hop, routing, destination-options and fragment headers), RoCEv1
  (ethertype 0x8915, a GRH), the InfiniBand LRH (+GRH);
- transport: TCP (seq, ack, flags, window, payload length, the first SACK
  block), UDP, and RoCEv2 by UDP destination port 4791 only;
- InfiniBand transport: BTH (opcode, destination QP, PSN, ack request,
  FECN/BECN) and the AETH (syndrome, MSN) of RC responses.
"""

from __future__ import annotations

import functools
import ipaddress

import numpy as np
import polars as pl
import pyarrow as pa

from tracelens.capture_decoder.columns import Column
from tracelens.capture_decoder.gather import ByteView, field, raw
from tracelens.capture_decoder.records import Records

# Link types (LINKTYPE_*)
ETHERNET, SLL, ERF, IPOIB, INFINIBAND, SLL2 = 1, 113, 197, 242, 247, 276
RAW_IP = (12, 14, 101, 228, 229)

# What a frame's network header is: an ethertype, or one of these pseudo-types.
IB_LRH = -2  # native InfiniBand local route header
NO_NETWORK = -1  # unknown link type, or the link header itself was cut off
ETH_IPV4, ETH_IPV6, ETH_ARP, ETH_ROCEV1 = 0x0800, 0x86DD, 0x0806, 0x8915
VLAN_TPIDS = (0x8100, 0x88A8, 0x9100)
ERF_ETH, ERF_INFINIBAND = 2, 21

IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMPV6 = 1, 6, 17, 58
IPV6_EXTENSIONS = (0, 43, 60)  # hop-by-hop, routing, destination options: (len + 1) * 8 bytes
IPV6_FRAGMENT = 44
ROCE_PORT = 4791

BTH_LEN, AETH_LEN, ICRC_LEN, GRH_LEN, LRH_LEN = 12, 4, 4, 40, 8
TCP_OPT_SACK = 5

PROTOS = ("eth", "arp", "ip", "icmp", "tcp", "udp", "roce", "icmpv6", "ib")
_P = {name: code for code, name in enumerate(PROTOS)}

# Address families of the src/dst keys.
_V4, _V6, _LID = 4, 6, 1


def _bth_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per BTH opcode: bytes of extension headers after the BTH, and whether an AETH follows it directly."""
    rc = {3: 4, 5: 4, 6: 16, 9: 4, 10: 16, 11: 20, 12: 16, 13: 4, 15: 4, 16: 4, 17: 4, 18: 12, 19: 28, 20: 28}
    rc |= {22: 4, 23: 4}  # SEND with invalidate: IETH
    ext = np.zeros(256, np.int64)
    for op, size in rc.items():
        ext[op] = size
        if op <= 11:
            ext[0x20 + op] = size  # UC has the RC send and write opcodes
    ext[0x64], ext[0x65] = 8, 12  # UD SEND only (DETH), with immediate
    ext[0x80] = ext[0x81] = 16  # CNP: 16 reserved bytes
    aeth = np.zeros(256, bool)
    aeth[[0x0D, 0x0F, 0x10, 0x11, 0x12]] = True  # RC READ response first/last/only, ACK, ATOMIC ACK
    return ext, aeth


BTH_EXT_LEN, BTH_HAS_AETH = _bth_tables()

# Column name -> arrow type of the decoded values (beyond file/host/ts/ts_quality/src/dst/proto).
INT_COLUMNS = {
    "frame": pa.int64(),
    "sport": pa.int32(),
    "dport": pa.int32(),
    "length": pa.int32(),
    "ecn": pa.int8(),
    "ip_id": pa.int32(),
    "opcode": pa.int16(),
    "dest_qp": pa.int64(),
    "psn": pa.int64(),
    "syndrome": pa.int16(),
    "msn": pa.int64(),
    "seq": pa.int64(),
    "ack": pa.int64(),
    "flags": pa.int16(),
    "window": pa.int32(),
    "payload": pa.int32(),
    "sack_left": pa.int64(),
    "sack_right": pa.int64(),
    "digest": pa.int64(),
    "bucket": pa.int32(),
}
BOOL_COLUMNS = ("ack_req", "fecn", "becn")
# the numpy type of each column's values (by name: DataType.to_pandas_dtype imports pandas before pyarrow 26)
COLUMN_DTYPES = {
    name: np.dtype(f"{'int' if pa.types.is_signed_integer(kind) else 'uint'}{kind.bit_width}")
    for name, kind in INT_COLUMNS.items()
} | {name: np.dtype(bool) for name in BOOL_COLUMNS}
DIGEST_WORDS = 4  # the first 32 bytes of the transport header and payload identify a segment's bytes
HEAD_BYTES = 128  # a frame's first bytes, copied together when frames lie far apart: every usual header stack
SPARSE_BYTES = 512  # frames this far apart on average (bytes per record) lie far apart


class _Header:
    """A header of `size` bytes at `at` in frames `rows`, copied once: its fields are read from the copy."""

    def __init__(self, blocks: np.ndarray, room: np.ndarray) -> None:
        self.blocks = blocks
        self.room = room  # captured bytes from the header's start
        self.size = blocks.dtype.itemsize
        self.whole = not len(room) or int(room.min()) >= self.size  # the usual case: nothing cut off

    def select(self, keep: np.ndarray) -> _Header:
        """The headers of some of the frames (a mask or positions)."""
        return _Header(self.blocks[keep], self.room[keep])

    def read(self, offset: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The field of `width` bytes at `offset`; 0 and not valid where past the captured end."""
        values = field(self.blocks, offset, width)
        if self.whole:
            return values, np.ones(len(values), bool)
        valid = self.room >= offset + width
        return np.where(valid, values, 0), valid


class _Chunk:
    """One chunk's frames as seen by the decoder: bounded field reads and the output columns.

    Frames far apart in the file (full-size frames, not a few header bytes each) have their first
    HEAD_BYTES copied together first, with one gather: each gather from the file costs a cache and
    a TLB miss per frame, and the layers gather a dozen times, so the headers are read from the
    copy (a few MB) where they lie inside it, and from the file only where they do not."""

    def __init__(self, view: ByteView, rec: Records) -> None:
        self.view = view
        self.rec = rec
        self.n = len(rec)
        sparse = self.n and int(rec.offset[-1] - rec.offset[0]) >= SPARSE_BYTES * (self.n - 1)
        self.heads = ByteView(view.block(rec.offset, HEAD_BYTES).view(np.uint8)) if sparse else None
        self.end = rec.offset + rec.caplen
        self.values: dict[str, np.ndarray] = {}
        self.valid: dict[str, np.ndarray] = {}
        self.proto = np.full(self.n, -1, np.int64)
        self.addr = {
            side: (np.zeros(self.n, np.int8), np.zeros(self.n, np.uint64), np.zeros(self.n, np.uint64))
            for side in ("src", "dst")
        }

    def header(self, rows: np.ndarray, at: np.ndarray, size: int) -> _Header:
        """The `size` bytes at `at` of frames `rows`, copied from the file with one gather."""
        return _Header(self.block(rows, at, size), self.end[rows] - at)

    def block(self, rows: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
        """The `size` bytes at `at` (file offsets) of frames `rows`, from the copy of the frames'
        first bytes when every block lies inside it, else from the file: the same bytes either way."""
        if self.heads is not None and len(rows):
            inside = at - self.rec.offset[rows]
            if int(inside.min()) >= 0 and int(inside.max()) + size <= HEAD_BYTES:
                return self.heads.block(rows * HEAD_BYTES + inside, size)
        return self.view.block(at, size)

    def read(self, rows: np.ndarray, at: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """One field of `width` bytes (not 3) at `at` in frames `rows`; not valid where past the captured end."""
        return self.header(rows, at, width).read(0, width)

    def put(self, name: str, rows: np.ndarray, values: np.ndarray, valid: np.ndarray | bool = True) -> None:
        """Store `values` of frames `rows` in column `name`, in the column's type: a value that does not
        fit it (a damaged header's) is null, not wrapped."""
        if name not in self.values:
            self.values[name] = np.zeros(self.n, COLUMN_DTYPES[name])
            self.valid[name] = np.zeros(self.n, bool)
        column = self.values[name]
        if column.dtype != bool and not np.can_cast(values.dtype, column.dtype) and len(values):
            limits = np.iinfo(column.dtype)
            if values.min() < limits.min or values.max() > limits.max:  # a damaged header's value
                fits = (values >= limits.min) & (values <= limits.max)
                values, valid = np.where(fits, values, 0), valid & fits
        if len(rows) == self.n:  # every frame (rows are always ascending and distinct)
            column[:] = values
            self.valid[name][:] = valid
        else:
            column[rows] = values
            self.valid[name][rows] = valid

    def put_read(self, name: str, rows: np.ndarray, header: _Header, offset: int, width: int) -> np.ndarray:
        """Read a field of `header` and store it as column `name`; return the values (0 where not captured)."""
        if header.whole and width != 3:  # every frame has it: stored from the header as it is
            values = raw(header.blocks, offset, width)
            self.put(name, rows, values)
            return values
        values, valid = header.read(offset, width)
        self.put(name, rows, values, valid)
        return values

    def put_addr(self, side: str, rows: np.ndarray, family: int, hi: np.ndarray | int, lo: np.ndarray) -> None:
        fam, his, los = self.addr[side]
        fam[rows] = family
        his[rows] = hi
        los[rows] = lo


# What became of each frame.
PARSED, IGNORED, UNDECODABLE = 0, 1, 2


def decode(view: ByteView, rec: Records, buckets: int = 1) -> tuple[dict[str, Column], np.ndarray]:
    """Decode one chunk: the `packets` columns it fills, and each frame's status.

    PARSED: an IP, RoCE or InfiniBand header was read; IGNORED: another link-layer
    protocol (ARP, LLDP, ...); UNDECODABLE: unknown link type, or the network
    header is cut off or malformed. `bucket` is which of `buckets` the frame's
    unordered address pair falls in (_pair_bucket).
    """
    chunk = _Chunk(view, rec)
    net, nettype = _link(chunk)
    everything = np.arange(chunk.n)
    chunk.put("frame", everything, rec.frame)
    chunk.put("length", everything, rec.origlen)
    layers = {ETH_IPV4: _ipv4, ETH_IPV6: _ipv6, ETH_ROCEV1: _rocev1, IB_LRH: _lrh}
    for ethertype, layer in layers.items():
        rows = np.flatnonzero(nettype == ethertype)
        if len(rows):
            layer(chunk, rows, net[rows])
    status = np.where(chunk.proto >= 0, PARSED, UNDECODABLE)
    other = (nettype != NO_NETWORK) & ~np.isin(nettype, list(layers))
    status[other] = IGNORED
    chunk.proto[other] = _P["eth"]
    chunk.proto[nettype == ETH_ARP] = _P["arp"]
    return _columns(chunk, buckets), status


def _pair_bucket(chunk: _Chunk, src: np.ndarray, dst: np.ndarray, buckets: int) -> np.ndarray:
    """Which of `buckets` each frame falls in, the same both ways, whatever chunk the frame came in: by
    its two addresses (their hashes, _mix), so that every RoCE QP between two hosts lands in one bucket
    (a response names no data QP: it is paired with one among the hosts' QPs), and for TCP by its two
    ports as well, so that each connection lands in a bucket of its own (a capture of a socket
    transport between two hosts is many connections, not one bucket). The per-connection analysis
    reads a bucket at a time."""
    pair = src ^ dst
    tcp = np.flatnonzero((chunk.proto == _P["tcp"]) & chunk.valid.get("sport", False) & chunk.valid.get("dport", False))
    if tcp.size:
        ports = (chunk.values["sport"][tcp] ^ chunk.values["dport"][tcp]).astype(np.uint64)
        with np.errstate(over="ignore"):
            pair[tcp] += _mix(np.zeros(tcp.size, np.int8), ports, np.zeros(tcp.size, np.uint64))
    return (pair % np.uint64(buckets)).astype(np.int32)


def _mix(family: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """A well-spread 64-bit hash of an address (splitmix64's finalizer over its parts)."""
    with np.errstate(over="ignore"):
        x = (family.astype(np.uint64) << np.uint64(56)) ^ hi.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ lo
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = (x ^ (x >> np.uint64(shift))) * np.uint64(factor)
    return x ^ (x >> np.uint64(31))


# -- link layer ---------------------------------------------------------------------------------


def _link(chunk: _Chunk) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: where its network header starts, and its ethertype (or IB_LRH, or NO_NETWORK)."""
    net = np.zeros(chunk.n, np.int64)
    nettype = np.full(chunk.n, NO_NETWORK, np.int64)
    linktype = chunk.rec.linktype
    one = bool(chunk.n) and bool((linktype == linktype[0]).all())  # a pcap file has one link type
    for lt in linktype[:1] if one else np.unique(linktype):
        rows = np.arange(chunk.n) if one else np.flatnonzero(linktype == lt)
        start = chunk.rec.offset[rows]
        if lt == ETHERNET:
            at, kind = _ethernet(chunk, rows, start)
        elif lt in (SLL, SLL2, IPOIB):
            type_at, header = {SLL: (14, 16), SLL2: (0, 20), IPOIB: (40, 44)}[int(lt)]
            kind, valid = chunk.read(rows, start + type_at, 2)
            at, kind = _untagged(chunk, rows, start + header, kind, valid)  # libpcap re-inserts VLAN tags
        elif lt in RAW_IP:
            version, valid = chunk.read(rows, start, 1)
            at = start
            kind = np.select(
                [valid & (version >> 4 == 4), valid & (version >> 4 == 6)], [ETH_IPV4, ETH_IPV6], NO_NETWORK
            )
        elif lt == INFINIBAND:
            at, kind = start, np.full(len(rows), IB_LRH)
        elif lt == ERF:
            at, kind = _erf(chunk, rows, start)
        else:
            continue
        net[rows], nettype[rows] = at, kind
    return net, nettype


def _ethernet(chunk: _Chunk, rows: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    kind, valid = chunk.read(rows, start + 12, 2)
    return _untagged(chunk, rows, start + 14, kind, valid)


def _untagged(
    chunk: _Chunk, rows: np.ndarray, at: np.ndarray, kind: np.ndarray, valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Past up to two 802.1Q / 802.1ad tags (QinQ) at `at`: where the network header starts, and its type."""
    for _ in range(2):
        tagged = valid & np.isin(kind, VLAN_TPIDS)
        if not tagged.any():
            break
        inner, inner_valid = chunk.read(rows, at + 2, 2)
        at = np.where(tagged, at + 4, at)
        kind, valid = np.where(tagged, inner, kind), np.where(tagged, inner_valid, valid)
    return at, np.where(valid, kind, NO_NETWORK)


def _erf(chunk: _Chunk, rows: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ERF records: a 16-byte header, optional 8-byte extension headers, then Ethernet (2 bytes pad) or IB."""
    rtype, valid = chunk.read(rows, start + 8, 1)
    at = start + 16
    more = valid & (rtype & 0x80 != 0)
    for _ in range(8):
        ext, ext_valid = chunk.read(rows, at, 1)
        at = np.where(more, at + 8, at)
        more = more & ext_valid & (ext & 0x80 != 0)
    nettype = np.full(len(rows), NO_NETWORK)
    ib = valid & (rtype & 0x7F == ERF_INFINIBAND)
    nettype[ib] = IB_LRH
    eth = np.flatnonzero(valid & (rtype & 0x7F == ERF_ETH))
    if len(eth):
        at[eth], nettype[eth] = _ethernet(chunk, rows[eth], at[eth] + 2)
    return at, nettype


# -- network layer ------------------------------------------------------------------------------


def _whole(rows: np.ndarray, at: np.ndarray, header: _Header, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, _Header]:
    """The frames of `rows` where `ok` and `header` is captured whole, and their headers."""
    ok &= header.room >= header.size
    if ok.all():
        return rows, at, header
    return rows[ok], at[ok], header.select(ok)


def _ipv4(chunk: _Chunk, rows: np.ndarray, at: np.ndarray) -> None:
    ip = chunk.header(rows, at, 20)
    first = field(ip.blocks, 0, 1)
    rows, at, ip = _whole(rows, at, ip, (first >> 4 == 4) & (first & 0x0F >= 5))
    ihl = (field(ip.blocks, 0, 1) & 0x0F) * 4
    chunk.put("ecn", rows, field(ip.blocks, 1, 1) & 3)
    chunk.put("ip_id", rows, raw(ip.blocks, 4, 2))
    for side, offset in (("src", 12), ("dst", 16)):
        chunk.put_addr(side, rows, _V4, 0, field(ip.blocks, offset, 4))
    first_fragment = field(ip.blocks, 6, 2) & 0x1FFF == 0
    total = field(ip.blocks, 2, 2)
    _transport(chunk, rows, field(ip.blocks, 9, 1), at + ihl, total - ihl, first_fragment)


def _ipv6(chunk: _Chunk, rows: np.ndarray, at: np.ndarray) -> None:
    ip = chunk.header(rows, at, 40)
    rows, at, ip = _whole(rows, at, ip, field(ip.blocks, 0, 2) >> 12 == 6)
    chunk.put("ecn", rows, (field(ip.blocks, 0, 2) >> 4) & 3)
    length = field(ip.blocks, 4, 2)
    nexthdr = field(ip.blocks, 6, 1)
    _ipv6_addresses(chunk, rows, ip)
    at = at + 40
    first_fragment = np.ones(len(rows), bool)
    for _ in range(4):  # extension headers before the transport header
        ext = np.isin(nexthdr, IPV6_EXTENSIONS)
        frag = nexthdr == IPV6_FRAGMENT
        if not (ext.any() or frag.any()):
            break
        head = chunk.header(rows, at, 4)
        ext_len, _ = head.read(1, 1)
        offset, frag_valid = head.read(2, 2)
        first_fragment &= ~frag | (frag_valid & (offset >> 3 == 0))
        skip = np.where(ext, (ext_len + 1) * 8, np.where(frag, 8, 0))
        following, valid = head.read(0, 1)
        nexthdr = np.where(ext | frag, np.where(valid, following, -1), nexthdr)
        at, length = at + skip, length - skip
    _transport(chunk, rows, nexthdr, at, length, first_fragment)


def _rocev1(chunk: _Chunk, rows: np.ndarray, at: np.ndarray) -> None:
    """RoCEv1: a GRH (IPv6-like, GIDs as addresses) directly followed by the BTH."""
    grh = chunk.header(rows, at, GRH_LEN)
    rows, at, grh = _whole(rows, at, grh, np.ones(len(rows), bool))
    chunk.proto[rows] = _P["roce"]
    _ipv6_addresses(chunk, rows, grh)
    _bth(chunk, rows, at + GRH_LEN, field(grh.blocks, 4, 2))


def _lrh(chunk: _Chunk, rows: np.ndarray, at: np.ndarray) -> None:
    """Native InfiniBand: LRH (LIDs as addresses), a GRH when LNH says so, then the BTH."""
    lrh = chunk.header(rows, at, LRH_LEN)
    rows, at, lrh = _whole(rows, at, lrh, np.ones(len(rows), bool))
    lnh = field(lrh.blocks, 1, 1) & 3
    chunk.proto[rows] = _P["ib"]
    for side, offset in (("dst", 2), ("src", 6)):
        chunk.put_addr(side, rows, _LID, 0, field(lrh.blocks, offset, 2))
    words = field(lrh.blocks, 4, 2)
    global_route = lnh == 3
    bth_at = at + LRH_LEN + np.where(global_route, GRH_LEN, 0)
    transport = np.flatnonzero(lnh >= 2)  # 2: IBA local (BTH next), 3: IBA global (GRH, then BTH)
    length = (words & 0x7FF) * 4 - (bth_at - at) - 2  # packet length counts LRH to VCRC
    _bth(chunk, rows[transport], bth_at[transport], length[transport])


def _ipv6_addresses(chunk: _Chunk, rows: np.ndarray, header: _Header) -> None:
    """Source and destination of an IPv6 header or an InfiniBand GRH (same layout: GIDs at 8 and 24)."""
    for side, offset in (("src", 8), ("dst", 24)):
        hi, lo = field(header.blocks, offset, 8), field(header.blocks, offset + 8, 8)
        chunk.put_addr(side, rows, _V6, hi.astype(np.uint64), lo.astype(np.uint64))


# -- transport layer ----------------------------------------------------------------------------


def _ip_protos(first_fragment: bool) -> np.ndarray:
    """The `proto` of an IP packet by its protocol number: TCP and UDP only in a first fragment
    (later ones carry no transport header)."""
    codes = np.full(256, _P["ip"], np.int64)
    codes[[IPPROTO_ICMP, IPPROTO_ICMPV6]] = _P["icmp"], _P["icmpv6"]
    if first_fragment:
        codes[[IPPROTO_TCP, IPPROTO_UDP]] = _P["tcp"], _P["udp"]
    return codes


_PROTO_OF_FIRST, _PROTO_OF_LATER = _ip_protos(True), _ip_protos(False)


def _transport(
    chunk: _Chunk, rows: np.ndarray, proto: np.ndarray, at: np.ndarray, length: np.ndarray, first_fragment: np.ndarray
) -> None:
    """TCP, UDP (RoCEv2) and ICMP for IP packets whose transport header starts at `at` and spans `length` bytes."""
    number = proto & 0xFF  # an unreadable next header (-1) is no protocol decoded
    chunk.proto[rows] = np.where(first_fragment, _PROTO_OF_FIRST[number], _PROTO_OF_LATER[number])
    tcp = first_fragment & (proto == IPPROTO_TCP)
    udp = first_fragment & (proto == IPPROTO_UDP)
    if tcp.any():
        _tcp(chunk, rows[tcp], at[tcp], length[tcp])
    if udp.any():
        _udp(chunk, rows[udp], at[udp])
    l4 = tcp | udp
    _digest(chunk, rows[l4], at[l4], np.minimum(chunk.end[rows[l4]], at[l4] + length[l4]))


def _ports(chunk: _Chunk, rows: np.ndarray, header: _Header) -> np.ndarray:
    chunk.put_read("sport", rows, header, 0, 2)
    return chunk.put_read("dport", rows, header, 2, 2)


def _tcp(chunk: _Chunk, rows: np.ndarray, at: np.ndarray, length: np.ndarray) -> None:
    tcp = chunk.header(rows, at, 20)
    _ports(chunk, rows, tcp)
    chunk.put_read("seq", rows, tcp, 4, 4)
    chunk.put_read("ack", rows, tcp, 8, 4)
    flags, flags_valid = tcp.read(12, 2)
    chunk.put("flags", rows, flags & 0x1FF, flags_valid)
    chunk.put_read("window", rows, tcp, 14, 2)
    header = (flags >> 12) * 4
    chunk.put("payload", rows, np.maximum(length - header, 0), flags_valid & (header >= 20))
    _sack(chunk, rows, at + 20, at + header)


def _sack(chunk: _Chunk, rows: np.ndarray, at: np.ndarray, end: np.ndarray) -> None:
    """The first SACK block of each segment (a D-SACK, when there is one, is always first)."""
    active = np.flatnonzero(at < end)
    rows, at, end = rows[active], at[active], end[active]
    for _ in range(40):  # 40 option bytes at most; each step consumes at least one
        if not len(rows):
            return
        option = chunk.header(rows, at, 10)
        kind, valid = option.read(0, 1)
        size, size_valid = option.read(1, 1)
        sack = valid & size_valid & (kind == TCP_OPT_SACK) & (size >= 10)
        if sack.any():
            block = option.select(sack)
            chunk.put_read("sack_left", rows[sack], block, 2, 4)
            chunk.put_read("sack_right", rows[sack], block, 6, 4)
        at = at + np.where(kind == 1, 1, np.maximum(size, 2))  # NOP is one byte; guard a zero length
        going = valid & (kind != 0) & ~sack & ((kind == 1) | size_valid) & (at < end)
        rows, at, end = rows[going], at[going], end[going]


def _udp(chunk: _Chunk, rows: np.ndarray, at: np.ndarray) -> None:
    udp = chunk.header(rows, at, 8)
    dport = _ports(chunk, rows, udp)
    length, length_valid = udp.read(4, 2)
    chunk.put("payload", rows, np.maximum(length - 8, 0), length_valid)
    roce = dport == ROCE_PORT  # by destination port only: RoCE source ports are entropy (even 69)
    chunk.proto[rows[roce]] = _P["roce"]
    _bth(chunk, rows[roce], at[roce] + 8, np.where(length_valid, length - 8, -1)[roce])


def _bth(chunk: _Chunk, rows: np.ndarray, at: np.ndarray, length: np.ndarray) -> None:
    """BTH fields, the AETH of RC responses, and the payload bytes (`length` counts BTH to ICRC, -1 if unknown)."""
    bth = chunk.header(rows, at, BTH_LEN + AETH_LEN)
    opcode, opcode_valid = bth.read(0, 1)
    chunk.put("opcode", rows, opcode, opcode_valid)
    marks, valid = bth.read(4, 1)
    chunk.put("fecn", rows, marks >> 7, valid)
    chunk.put("becn", rows, (marks >> 6) & 1, valid)
    chunk.put_read("dest_qp", rows, bth, 5, 3)
    ack_req, valid = bth.read(8, 1)
    chunk.put("ack_req", rows, ack_req >> 7, valid)
    chunk.put_read("psn", rows, bth, 9, 3)
    ext = BTH_EXT_LEN[opcode]
    chunk.put("payload", rows, np.maximum(length - BTH_LEN - ext - ICRC_LEN, 0), opcode_valid & (length >= 0))
    aeth = np.flatnonzero(opcode_valid & BTH_HAS_AETH[opcode])
    if len(aeth):
        for name, offset, width in (("syndrome", BTH_LEN, 1), ("msn", BTH_LEN + 1, 3)):
            values, valid = bth.read(offset, width)
            chunk.put(name, rows[aeth], values[aeth], valid[aeth])


def _digest(chunk: _Chunk, rows: np.ndarray, at: np.ndarray, end: np.ndarray) -> None:
    """A hash of the first bytes of the transport header and payload (the TCP checksum and the
    RoCE BTH among them), so two frames with the same digest carry the same bytes. It stops at
    `end`, the datagram's end, so Ethernet padding after short segments does not count."""
    blocks = chunk.block(rows, at, 8 * DIGEST_WORDS)  # past the file's end: zeros, masked off below
    digest = np.zeros(len(rows), np.uint64)
    with np.errstate(over="ignore"):
        for k in range(DIGEST_WORDS):
            word = field(blocks, 8 * k, 8).astype(np.uint64)
            word &= _LEADING_BYTES[np.clip(end - at - 8 * k, 0, 8)]
            digest = (digest ^ word) * np.uint64(0x100000001B3 + 2 * k)
    chunk.put("digest", rows, digest.view(np.int64))


# Masks keeping the first (most significant) n bytes of a big-endian 8-byte word, n = 0..8.
_LEADING_BYTES = np.array([(~((1 << (8 * (8 - n))) - 1)) & (2**64 - 1) for n in range(9)], np.uint64)


# -- output -------------------------------------------------------------------------------------


def _columns(chunk: _Chunk, buckets: int) -> dict[str, Column]:
    src, src_hash = _addresses(*chunk.addr["src"])
    dst, dst_hash = _addresses(*chunk.addr["dst"])
    chunk.put("bucket", np.arange(chunk.n), _pair_bucket(chunk, src_hash, dst_hash, buckets))
    columns = {name: Column(chunk.values[name], chunk.valid[name]) for name in COLUMN_DTYPES if name in chunk.values}
    columns["src"], columns["dst"] = src, dst
    known = chunk.proto >= 0
    columns["proto"] = Column(np.where(known, chunk.proto, 0), known, list(PROTOS))
    return columns


def _addresses(family: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> tuple[Column, np.ndarray]:
    """Addresses as a dictionary column (each distinct address formatted once), and each frame's
    address hash (_mix, computed once per distinct address).

    The distinct (family, hi, lo) triples are found by integer codes (each part coded, then the
    codes combined), far faster than a unique over records.
    """
    if not hi.any():  # IPv4 and LIDs only, the usual capture: one unique over family and low part
        distinct, index = _codes((family.astype(np.int64) << 32) | lo.astype(np.int64))
        family_of, hi_of, lo_of = distinct >> 32, np.zeros(len(distinct), np.uint64), distinct & 0xFFFFFFFF
    else:
        his, hi_code = _codes(hi)
        los, lo_code = _codes(lo)
        combined = (family.astype(np.int64) * len(his) + hi_code) * len(los) + lo_code
        distinct, index = _codes(combined)
        rest, lo_code_of = np.divmod(distinct, len(los))
        family_of, hi_code_of = np.divmod(rest, len(his))
        hi_of, lo_of = his[hi_code_of], los[lo_code_of]
    names = [_format(int(f), int(h), int(l_)) for f, h, l_ in zip(family_of, hi_of, lo_of)]
    hashes = _mix(family_of, hi_of.astype(np.uint64), lo_of.astype(np.uint64))[index]
    return Column(index, family != 0, names), hashes


def _codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `keys` (in order of appearance) and each key's position among them:
    `np.unique(keys, return_inverse=True)` by hashing (polars, on every core), not sorting every
    frame."""
    series = pl.Series(keys)
    distinct = series.unique(maintain_order=True)
    positions = pl.int_range(len(distinct), dtype=pl.UInt32, eager=True)
    return distinct.to_numpy(), series.replace_strict(distinct, positions, return_dtype=pl.UInt32).to_numpy()


@functools.lru_cache(maxsize=1 << 17)  # a capture's addresses recur chunk after chunk
def _format(family: int, hi: int, lo: int) -> str:
    if family == _V4:
        return str(ipaddress.IPv4Address(lo))
    if family == _V6:
        return str(ipaddress.IPv6Address((hi << 64) | lo))
    if family == _LID:
        return f"LID {lo}"
    return ""
