"""Per-QP (RoCE) and per-flow (TCP) sequence analysis of the `packets` table, shared by rules and report.

Everything is computed from the table with polars expressions per flow, in
frame order; the RunContext (tracelens.derived) keeps the result, so the rules and
the report section pay for it once. A bucket of the table (whole connections) is
read a piece of frames at a time: what a piece needs from the whole bucket (each
QP's median PSN, each connection's handshake) is read first, each piece starts
from the last row the pieces before left in every direction and QP, and what
only the whole bucket decides (a CNP's QP, a resend's later D-SACK) is resolved
at the end. So memory follows a piece, whatever the biggest connection.

Capture duplicates come first: a frame whose previous frame in the same
direction has the same IP id and the same transport bytes (digest), less than
PacketWindows.duplicate_ms before it, is the same packet captured twice (a mirror port, two
capture points), not a retransmission. Duplicates are counted, then left out.

RoCE (RC), per connection: the data direction (src = requester, dst = responder,
qp = the responder's QP, as in the BTH) is paired with the responses flowing
back (ACK/NAK and CNPs, addressed to the requester's QP). A PSN at or below the
highest PSN already seen is retransmitted (go-back-N after a NAK, or a
timeout); a PSN above the highest + 1 leaves a gap of missing PSNs.

TCP, per direction, with Wireshark's semantics: a segment carrying data (or
SYN/FIN) that starts below the highest sequence number already sent is a
retransmission (the overlap is matched by byte range, so a repacketized resend
counts), unless it is a keep-alive or arrives so soon after the highest segment
that it is out of order; it is fast when the receiver had sent >= 2 duplicate
ACKs for it (Wireshark's: no data, same ack and window as before, not answering
a keep-alive; checked against tshark on real kernel retransmissions,
tests/captures/kernel_retransmissions). A stream seen first mid-connection simply starts there: bytes
before the capture are neither lost nor retransmitted.

Not every retransmission is a loss: Linux resends without one. Each is classified:
- spurious: the receiver had already acknowledged the bytes when the resend passed the capture
  point, or a D-SACK from the receiver names them (RFC 2883: it got them twice);
- tail-loss probe (RFC 8985 TLP): a resend of the tail (up to the highest byte sent) with no
  duplicate ACKs before it, what Linux sends about two round trips after the last segment
  when no ACK came, on a healthy but idle-ish connection too; it is counted as loss only when
  the connection uses SACK and no D-SACK came back for it (the probe repaired a lost tail);
- loss-driven: every other retransmission (fast retransmissions, timeouts of the first
  unacknowledged segment, confirmed probes). Only these are evidence of a lossy link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import polars as pl

from tracelens.tables import Frame


@dataclass(frozen=True)
class PacketWindows:
    """The time windows of the capture analysis (a config's [packets]), in milliseconds."""

    duplicate_ms: float = 0.5  # a fraction of a millisecond: the same frame seen twice
    out_of_order_ms: float = 3.0  # Wireshark's out-of-order window when the handshake RTT is unknown
    fast_retransmission_ms: float = 20.0  # a fast retransmission follows the dup ACKs within this

    def ns(self, name: str) -> int:
        """The window `name` (duplicate_ms ...) in whole nanoseconds, as capture times are."""
        return round(getattr(self, name) * 1_000_000)


CNP_OPCODES = (0x80, 0x81)  # 0x81 in the spec and on the wire; tshark 4.0 labels 0x80 "CNP"
ACK_OPCODES = (0x11, 0x12)  # RC Acknowledge, Atomic Acknowledge (they carry the AETH)
NAK_PSN_SEQUENCE = 0x60

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10
# Flows and QPs are kept per capture file: two captures of one flow (both ends of a link)
# must not merge into one stream where every segment looks resent.
DIRECTION = ["file", "src", "sport", "dst", "dport"]
DATA_QP = ["file", "src", "dst", "qp"]  # a data QP, from the data direction (src = requester)
# The columns the analysis reads (every frame's, RoCE's and TCP's own, the duplicate check's): a bucket is
# held with these alone (ts_text, msn, the FECN/BECN bits ... stay on disk)
FRAME = ["file", "frame", "ts", "src", "dst", "length", "payload"]
ROCE_READ = ["ecn", "opcode", "dest_qp", "psn", "syndrome"]
TCP_READ = ["sport", "dport", "seq", "ack", "flags", "window", "sack_left", "sack_right"]
READ = [*FRAME, *ROCE_READ, *TCP_READ, "proto", "ip_id", "digest"]
# what a big bucket's first reading needs (its duplicates, then the median PSN's bins and the handshake)
FACTS_READ = [*DIRECTION, "frame", "ts", "proto", "ip_id", "digest", "opcode", "dest_qp", "psn", "seq", "flags"]
MEDIAN_READ = ["file", "frame", "proto", "src", "dst", "opcode", "dest_qp", "psn"]
# Worst first; ties broken by the flow's identity: group_by's order varies from run to run, the report must not.
QP_ORDER, QP_DESCENDING = ["trouble", "packets", "file", "src", "dst", "qp"], [True, True, False, False, False, False]
TCP_ORDER, TCP_DESCENDING = ["retransmission_share", "segments", *DIRECTION], [True, True] + [False] * len(DIRECTION)


@dataclass(frozen=True)
class PacketAnalysis:
    qps: pl.DataFrame  # one row per RoCE connection, worst first; `flow` names it as in `events`
    tcp: pl.DataFrame  # one row per TCP direction, worst first; `flow` names it as in `events`
    events: pl.DataFrame  # file, frame, ts, kind, flow, src, dst: every NAK, CNP, CE mark, retransmission, ...


TCP_LOSS, TCP_PROBE, TCP_SPURIOUS = "TCP retransmission", "TCP tail-loss probe", "TCP spurious retransmission"
PIECE_FRAMES = 1 << 20  # frames of a bucket analysed at once: about 330 bytes each while they are
PIECE_EDGES = 1 << 16  # a bigger bucket is cut at the edges of this many ranges of frame numbers
PSN_BIN_BITS = 12  # a QP's median PSN is found by counting its PSNs in bins of 4,096, then in its bin


def analyze(packets: Frame, windows: PacketWindows = PacketWindows()) -> PacketAnalysis:
    """The per-QP, per-flow and per-event analysis of `packets`, a bucket at a time, a piece at a time.

    Everything here is per connection, and the ingest puts every TCP connection (both ways) and
    every RoCE QP between two hosts of one capture in one `bucket` (tracelens.ingest.packets.pcap): the
    table, a lazy scan of Parquet written bucket by bucket in a run, is read and analysed one bucket
    at a time. A bucket bigger than PIECE_FRAMES (one connection of millions of frames) is read in
    pieces of frame numbers, each starting where the one before left every direction and QP
    (_with_context), so memory follows a piece, not the capture, and the results are the same as on
    the whole table. The RunContext keeps the result (ctx.packets): the events, the window
    signals, the rules and the report all read it there.
    """
    packets = packets.lazy()
    buckets = packets.select(pl.col("file").cast(pl.String), "bucket").unique().sort("file", "bucket").collect()
    # a filter on the bucket column as written (not a derived one) skips the other buckets' files unread
    parts = [
        _bucket(packets.filter(pl.col("bucket").eq_missing(bucket), pl.col("file") == file), windows)
        for file, bucket in buckets.iter_rows()  # a table built by hand has no buckets: one, null
    ]
    text = pl.col(pl.Categorical).cast(pl.String)  # a capture's text columns are categorical; results join with others
    return PacketAnalysis(
        qps=pl.concat([p.qps for p in parts]).with_columns(text).sort(QP_ORDER, descending=QP_DESCENDING),
        tcp=pl.concat([p.tcp for p in parts]).with_columns(text).sort(TCP_ORDER, descending=TCP_DESCENDING),
        events=pl.concat([p.events for p in parts]).with_columns(text).sort("ts", "frame", "file", "kind", "flow"),
    )


def capture_spans(packets: Frame) -> pl.DataFrame:
    """Per capture file (text): its frames, and the times of its first and last timed frame."""
    return (
        packets.lazy()
        .group_by(pl.col("file").cast(pl.String))
        .agg(frames=pl.len(), first=pl.col("ts").min(), last=pl.col("ts").max())
        .sort("file")
        .collect()
    )


def event_times(packets: Frame, windows: PacketWindows = PacketWindows()) -> pl.Series:
    """The times of every event of the capture but its duplicates (a NAK, a retransmission ...): what
    the timeline lines NCCL errors up with to tell apart zone shifts (timeline.align's capture_events)."""
    return analyze(packets, windows=windows).events.filter(pl.col("kind") != "capture duplicate")["ts"]


# -- a bucket, piece by piece ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Facts:
    """What every piece of a bucket needs from all of it, read before them."""

    keys: pl.DataFrame  # file, src, dst, qp, data_psn: each data QP and its median PSN (pairs its ACKs)
    rtt: pl.DataFrame  # DIRECTION, rtt: each TCP direction's handshake round trip (ns), both ways


@dataclass
class _BucketCarry:
    """Where the pieces analysed so far left the bucket: the last data packet of each QP and the last
    segment of each TCP direction, with the running state the next piece starts from, and the NAKs
    whose resend has not been seen yet."""

    roce: pl.DataFrame | None = None
    tcp: pl.DataFrame | None = None
    naks: pl.DataFrame | None = None
    more: bool = False  # whether a piece follows: the last rows are kept only then


@dataclass(frozen=True)
class _Part:
    """A piece's share of the bucket's results: sums to add up, and the rows resolved only once
    the whole bucket is read (CNPs need every ACK's pairing, retransmissions every later D-SACK)."""

    sent: pl.DataFrame  # per data QP
    answered: pl.DataFrame  # per data QP, from its ACKs and NAKs
    ack_pairs: pl.DataFrame  # per requester QP and the data QP its ACKs pair with: how many
    cnps: pl.DataFrame  # every CNP, not paired yet
    delays: pl.DataFrame  # every NAK answered by a resend, and how long it took
    tcp_sums: pl.DataFrame  # per TCP direction
    resends: pl.DataFrame  # every TCP retransmission, not classified yet
    dsacks: pl.DataFrame  # every D-SACK block, in the direction of the data it names
    sackers: pl.DataFrame  # the TCP directions whose receiver uses SACK
    events: pl.DataFrame  # the piece's events that need nothing more


def _bucket(scan: pl.LazyFrame, windows: PacketWindows) -> PacketAnalysis:
    pieces = _pieces(scan)
    duplicates: list[pl.Series] = []  # each piece's, found on its first reading
    read: Callable[[list[str]], Iterator[pl.DataFrame]] = partial(_read, pieces, windows=windows, duplicates=duplicates)
    if len(pieces) == 1:  # a bucket of one piece is read once, all of it
        held = list(read(READ))

        def held_again(columns: list[str]) -> Iterator[pl.DataFrame]:
            return iter(held)

        read = held_again

    facts = _facts(read)
    carry, parts = _BucketCarry(), []
    for i, frames in enumerate(read(READ)):
        carry.more = i < len(pieces) - 1
        parts.append(_piece(frames, carry, facts, windows))
    return _finished(parts, facts)


def _pieces(scan: pl.LazyFrame) -> list[pl.LazyFrame]:
    """The bucket as pieces of about PIECE_FRAMES frames, by frame number (a capture's bucket is in
    frame order, its row groups too: a piece's filter reads only its own)."""
    frames, lo, hi = scan.select(pl.len(), lo=pl.col("frame").min(), hi=pl.col("frame").max()).collect().row(0)
    if frames <= PIECE_FRAMES:
        return [scan]
    width = (hi - lo) // PIECE_EDGES + 1
    counts = scan.group_by(edge=(pl.col("frame") - lo) // width).agg(n=pl.len()).sort("edge")
    piece = (pl.col("n").cum_sum() - pl.col("n")) // PIECE_FRAMES
    starts = counts.group_by(piece=piece).agg(pl.col("edge").min()).sort("piece").collect()["edge"]
    bounds = [lo + edge * width for edge in starts.to_list()[1:]]
    below = [pl.col("frame") < b for b in bounds] + [pl.lit(True)]
    above = [pl.lit(True)] + [pl.col("frame") >= b for b in bounds]
    return [scan.filter(a, b) for a, b in zip(above, below)]


def _read(
    pieces: list[pl.LazyFrame], columns: list[str], windows: PacketWindows, duplicates: list[pl.Series]
) -> Iterator[pl.DataFrame]:
    """The pieces' `columns` in frame order, `order` numbering the frames across the bucket, and
    `duplicate` flagged: found on the first reading (and kept in `duplicates`), taken from it after."""
    before, offset = None, 0
    for i, piece in enumerate(pieces):
        frames = piece.select(columns).collect()
        # a bucket of one capture is read in frame order: sorting it again would copy every row
        frames = (frames if frames["frame"].is_sorted() else frames.sort("frame")).with_row_index("order", offset)
        offset += frames.height
        if i < len(duplicates):
            yield frames.with_columns(duplicate=duplicates[i])
            continue
        frames = _with_duplicates(_with_context(frames, before), windows)
        before = _last_rows(frames, ["proto", *DIRECTION]) if i < len(pieces) - 1 else None
        frames = _own(frames).drop("context")
        duplicates.append(frames["duplicate"])
        yield frames


def _with_context(rows: pl.DataFrame, context: pl.DataFrame | None, carried: dict | None = None) -> pl.DataFrame:
    """`rows` after the last row of each direction or QP that the pieces before left (`context`,
    flagged): a shift, a diff or an as-of join over a direction then sees the row before the piece.
    A running value (a cumulative sum or max, a forward fill) starts from its value on the context
    row, one of the `carried` columns (name: dtype), null on the piece's own rows."""
    carried = carried or {}
    rows = rows.with_columns(pl.lit(False).alias("context"), *(pl.lit(None, t).alias(c) for c, t in carried.items()))
    if context is None:
        return rows
    return pl.concat([context.select(rows.columns).cast(dict(rows.schema)).with_columns(context=True), rows])


def _own(rows: pl.DataFrame) -> pl.DataFrame:
    """The piece's own rows, after its context rows (a slice: no copy)."""
    return rows.slice(int(rows["context"].sum()))


def _last_rows(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The last row of each `keys` (context rows included: a direction the piece did not see stays)."""
    return rows.group_by(keys, maintain_order=True).last().sort("order")


def _facts(read: Callable[[list[str]], Iterator[pl.DataFrame]]) -> _Facts:
    """Each data QP's median PSN and each TCP direction's handshake RTT, from every piece."""
    bins, syns, acks = [], [], []
    for frames in read(FACTS_READ):
        bins.append(_roce_data_frames(frames).group_by(*DATA_QP, _psn_bin()).agg(n=pl.len()))
        segments = _segments(frames)
        syns.append(segments.filter(pl.col("flags") & (SYN | ACK) == SYN).group_by(DIRECTION).agg(pl.col("ts").first()))
        acks.append(segments.filter(pl.col("flags") & (SYN | ACK) == ACK).group_by(DIRECTION).agg(pl.col("ts").first()))
    counts = pl.concat(bins).group_by(*DATA_QP, "bin").agg(pl.col("n").sum()).sort(*DATA_QP, "bin")
    keys = counts.select(DATA_QP).unique(maintain_order=True)
    keys = keys.join(_median_psns(counts, read), on=DATA_QP, how="left", nulls_equal=True)
    first = [pl.concat(found).group_by(DIRECTION, maintain_order=True).first() for found in (syns, acks)]
    handshake = first[0].join(first[1], on=DIRECTION, suffix="_ack", nulls_equal=True)
    rtt = handshake.select(*DIRECTION, rtt=(pl.col("ts_ack") - pl.col("ts")).dt.total_nanoseconds())
    rtt = rtt.filter(pl.col("rtt") > 0)
    return _Facts(keys=keys, rtt=pl.concat([rtt, rtt.select("file", "rtt", **REVERSE)], how="diagonal"))


def _psn_bin() -> pl.Expr:
    return (pl.col("psn") // (1 << PSN_BIN_BITS)).alias("bin")


def _median_psns(counts: pl.DataFrame, read: Callable[[list[str]], Iterator[pl.DataFrame]]) -> pl.DataFrame:
    """Each data QP's median PSN, exactly, without holding its PSNs: from `counts` (per QP and bin of
    PSNs), the bin of the middle rank (or the two middle ranks of an even count), then, on a second
    reading, the PSNs in those bins alone."""
    ranked = counts.filter(pl.col("bin").is_not_null()).with_columns(
        total=pl.col("n").sum().over(DATA_QP), before=(pl.col("n").cum_sum() - pl.col("n")).over(DATA_QP)
    )
    inside = (pl.col("rank") >= pl.col("before")) & (pl.col("rank") < pl.col("before") + pl.col("n"))
    wanted = pl.concat(
        ranked.with_columns(rank=rank).filter(inside).select(*DATA_QP, "bin", at=pl.col("rank") - pl.col("before"))
        for rank in ((pl.col("total") - 1) // 2, pl.col("total") // 2)
    )
    if not wanted.height:  # no RoCE data: no second reading
        return wanted.select(DATA_QP, data_psn=pl.lit(None, pl.Float64))
    bins = wanted.select(*DATA_QP, "bin")
    in_bins = pl.concat(
        _roce_data_frames(frames).select(*DATA_QP, _psn_bin(), "psn").join(bins, on=[*DATA_QP, "bin"], how="semi")
        for frames in read(MEDIAN_READ)
    )
    # each bin's PSNs sorted as a list, and the wanted rank's taken (not a sort of every row by the QP's
    # text columns)
    sorted_bins = in_bins.group_by(*DATA_QP, "bin").agg(pl.col("psn").sort())
    middle = pl.col("psn").list.get(pl.col("at"))
    return sorted_bins.join(wanted, on=[*DATA_QP, "bin"]).group_by(DATA_QP).agg(data_psn=middle.mean())


def _piece(frames: pl.DataFrame, carry: _BucketCarry, facts: _Facts, windows: PacketWindows) -> _Part:
    kept = frames.select("proto", "duplicate")  # each protocol's frames copied with its own columns alone
    roce = frames.select("order", *FRAME, *ROCE_READ).filter(kept["proto"] == "roce", ~kept["duplicate"])
    tcp = frames.select("order", *FRAME, *TCP_READ).filter(kept["proto"] == "tcp", ~kept["duplicate"])
    dups = _event(frames.filter(pl.col("duplicate")), "capture duplicate", _direction_label())
    roce_parts, roce_events = _roce(roce, carry, facts)
    tcp_parts, tcp_events = _tcp(tcp, carry, facts, windows)
    return _Part(**roce_parts, **tcp_parts, events=pl.concat([roce_events, tcp_events, dups]))


def _finished(parts: list[_Part], facts: _Facts) -> PacketAnalysis:
    """The bucket's tables and events, from its pieces' parts."""

    def every(name: str) -> pl.DataFrame:
        return pl.concat([getattr(part, name) for part in parts])

    qps, cnp_events = _roce_table(every, facts)
    tcp, tcp_events = _tcp_table(every)
    return PacketAnalysis(qps, tcp, pl.concat([every("events"), cnp_events, tcp_events]))


def _with_duplicates(frames: pl.DataFrame, windows: PacketWindows) -> pl.DataFrame:
    same_as_previous = pl.all_horizontal(
        (pl.col(c).fill_null(-1) == pl.col(c).fill_null(-1).shift(1)).over("proto", *DIRECTION)
        for c in ("ip_id", "digest")
    )
    soon = (pl.col("ts") - pl.col("ts").shift(1)).over("proto", *DIRECTION) < pl.duration(
        nanoseconds=windows.ns("duplicate_ms")
    )
    # CNPs carry no sequence number: a NIC's CNPs to one QP are identical by design
    cnp = pl.col("opcode").is_in(CNP_OPCODES).fill_null(False)
    return frames.with_columns(
        duplicate=(pl.col("digest").is_not_null() & ~cnp & same_as_previous & soon).fill_null(False)
    )


def _unwrapped(column: str, bits: int, over: list[str], carried: str) -> pl.Expr:
    """A sequence number made monotonic across wraps (mod 2**bits), relative to the flow's first
    (or continuing from the context row's `carried` value)."""
    mod, half = 1 << bits, 1 << (bits - 1)
    step = (pl.col(column).diff().over(over).fill_null(0) + half + mod) % mod - half
    return pl.when("context").then(pl.col(carried)).otherwise(step).cum_sum().over(over)


def _event(frames: pl.DataFrame, kind: str, flow: pl.Expr) -> pl.DataFrame:
    # rechunked: polars 2.1 panics ("i < self.len()") formatting a QP label over some multi-chunk rows
    return frames.rechunk().select("file", "frame", "ts", pl.lit(kind).alias("kind"), flow.alias("flow"), "src", "dst")


def _direction_label() -> pl.Expr:
    return pl.format("{}:{} → {}:{}", "src", "sport", "dst", "dport")


# -- RoCE ---------------------------------------------------------------------------------------

RESPONSE = ["file", "src", "dst", "dest_qp"]  # a response's requester QP, from the response direction
ROCE_CARRIED = {"rel_psn": pl.Int64, "reach": pl.Int64}  # the PSN unwrapped, and the highest so far


def _is_cnp() -> pl.Expr:
    return pl.col("opcode").is_in(CNP_OPCODES)


def _is_response() -> pl.Expr:
    return pl.col("opcode").is_in(ACK_OPCODES)


def _roce_data_frames(frames: pl.DataFrame) -> pl.DataFrame:
    """The RoCE data packets of a piece's frames (not duplicates, not ACKs or CNPs), `qp` their QP."""
    roce = frames.select(*DATA_QP[:3], "dest_qp", "psn", "proto", "duplicate", "opcode")
    roce = roce.filter(pl.col("proto") == "roce", ~pl.col("duplicate"), ~_is_cnp(), ~_is_response())
    return roce.select(*DATA_QP[:3], "psn", qp="dest_qp")


def _roce(frames: pl.DataFrame, carry: _BucketCarry, facts: _Facts) -> tuple[dict[str, pl.DataFrame], pl.DataFrame]:
    data = _roce_data(frames.filter(~_is_cnp(), ~_is_response()), carry)
    responses = frames.filter(_is_response() | _is_cnp()).with_columns(
        nak_seq=pl.col("syndrome") == NAK_PSN_SEQUENCE,
        nak_other=(pl.col("syndrome") > NAK_PSN_SEQUENCE) & (pl.col("syndrome") & 0x60 == 0x60),
        rnr=pl.col("syndrome") & 0x60 == 0x20,
    )
    paired = _paired(responses.filter(~_is_cnp()), facts.keys)
    # responses travel responder -> requester; seen from the data direction they answer:
    answers = paired.with_columns(src=pl.col("dst"), dst=pl.col("src"), qp=pl.col("pair_qp"))
    label = _qp_label(facts)
    events = [
        _event(answers.filter("nak_seq"), "NAK (PSN sequence error)", label),
        _event(answers.filter("nak_other"), "NAK (other)", label),
        _event(answers.filter("rnr"), "RNR NAK", label),
        _event(data.filter(pl.col("ecn") == 3), "ECN-CE", label),
        _event(data.filter(pl.col("missing") > 0), "PSN gap", label),
        _event(data.filter("retransmitted"), "RoCE retransmission", label),
    ]
    sent = data.group_by(DATA_QP).agg(
        packets=pl.len(),
        bytes=pl.col("length").cast(pl.Int64).sum(),
        retransmitted=pl.col("retransmitted").sum(),
        retransmitted_bytes=pl.col("payload").cast(pl.Int64).filter("retransmitted").sum(),
        psn_gaps=(pl.col("missing") > 0).sum(),
        missing_psns=pl.col("missing").sum(),
        ce_marked=(pl.col("ecn") == 3).sum(),
        first=pl.col("ts").min(),
        last=pl.col("ts").max(),
    )
    answered = (
        answers.filter(pl.col("qp").is_not_null())
        .group_by(DATA_QP, maintain_order=True)
        .agg(
            peer_qp=pl.col("dest_qp").first(),
            naks_seq=pl.col("nak_seq").sum(),
            naks_other=pl.col("nak_other").sum(),
            rnr_naks=pl.col("rnr").sum(),
        )
    )
    ack_pairs = paired.filter(pl.col("pair_qp").is_not_null()).group_by(*RESPONSE, "pair_qp").agg(n=pl.len())
    parts = {
        "sent": sent,
        "answered": answered,
        "ack_pairs": ack_pairs,
        "cnps": responses.filter(_is_cnp()),
        "delays": _nak_to_resend(data, answers, carry),
    }
    return parts, pl.concat(events)


def _roce_data(data: pl.DataFrame, carry: _BucketCarry) -> pl.DataFrame:
    """Data packets per QP with their PSN fate: retransmitted, or how many PSNs are missing before them."""
    data = _with_context(data.with_columns(qp=pl.col("dest_qp")), carry.roce, ROCE_CARRIED)
    data = data.with_columns(rel_psn=_unwrapped("psn", 24, DATA_QP, "rel_psn")).with_columns(
        reach=pl.when("context").then("reach").otherwise("rel_psn").cum_max().over(DATA_QP)
    )
    highest = pl.col("reach").shift(1).over(DATA_QP)
    data = data.with_columns(
        retransmitted=(pl.col("rel_psn") <= highest).fill_null(False),
        missing=(pl.col("rel_psn") - highest - 1).clip(lower_bound=0).fill_null(0),
    )
    carry.roce = _last_rows(data, DATA_QP) if carry.more else None
    return _own(data)


def _qp_label(facts: _Facts) -> pl.Expr:
    names = {qp: f"0x{qp:06x}" for qp in facts.keys["qp"].unique().drop_nulls().to_list()}
    return pl.format("{} → {} QP {}", "src", "dst", pl.col("qp").replace_strict(names, default="?"))


def _paired(responses: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Give each ACK or NAK the data QP it answers (same hosts reversed), `pair_qp`: it carries a PSN
    of the data it answers, and the data QP whose median PSN is nearest wins."""
    wrap = 1 << 24
    acks = (
        responses.select(*RESPONSE, "psn")
        .unique()
        .join(keys, left_on=["file", "src", "dst"], right_on=["file", "dst", "src"])
        .with_columns(distance=((pl.col("psn") - pl.col("data_psn")).abs() % wrap))
        .with_columns(distance=pl.min_horizontal("distance", wrap - pl.col("distance")))
        .sort("distance", "qp")
        .unique([*RESPONSE, "psn"], keep="first")
        .select(*RESPONSE, "psn", pair_qp="qp")
    )
    return responses.join(acks, on=[*RESPONSE, "psn"], how="left", nulls_equal=True, maintain_order="left")


def _paired_cnps(cnps: pl.DataFrame, ack_pairs: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Give each CNP the data QP it throttles. A CNP carries no PSN of the flow, but it is addressed
    to the throttled requester's own QP, as that requester's ACKs and NAKs are: it takes the data QP
    most of them pair with, or the only data QP between the two hosts; with several QPs and no ACK
    to go by it stays unattributed."""
    by_ack = (
        ack_pairs.group_by(*RESPONSE, "pair_qp")
        .agg(pl.col("n").sum())
        .sort("n", "pair_qp", descending=[True, False])
        .group_by(RESPONSE, maintain_order=True)
        .agg(by_ack=pl.col("pair_qp").first())
    )
    only_qp = (
        keys.group_by("file", "src", "dst")
        .agg(only=pl.col("qp").first(), n=pl.len())
        .filter(pl.col("n") == 1)
        .select("file", src="dst", dst="src", only="only")
    )
    return (
        cnps.join(by_ack, on=RESPONSE, how="left", maintain_order="left")
        .join(only_qp, on=["file", "src", "dst"], how="left", maintain_order="left")
        .with_columns(src=pl.col("dst"), dst=pl.col("src"), qp=pl.coalesce("by_ack", "only"))
    )


def _roce_table(every: Callable[[str], pl.DataFrame], facts: _Facts) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The per-QP table, worst first, and the CNPs' events (they are paired once every ACK is read)."""
    counts = ["packets", "bytes", "retransmitted", "retransmitted_bytes", "psn_gaps", "missing_psns", "ce_marked"]
    sent = every("sent").group_by(DATA_QP).agg(pl.col(counts).sum(), pl.col("first").min(), pl.col("last").max())
    cnps = _paired_cnps(every("cnps"), every("ack_pairs"), facts.keys)
    answers = (
        every("answered")
        .group_by(DATA_QP, maintain_order=True)
        .agg(pl.col("peer_qp").first(), pl.col("naks_seq", "naks_other", "rnr_naks").sum())
    )
    throttled = cnps.filter(pl.col("qp").is_not_null()).group_by(DATA_QP).agg(cnps=pl.len())
    answered = answers.join(throttled, on=DATA_QP, how="full", coalesce=True, nulls_equal=True)
    delays = every("delays").group_by(DATA_QP).agg(nak_to_resend_ms=pl.col("delay_ms").median())
    table = sent.join(answered, on=DATA_QP, how="left", nulls_equal=True).join(
        delays, on=DATA_QP, how="left", nulls_equal=True
    )
    responses = ["naks_seq", "naks_other", "rnr_naks", "cnps"]
    table = table.with_columns(
        pl.col(responses).fill_null(0).cast(pl.Int64), ce_share=pl.col("ce_marked") / pl.col("packets")
    )
    trouble = pl.sum_horizontal("retransmitted", "missing_psns", *responses, "ce_marked") / pl.col("packets")
    label = _qp_label(facts)
    return table.with_columns(trouble=trouble, flow=label), _event(cnps, "CNP", label)


def _nak_to_resend(data: pl.DataFrame, answers: pl.DataFrame, carry: _BucketCarry) -> pl.DataFrame:
    """Every NAK (sequence error or RNR) whose resend of the PSN it names is in this piece, and the
    time to it; the others wait for the next piece (carry.naks)."""
    named = ["file", "src", "dst", "qp", "psn"]
    naks = answers.filter(pl.col("nak_seq") | pl.col("rnr"), pl.col("qp").is_not_null()).select(
        "order", *named, nak_ts="ts"
    )
    if carry.naks is not None:
        naks = pl.concat([carry.naks, naks])
    # only the data packets of the PSNs a NAK names can be its resend, so the as-of join groups those
    # alone, not every packet by its PSN
    resent = data.select("order", *named, "ts").join(
        naks.select(named).unique(), on=named, how="semi", nulls_equal=True, maintain_order="left"
    )
    joined = naks.join_asof(
        resent,
        on="order",
        by=named,
        strategy="forward",
        check_sortedness=False,  # sorted by "order" within each group
    )
    carry.naks = joined.filter(pl.col("ts").is_null()).select(naks.columns)
    delay = (pl.col("ts") - pl.col("nak_ts")).dt.total_nanoseconds() / 1e6
    return joined.filter(pl.col("ts").is_not_null()).select(DATA_QP, delay_ms=delay)


# -- TCP ----------------------------------------------------------------------------------------

REVERSE = {"src": "dst", "sport": "dport", "dst": "src", "dport": "sport"}  # a direction's columns, the other way


def _tcp_carried(ts: pl.DataType) -> dict:
    """The running state a TCP direction's context row brings (see _with_context)."""
    return {
        "rel": pl.Int64,  # the sequence number unwrapped
        "reach": pl.Int64,  # the highest end of a segment so far
        "advanced_ts": ts,  # when the reach last advanced
        "keepalive": pl.Boolean,
        "dup_acks_total": pl.Int64,  # duplicate ACKs so far
        "dup_acks_before_run": pl.Int64,  # ... when the ack value last moved
        "dup_acks_so_far": pl.Int64,  # ... since then
    }


def _segments(frames: pl.DataFrame) -> pl.DataFrame:
    """The TCP segments of a piece's frames (not duplicates, sequence number and flags read)."""
    tcp = frames.select(*DIRECTION, "ts", "seq", "flags", "proto", "duplicate")
    return tcp.filter(
        pl.col("proto") == "tcp", ~pl.col("duplicate"), pl.col("seq").is_not_null(), pl.col("flags").is_not_null()
    )


def _tcp(
    frames: pl.DataFrame, carry: _BucketCarry, facts: _Facts, windows: PacketWindows
) -> tuple[dict[str, pl.DataFrame], pl.DataFrame]:
    flags = pl.col("flags")
    seglen = pl.col("payload").fill_null(0) + (flags & SYN > 0).cast(pl.Int64) + (flags & FIN > 0).cast(pl.Int64)
    control = flags & (SYN | FIN | RST) > 0
    segments = frames.filter(pl.col("seq").is_not_null(), flags.is_not_null()).with_columns(seglen=seglen)
    segments = _with_context(segments, carry.tcp, _tcp_carried(frames.schema["ts"]))
    context = pl.col("context")
    end = pl.col("rel") + pl.col("seglen")
    segments = segments.with_columns(rel=_unwrapped("seq", 32, DIRECTION, "rel")).with_columns(
        reach=pl.when(context).then("reach").otherwise(end).cum_max().over(DIRECTION)
    )
    nextseq = pl.col("reach").shift(1).over(DIRECTION)
    advanced = pl.col("nextseq").is_null() | (end > pl.col("nextseq"))
    keepalive = (pl.col("seglen") <= 1) & (pl.col("rel") == pl.col("nextseq") - 1) & ~control
    segments = segments.with_columns(nextseq=nextseq).with_columns(
        advanced_ts=pl.when(context).then("advanced_ts").when(advanced).then("ts").forward_fill().over(DIRECTION),
        keepalive=pl.when(context).then("keepalive").otherwise(keepalive.fill_null(False)),
    )
    segments = segments.with_columns(nextseq_ts=pl.col("advanced_ts").shift(1).over(DIRECTION))
    segments = _with_reverse_state(segments, facts.rtt, windows.ns("out_of_order_ms"))
    # Wireshark's duplicate ACK: no data, the same window and ack as the direction's previous segment,
    # at the next sequence number, and not the answer to a keep-alive; the count restarts when the ack moves
    dup_ack = (
        (pl.col("seglen") == 0)
        & ~control
        & (pl.col("window") > 0)
        & _as_before("window")
        & _as_before("ack")
        & (pl.col("rel") == pl.col("nextseq"))
        & ~pl.col("rev_keepalive")
    ).fill_null(False)
    # the count since the ack last moved: the direction's running count less its value when the run began
    # (not a window per run of one ack, which holds a group per ack value)
    run_starts = (~_as_before("ack")).fill_null(True)
    total = pl.col("dup_acks_total")
    before_run = (
        pl.when(context).then("dup_acks_before_run").when(run_starts).then(total - pl.col("dup_ack").cast(pl.Int64))
    )
    segments = (
        segments.with_columns(dup_ack=dup_ack)
        .with_columns(
            dup_acks_total=pl.when(context)
            .then(total)
            .otherwise(pl.col("dup_ack").cast(pl.Int64))
            .cum_sum()
            .over(DIRECTION)
        )
        .with_columns(dup_acks_before_run=before_run.forward_fill().over(DIRECTION))
        .with_columns(dup_acks_so_far=total - pl.col("dup_acks_before_run"))
    )
    candidate = (pl.col("seglen") > 0) & (pl.col("rel") < pl.col("nextseq")) & ~pl.col("keepalive")
    segments = segments.with_columns(candidate=candidate.fill_null(False)).join(
        segments.select(rev_order="order", rev_dup_acks="dup_acks_so_far"),
        on="rev_order",
        how="left",
        maintain_order="left",
    )
    carry.tcp = _last_rows(segments, DIRECTION) if carry.more else None
    segments = _own(segments)
    fast = (
        pl.col("candidate")
        & (pl.col("rev_dup_acks") >= 2)
        & (pl.col("rev_ack") == pl.col("seq"))
        & ((pl.col("ts") - pl.col("rev_ts")).dt.total_nanoseconds() < windows.ns("fast_retransmission_ms"))
    ).fill_null(False)
    soon = (pl.col("ts") - pl.col("nextseq_ts")).dt.total_nanoseconds() < pl.col("ooo_window")
    out_of_order = (pl.col("candidate") & ~fast & soon & (pl.col("nextseq") != end)).fill_null(False)
    segments = segments.with_columns(fast=fast, retransmission=pl.col("candidate") & ~out_of_order).with_columns(
        retransmitted_bytes=pl.when("retransmission")
        .then((pl.min_horizontal(end, pl.col("nextseq")) - pl.col("rel")).clip(lower_bound=0))
        .otherwise(0),
        zero_window=(pl.col("window") == 0) & (flags & RST == 0),
    )
    sums = segments.group_by(DIRECTION).agg(
        segments=(pl.col("seglen") > 0).sum(),
        bytes=pl.col("payload").cast(pl.Int64).sum(),
        retransmissions=pl.col("retransmission").sum(),
        fast_retransmissions=pl.col("fast").sum(),
        retransmitted_bytes=pl.col("retransmitted_bytes").sum(),
        dup_acks=pl.col("dup_ack").sum(),
        zero_windows=pl.col("zero_window").sum(),
        first=pl.col("ts").min(),
        last=pl.col("ts").max(),
    )
    # a resend is spurious if the receiver's cumulative ACK before it already covers it (or a later D-SACK
    # names it: _tcp_table); a tail-loss probe if it resends the tail with no duplicate ACK before it
    acked = (_modular_diff(pl.col("rev_ack"), pl.col("seq")) >= pl.col("seglen")).fill_null(False)
    tail = (end >= pl.col("nextseq")) & ~pl.col("fast") & (pl.col("rev_dup_acks").fill_null(0) < 1)
    resends = segments.filter("retransmission").select(
        "file", "frame", "ts", *DIRECTION[1:], "order", "seq", "seglen", acked=acked, tail=tail
    )
    sacks = segments.filter(pl.col("sack_left").is_not_null()).select(
        "file", "ack", "sack_left", "sack_right", sack_order="order", **REVERSE
    )
    parts = {
        "tcp_sums": sums,
        "resends": resends,
        "dsacks": sacks.filter(_modular_diff(pl.col("sack_right"), pl.col("ack")) <= 0),  # a block below the ACK
        "sackers": sacks.select(DIRECTION).unique(),
    }
    return parts, _event(segments.filter("zero_window"), "zero window", _direction_label())


def _tcp_table(every: Callable[[str], pl.DataFrame]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The per-direction table, and the retransmissions' events, classified (see the module doc)."""
    resends, dsacks = every("resends"), every("dsacks")
    # a resend is matched with the D-SACK blocks over its 64 KB of sequence space, not with every block of
    # its direction: a lossy connection with thousands of each would have paired millions
    window, windows = 1 << 16, 1 << 16  # 64 KB, and as many of them in the 32-bit space
    first = pl.col("sack_left") // window
    touched = (
        pl.col("sack_left") % window + (pl.col("sack_right") - pl.col("sack_left")) % (1 << 32) + window - 1
    ) // window
    blocks = dsacks.with_columns(key=pl.int_ranges(first, first + touched)).explode("key")
    dsacked = (
        resends.select(*DIRECTION, "order", "seq", key=pl.col("seq") // window)
        .join(blocks.with_columns(pl.col("key") % windows), on=[*DIRECTION, "key"])
        .filter(
            pl.col("sack_order") > pl.col("order"),
            _modular_diff(pl.col("seq"), pl.col("sack_left")) >= 0,
            _modular_diff(pl.col("seq"), pl.col("sack_right")) < 0,
        )
        .select("order")
        .unique()
        .with_columns(dsacked=pl.lit(True))
    )
    sackers = every("sackers").unique().with_columns(uses_sack=pl.lit(True))
    resends = (
        resends.join(dsacked, on="order", how="left", maintain_order="left")
        .join(sackers, on=DIRECTION, how="left", maintain_order="left", nulls_equal=True)
        .with_columns(pl.col("dsacked", "uses_sack").fill_null(False))
    )
    kind = (
        pl.when(pl.col("acked") | pl.col("dsacked"))
        .then(pl.lit(TCP_SPURIOUS))
        .when(pl.col("tail") & ~pl.col("uses_sack"))
        .then(pl.lit(TCP_PROBE))
        .otherwise(pl.lit(TCP_LOSS))
    )
    resends = resends.with_columns(kind=kind)
    kinds = resends.group_by(DIRECTION).agg(
        loss_retransmissions=(pl.col("kind") == TCP_LOSS).sum(),
        tail_probes=(pl.col("kind") == TCP_PROBE).sum(),
        spurious_retransmissions=(pl.col("kind") == TCP_SPURIOUS).sum(),
    )
    counts = ["segments", "bytes", "retransmissions", "fast_retransmissions", "retransmitted_bytes"]
    sums = (
        every("tcp_sums")
        .group_by(DIRECTION)
        .agg(pl.col(*counts, "dup_acks", "zero_windows").sum(), pl.col("first").min(), pl.col("last").max())
    )
    kinds_named = ["loss_retransmissions", "tail_probes", "spurious_retransmissions"]
    table = (
        sums.join(kinds, on=DIRECTION, how="left", nulls_equal=True)
        .with_columns(pl.col(kinds_named).fill_null(0))
        .select(
            *DIRECTION,
            "segments",
            "bytes",
            "retransmissions",
            *kinds_named,
            "fast_retransmissions",
            "retransmitted_bytes",
            "dup_acks",
            "zero_windows",
            "first",
            "last",
        )
        .with_columns(
            retransmission_share=pl.col("retransmissions") / pl.col("segments").clip(lower_bound=1),
            flow=_direction_label(),
        )
    )
    label = _direction_label()
    events = pl.concat(
        _event(resends.filter(pl.col("kind") == k), k, label) for k in (TCP_LOSS, TCP_PROBE, TCP_SPURIOUS)
    )
    return table, events


def _modular_diff(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    """a - b for 32-bit sequence numbers, across a wrap."""
    return (a - b + (1 << 31)) % (1 << 32) - (1 << 31)


def _as_before(column: str) -> pl.Expr:
    """Whether `column` equals its value on the previous segment of the same direction."""
    return pl.col(column) == pl.col(column).shift(1).over(DIRECTION)


def _with_reverse_state(segments: pl.DataFrame, rtt: pl.DataFrame, ooo_window_ns: int) -> pl.DataFrame:
    """Add the other direction's last segment before each segment (its order, ack, time, whether it was
    a keep-alive) and the connection's out-of-order window (its handshake RTT when the handshake was
    captured, else `ooo_window_ns`)."""
    reverse = segments.select(
        "file",
        "order",
        **REVERSE,
        rev_order="order",
        rev_ack="ack",
        rev_ts="ts",
        rev_keepalive="keepalive",
    )
    segments = segments.join_asof(reverse, on="order", by=DIRECTION, strategy="backward", check_sortedness=False)
    return segments.join(rtt, on=DIRECTION, how="left", maintain_order="left").with_columns(
        ooo_window=pl.col("rtt").fill_null(ooo_window_ns), rev_keepalive=pl.col("rev_keepalive").fill_null(False)
    )
