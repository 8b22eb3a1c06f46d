"""Per-QP (RoCE) and per-flow (TCP) sequence analysis of the `packets` table, shared by rules and report.

Everything is computed from the table with polars expressions per flow, in
frame order; the RunContext (tracelens.derived) keeps the result, so the rules and
the report section pay for it once.

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

from dataclasses import dataclass

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
QP = ["file", "src", "dst", "dest_qp"]
# The columns the analysis reads (every frame's, RoCE's and TCP's own, the duplicate check's): a bucket is
# held with these alone (ts_text, msn, the FECN/BECN bits ... stay on disk: 194 -> 150 MB for 1.25M RoCE
# frames)
FRAME = ["file", "frame", "ts", "src", "dst", "length", "payload"]
ROCE_READ = ["ecn", "opcode", "dest_qp", "psn", "syndrome"]
TCP_READ = ["sport", "dport", "seq", "ack", "flags", "window", "sack_left", "sack_right"]
READ = [*FRAME, *ROCE_READ, *TCP_READ, "proto", "ip_id", "digest"]
# Worst first; ties broken by the flow's identity: group_by's order varies from run to run, the report must not.
QP_ORDER, QP_DESCENDING = ["trouble", "packets", "file", "src", "dst", "qp"], [True, True, False, False, False, False]
TCP_ORDER, TCP_DESCENDING = ["retransmission_share", "segments", *DIRECTION], [True, True] + [False] * len(DIRECTION)


@dataclass(frozen=True)
class PacketAnalysis:
    qps: pl.DataFrame  # one row per RoCE connection, worst first; `flow` names it as in `events`
    tcp: pl.DataFrame  # one row per TCP direction, worst first; `flow` names it as in `events`
    events: pl.DataFrame  # file, frame, ts, kind, flow, src, dst: every NAK, CNP, CE mark, retransmission, ...


TCP_LOSS, TCP_PROBE, TCP_SPURIOUS = "TCP retransmission", "TCP tail-loss probe", "TCP spurious retransmission"


def analyze(packets: Frame, windows: PacketWindows = PacketWindows()) -> PacketAnalysis:
    """The per-QP, per-flow and per-event analysis of `packets`, a bucket of host pairs at a time.

    Everything here is per connection, and the ingest puts every connection between two hosts of
    one capture, both ways, in one `bucket` (tracelens.ingest.pcap): the table, a lazy scan of
    Parquet written bucket by bucket in a run, is read and analysed one bucket at a time, so memory
    follows a bucket (about 250k packets), not the capture, and the results are the same as on
    the whole table. The RunContext keeps the result (ctx.packets): the events, the window
    signals, the rules and the report all read it there.
    """
    packets = packets.lazy()
    buckets = packets.select(pl.col("file").cast(pl.String), "bucket").unique().sort("file", "bucket").collect()
    # a filter on the bucket column as written (not a derived one) skips the other buckets' files unread
    parts = [
        _analyze(
            packets.filter(pl.col("bucket").eq_missing(bucket), pl.col("file") == file).select(READ).collect(), windows
        )
        for file, bucket in buckets.iter_rows()  # a table built by hand has no buckets: one, null
    ]
    text = pl.col(pl.Categorical).cast(pl.String)  # a capture's text columns are categorical; results join with others
    return PacketAnalysis(
        qps=pl.concat([p.qps for p in parts]).with_columns(text).sort(QP_ORDER, descending=QP_DESCENDING),
        tcp=pl.concat([p.tcp for p in parts]).with_columns(text).sort(TCP_ORDER, descending=TCP_DESCENDING),
        events=pl.concat([p.events for p in parts]).with_columns(text).sort("ts", "frame", "file", "kind", "flow"),
    )


def _analyze(packets: pl.DataFrame, windows: PacketWindows) -> PacketAnalysis:
    # a bucket of one capture is read in frame order: sorting it again copied every row (+580 MB for 2.5M)
    in_order = packets["file"].n_unique() <= 1 and packets["frame"].is_sorted()
    frames = _with_duplicates((packets if in_order else packets.sort("file", "frame")).with_row_index("order"), windows)
    kept = frames.select("proto", "duplicate")  # each protocol's frames copied with its own columns alone
    roce = frames.select("order", *FRAME, *ROCE_READ).filter(kept["proto"] == "roce", ~kept["duplicate"])
    tcp = frames.select("order", *FRAME, *TCP_READ).filter(kept["proto"] == "tcp", ~kept["duplicate"])
    roce_qps, roce_events = _roce(roce)
    tcp_flows, tcp_events = _tcp(tcp, windows)
    dups = _event(frames.filter(pl.col("duplicate")), "capture duplicate", _direction_label())
    return PacketAnalysis(roce_qps, tcp_flows, pl.concat([roce_events, tcp_events, dups]))


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


def _unwrapped(column: str, bits: int, over: list[str]) -> pl.Expr:
    """A sequence number made monotonic across wraps (mod 2**bits), relative to the flow's first."""
    mod, half = 1 << bits, 1 << (bits - 1)
    step = (pl.col(column).diff().over(over).fill_null(0) + half + mod) % mod - half
    return step.cum_sum().over(over)


def _event(frames: pl.DataFrame, kind: str, flow: pl.Expr) -> pl.DataFrame:
    return frames.select("file", "frame", "ts", pl.lit(kind).alias("kind"), flow.alias("flow"), "src", "dst")


def _direction_label() -> pl.Expr:
    return pl.format("{}:{} → {}:{}", "src", "sport", "dst", "dport")


# -- RoCE ---------------------------------------------------------------------------------------


def _roce(frames: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    cnp = pl.col("opcode").is_in(CNP_OPCODES)
    response = pl.col("opcode").is_in(ACK_OPCODES)
    data = _roce_data(frames.filter(~cnp, ~response))
    responses = frames.filter(response | cnp).with_columns(
        cnp=cnp,
        nak_seq=pl.col("syndrome") == NAK_PSN_SEQUENCE,
        nak_other=(pl.col("syndrome") > NAK_PSN_SEQUENCE) & (pl.col("syndrome") & 0x60 == 0x60),
        rnr=pl.col("syndrome") & 0x60 == 0x20,
    )
    # responses travel responder -> requester; seen from the data direction they answer:
    answers = _pair(responses, data).with_columns(src=pl.col("dst"), dst=pl.col("src"), qp=pl.col("pair_qp"))
    qp_names = {qp: f"0x{qp:06x}" for qp in data["qp"].unique().to_list()}
    label = pl.format("{} → {} QP {}", "src", "dst", pl.col("qp").replace_strict(qp_names, default="?"))
    qps = _roce_table(data, answers).with_columns(flow=label)
    events = [
        _event(answers.filter("nak_seq"), "NAK (PSN sequence error)", label),
        _event(answers.filter("nak_other"), "NAK (other)", label),
        _event(answers.filter("rnr"), "RNR NAK", label),
        _event(answers.filter("cnp"), "CNP", label),
        _event(data.filter(pl.col("ecn") == 3), "ECN-CE", label),
        _event(data.filter(pl.col("missing") > 0), "PSN gap", label),
        _event(data.filter("retransmitted"), "RoCE retransmission", label),
    ]
    return qps, pl.concat(events)


def _roce_data(data: pl.DataFrame) -> pl.DataFrame:
    """Data packets per QP with their PSN fate: retransmitted, or how many PSNs are missing before them."""
    rel = _unwrapped("psn", 24, QP)
    highest = rel.cum_max().shift(1).over(QP)
    return data.with_columns(qp=pl.col("dest_qp"), rel_psn=rel).with_columns(
        retransmitted=(pl.col("rel_psn") <= highest).fill_null(False),
        missing=(pl.col("rel_psn") - highest - 1).clip(lower_bound=0).fill_null(0),
    )


def _pair(responses: pl.DataFrame, data: pl.DataFrame) -> pl.DataFrame:
    """Give each response the data QP it answers (same hosts reversed).

    An ACK or NAK carries a PSN of the data it answers: the nearest data QP by PSN wins.
    A CNP carries no PSN of the flow, but it is addressed to the throttled requester's own
    QP, as that requester's ACKs and NAKs are: it takes their pairing, or the only data QP
    between the two hosts; with several QPs and no ACK to go by it stays unattributed.
    """
    keys = data.group_by("file", "src", "dst", "qp").agg(data_psn=pl.col("psn").median())
    wrap = 1 << 24
    acks = (
        responses.filter(~pl.col("cnp"))
        .select("file", "src", "dst", "dest_qp", "psn")
        .unique()
        .join(keys, left_on=["file", "src", "dst"], right_on=["file", "dst", "src"])
        .with_columns(distance=((pl.col("psn") - pl.col("data_psn")).abs() % wrap))
        .with_columns(distance=pl.min_horizontal("distance", wrap - pl.col("distance")))
        .sort("distance")
        .unique(["file", "src", "dst", "dest_qp", "psn"], keep="first")
        .select("file", "src", "dst", "dest_qp", "psn", pair_qp="qp")
    )
    by_requester_qp = acks.group_by("file", "src", "dst", "dest_qp").agg(by_ack=pl.col("pair_qp").mode().min())
    only_qp = (
        keys.group_by("file", "src", "dst")
        .agg(only=pl.col("qp").first(), n=pl.len())
        .filter(pl.col("n") == 1)
        .select("file", src="dst", dst="src", only="only")
    )
    cnps = (
        responses.filter("cnp")
        .join(by_requester_qp, on=["file", "src", "dst", "dest_qp"], how="left")
        .join(only_qp, on=["file", "src", "dst"], how="left")
        .with_columns(pair_qp=pl.coalesce("by_ack", "only"))
        .drop("by_ack", "only")
    )
    answered = responses.filter(~pl.col("cnp")).join(
        acks, on=["file", "src", "dst", "dest_qp", "psn"], how="left", nulls_equal=True
    )
    return pl.concat([answered, cnps], how="diagonal_relaxed")


def _roce_table(data: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    sent = data.group_by("file", "src", "dst", "qp").agg(
        packets=pl.len(),
        bytes=pl.col("length").sum(),
        retransmitted=pl.col("retransmitted").sum(),
        retransmitted_bytes=pl.col("payload").filter("retransmitted").sum(),
        psn_gaps=(pl.col("missing") > 0).sum(),
        missing_psns=pl.col("missing").sum(),
        ce_marked=(pl.col("ecn") == 3).sum(),
        first=pl.col("ts").min(),
        last=pl.col("ts").max(),
    )
    answered = (
        answers.filter(pl.col("qp").is_not_null())
        .group_by("file", "src", "dst", "qp")
        .agg(
            peer_qp=pl.col("dest_qp").filter(~pl.col("cnp")).first(),
            naks_seq=pl.col("nak_seq").sum(),
            naks_other=pl.col("nak_other").sum(),
            rnr_naks=pl.col("rnr").sum(),
            cnps=pl.col("cnp").sum(),
        )
    )
    delays = _nak_to_resend(data, answers)
    table = sent.join(answered, on=["file", "src", "dst", "qp"], how="left").join(
        delays, on=["file", "src", "dst", "qp"], how="left"
    )
    counts = ["naks_seq", "naks_other", "rnr_naks", "cnps"]
    table = table.with_columns(
        pl.col(counts).fill_null(0).cast(pl.Int64), ce_share=pl.col("ce_marked") / pl.col("packets")
    )
    trouble = pl.sum_horizontal("retransmitted", "missing_psns", *counts, "ce_marked") / pl.col("packets")
    return table.with_columns(trouble=trouble)


def _nak_to_resend(data: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    """Per QP, the median time from a NAK (sequence error or RNR) to the resend of the PSN it names."""
    naks = answers.filter(pl.col("nak_seq") | pl.col("rnr"), pl.col("qp").is_not_null())
    named = ["file", "src", "dst", "qp", "psn"]
    # only the data packets of the PSNs a NAK names can be its resend: the as-of join grouped every
    # packet by its PSN (a bucket of one 5M-packet QP peaked 200-300 MB higher)
    nakked = naks.select(named).unique()
    resent = data.select("order", *named, "ts").join(
        nakked, on=named, how="semi", nulls_equal=True, maintain_order="left"
    )
    joined = naks.select("order", *named, nak_ts="ts").join_asof(
        resent,
        on="order",
        by=named,
        strategy="forward",
        check_sortedness=False,  # sorted by "order" within each group
    )
    return joined.group_by("file", "src", "dst", "qp").agg(
        nak_to_resend_ms=((pl.col("ts") - pl.col("nak_ts")).dt.total_nanoseconds() / 1e6).median()
    )


# -- TCP ----------------------------------------------------------------------------------------


def _tcp(frames: pl.DataFrame, windows: PacketWindows) -> tuple[pl.DataFrame, pl.DataFrame]:
    flags = pl.col("flags")
    seglen = pl.col("payload").fill_null(0) + (flags & SYN > 0).cast(pl.Int64) + (flags & FIN > 0).cast(pl.Int64)
    control = flags & (SYN | FIN | RST) > 0
    segments = frames.filter(pl.col("seq").is_not_null(), flags.is_not_null()).with_columns(
        seglen=seglen, rel=_unwrapped("seq", 32, DIRECTION)
    )
    end = pl.col("rel") + pl.col("seglen")
    nextseq = end.cum_max().shift(1).over(DIRECTION)
    advanced = pl.col("nextseq").is_null() | (end > pl.col("nextseq"))
    keepalive = (pl.col("seglen") <= 1) & (pl.col("rel") == pl.col("nextseq") - 1) & ~control
    segments = segments.with_columns(nextseq=nextseq).with_columns(
        nextseq_ts=pl.when(advanced).then(pl.col("ts")).forward_fill().shift(1).over(DIRECTION),
        keepalive=keepalive.fill_null(False),
    )
    segments = _with_reverse_state(segments, windows.ns("out_of_order_ms"))
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
    # (a window per run of one ack held a group per ack value: +430 MB for a connection of 5M segments)
    run_starts = (~_as_before("ack")).fill_null(True)
    so_far = pl.col("dup_ack").cum_sum().over(DIRECTION)
    before_run = pl.when(run_starts).then(so_far - pl.col("dup_ack")).forward_fill().over(DIRECTION)
    segments = segments.with_columns(dup_ack=dup_ack).with_columns(dup_acks_so_far=so_far - before_run)
    candidate = (pl.col("seglen") > 0) & (pl.col("rel") < pl.col("nextseq")) & ~pl.col("keepalive")
    segments = segments.with_columns(candidate=candidate.fill_null(False)).join(
        segments.select(rev_order="order", rev_dup_acks="dup_acks_so_far"),
        on="rev_order",
        how="left",
        maintain_order="left",
    )
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
    segments = _classified(segments)
    table = (
        segments.group_by(DIRECTION)
        .agg(
            segments=(pl.col("seglen") > 0).sum(),
            bytes=pl.col("payload").sum(),
            retransmissions=pl.col("retransmission").sum(),
            loss_retransmissions=(pl.col("retransmission_kind") == TCP_LOSS).sum(),
            tail_probes=(pl.col("retransmission_kind") == TCP_PROBE).sum(),
            spurious_retransmissions=(pl.col("retransmission_kind") == TCP_SPURIOUS).sum(),
            fast_retransmissions=pl.col("fast").sum(),
            retransmitted_bytes=pl.col("retransmitted_bytes").sum(),
            dup_acks=pl.col("dup_ack").sum(),
            zero_windows=pl.col("zero_window").sum(),
            first=pl.col("ts").min(),
            last=pl.col("ts").max(),
        )
        .with_columns(
            retransmission_share=pl.col("retransmissions") / pl.col("segments").clip(lower_bound=1),
            flow=_direction_label(),
        )
    )
    label = _direction_label()
    events = pl.concat(
        [
            *(
                _event(segments.filter(pl.col("retransmission_kind") == kind), kind, label)
                for kind in (TCP_LOSS, TCP_PROBE, TCP_SPURIOUS)
            ),
            _event(segments.filter("zero_window"), "zero window", label),
        ]
    )
    return table, events


def _modular_diff(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    """a - b for 32-bit sequence numbers, across a wrap."""
    return (a - b + (1 << 31)) % (1 << 32) - (1 << 31)


def _classified(segments: pl.DataFrame) -> pl.DataFrame:
    """Add `retransmission_kind` (TCP_LOSS, TCP_PROBE, TCP_SPURIOUS, or null) to every segment (see the module doc)."""
    end = pl.col("rel") + pl.col("seglen")
    # the receiver's cumulative ACK before the resend already covers it
    acked = _modular_diff(pl.col("rev_ack"), pl.col("seq")) >= pl.col("seglen")
    reverse = ["file", "src", "sport", "dst", "dport"]
    sacks = segments.filter(pl.col("sack_left").is_not_null()).select(
        "file", "order", "ack", "sack_left", "sack_right", src="dst", sport="dport", dst="src", dport="sport"
    )
    dsacks = sacks.filter(_modular_diff(pl.col("sack_right"), pl.col("ack")) <= 0)  # a block below the ACK: a D-SACK
    retx = segments.filter("retransmission").select(*reverse, "order", "seq", "seglen")
    dsacked = (
        retx.join(dsacks.rename({"order": "sack_order"}), on=reverse)
        .filter(
            pl.col("sack_order") > pl.col("order"),
            _modular_diff(pl.col("seq"), pl.col("sack_left")) >= 0,
            _modular_diff(pl.col("seq"), pl.col("sack_right")) < 0,
        )
        .select("order")
        .unique()
        .with_columns(dsacked=pl.lit(True))
    )
    uses_sack = sacks.select(*reverse).unique().with_columns(uses_sack=pl.lit(True))
    segments = (
        segments.join(dsacked, on="order", how="left", maintain_order="left")
        .join(uses_sack, on=reverse, how="left", maintain_order="left")
        .with_columns(pl.col("dsacked", "uses_sack").fill_null(False))
    )
    tail = (end >= pl.col("nextseq")) & ~pl.col("fast") & (pl.col("rev_dup_acks").fill_null(0) < 1)
    kind = (
        pl.when(~pl.col("retransmission"))
        .then(pl.lit(None, pl.String))
        .when(acked.fill_null(False) | pl.col("dsacked"))
        .then(pl.lit(TCP_SPURIOUS))
        .when(tail & ~pl.col("uses_sack"))
        .then(pl.lit(TCP_PROBE))
        .otherwise(pl.lit(TCP_LOSS))
    )
    return segments.with_columns(retransmission_kind=kind).drop("dsacked", "uses_sack")


def _as_before(column: str) -> pl.Expr:
    """Whether `column` equals its value on the previous segment of the same direction."""
    return pl.col(column) == pl.col(column).shift(1).over(DIRECTION)


def _with_reverse_state(segments: pl.DataFrame, ooo_window_ns: int) -> pl.DataFrame:
    """Add the other direction's last segment before each segment (its order, ack, time, whether it was
    a keep-alive) and the connection's out-of-order window (its handshake RTT when the handshake was
    captured, else `ooo_window_ns`)."""
    reverse = segments.select(
        "file",
        "order",
        src="dst",
        sport="dport",
        dst="src",
        dport="sport",
        rev_order="order",
        rev_ack="ack",
        rev_ts="ts",
        rev_keepalive="keepalive",
    )
    segments = segments.join_asof(reverse, on="order", by=DIRECTION, strategy="backward", check_sortedness=False)
    syn = (pl.col("flags") & (SYN | ACK)) == SYN
    handshake = segments.group_by(DIRECTION).agg(
        syn_ts=pl.col("ts").filter(syn).first(),
        ack_ts=pl.col("ts").filter(pl.col("flags") & (SYN | ACK) == ACK).first(),
    )
    rtt = handshake.select(*DIRECTION, rtt=(pl.col("ack_ts") - pl.col("syn_ts")).dt.total_nanoseconds()).filter(
        pl.col("rtt") > 0
    )
    both_ways = pl.concat(
        [rtt, rtt.select("file", "rtt", src="dst", sport="dport", dst="src", dport="sport")], how="diagonal"
    )
    return segments.join(both_ways, on=DIRECTION, how="left", maintain_order="left").with_columns(
        ooo_window=pl.col("rtt").fill_null(ooo_window_ns), rev_keepalive=pl.col("rev_keepalive").fill_null(False)
    )
