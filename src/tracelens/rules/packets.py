"""TL301-TL305: what packet captures show: RoCE loss, RNR NAKs, congestion, TCP retransmissions, capture artefacts."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.flows import TCP_LOSS, PacketAnalysis
from tracelens.derived.hosts import describe
from tracelens.findings import Finding, Severity
from tracelens.findings.evidence import row_evidence, time_window
from tracelens.prose import count, during, number
from tracelens.rules import Setting, rule


def _finding(ctx: RunContext, title: str, summary: str, events: pl.DataFrame, addresses: tuple[str, ...]) -> Finding:
    """A finding about `addresses` ({} in `summary` become `host (ip)`), its window and evidence from `events`."""
    names = ctx.host_names
    window = time_window(events)
    when = f" {during(*window)}" if window else ""
    return Finding(
        severity=Severity.WARNING,
        title=title,
        summary=summary.format(*(describe(a, names) for a in addresses)) + when + ".",
        evidence=row_evidence(
            events.sort("ts", "frame").iter_rows(named=True), text=lambda r: f"{r['kind']}: {r['flow']}"
        ),
        hosts=[names.get(a, a) for a in addresses],
        window=window,
    )


def _events(analysis: PacketAnalysis, flow: str, *kinds: str) -> pl.DataFrame:
    return analysis.events.filter(pl.col("flow") == flow, pl.col("kind").is_in(kinds))


def _qps_above(ctx: RunContext, share: float, *counts: str) -> Iterator[tuple[PacketAnalysis, dict]]:
    """RoCE QPs whose `counts` together exceed `share` of their data packets, worst first."""
    analysis = ctx.packets
    if analysis is None:
        return
    over = analysis.qps.filter(pl.sum_horizontal(counts) > share * pl.col("packets"))
    for qp in over.iter_rows(named=True):
        yield analysis, qp


@rule(
    "TL301",
    "roce-packet-loss",
    Severity.WARNING,
    needs=("packets",),
    settings={
        "loss_share": Setting(
            "share of a QP's data packets",
            "NAKs and PSN gaps above this share of a QP's packets are loss; "
            "RoCE is meant to be lossless, so one in 1000 is already a problem.",
        ),
    },
)
def roce_loss(ctx: RunContext, *, loss_share: float = 0.001) -> Iterator[Finding]:
    """
    What it finds: RoCE QPs in a packet capture that lose packets: NAKs with syndrome 0x60
    (PSN sequence error) and gaps in the PSNs of a QP's data, above 0.1% of its packets,
    with the go-back-N retransmissions that follow and the time from NAK to resend.

    Why it slows the run: RoCE assumes a lossless fabric. Each loss makes the requester go
    back and resend everything from the lost PSN (go-back-N), after a NAK round trip or,
    for a lost tail, after the QP's ACK timeout (4.096 us x 2^NCCL_IB_TIMEOUT); NCCL's
    collectives wait for the slowest QP, so one lossy link slows every rank.

    How to fix: find where the drops happen: `ethtool -S <iface> | grep -E
    'discard|drop|out_of_buffer'` and the switch port counters, and check PFC is enabled on
    the RoCE priority end to end (`mlnx_qos -i <iface>` shows `pfc` on the priority NCCL
    uses, `NCCL_IB_TC`/DSCP mapped to it). Replace cables or optics with symbol or FEC errors
    (`perfquery -x`, `mlxlink -d <dev> -m`).
    """
    for analysis, qp in _qps_above(ctx, loss_share, "naks_seq", "psn_gaps"):
        delay = f", {qp['nak_to_resend_ms']:.3f} ms from NAK to resend" if qp["nak_to_resend_ms"] is not None else ""
        yield _finding(
            ctx,
            "RoCE packet loss",
            f"QP 0x{qp['qp']:06x} from {{}} to {{}}: {count(qp['naks_seq'], 'NAK')} "
            f"with PSN sequence error and {count(qp['missing_psns'], 'missing PSN')} in "
            f"{count(qp['packets'], 'packet')}; {count(qp['retransmitted'], 'packet')} "
            f"({number(qp['retransmitted_bytes'], 'payload bytes')}) resent{delay}",
            _events(analysis, qp["flow"], "NAK (PSN sequence error)", "PSN gap", "RoCE retransmission"),
            (qp["src"], qp["dst"]),
        )


@rule("TL302", "roce-rnr-nak", Severity.WARNING, needs=("packets",))
def roce_rnr(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: RNR NAKs (AETH syndrome 0x20-0x3F, receiver not ready) on a RoCE QP in a
    packet capture: the responder had no receive buffer posted when a SEND arrived.

    Why it slows the run: the requester must wait the RNR timer (the 5-bit code in the
    syndrome, 0.01 to 655 ms) before it resends, and with `rnr_retry` exhausted the QP fails
    with `IBV_WC_RNR_RETRY_EXC_ERR`. The sender is fine; the receiving side is behind.

    How to fix: on the receiving side: a process that is slow to post receives (an
    overloaded or stalled rank, CPU starved proxy thread, or a custom plugin or application
    using SEND/RECV with too few receive buffers); check that host's CPU and the rank's step
    times, raise the receive queue depth, and keep the QP's `min_rnr_timer` and `rnr_retry`
    (7 = retry forever) high enough.
    """
    for analysis, qp in _qps_above(ctx, 0, "rnr_naks"):
        yield _finding(
            ctx,
            "RoCE receiver not ready (RNR NAKs)",
            f"QP 0x{qp['qp']:06x} from {{}} to {{}}: {count(qp['rnr_naks'], 'RNR NAK')} from the receiving side in "
            f"{count(qp['packets'], 'packet')}",
            _events(analysis, qp["flow"], "RNR NAK"),
            (qp["src"], qp["dst"]),
        )


@rule(
    "TL303",
    "roce-congestion",
    Severity.WARNING,
    needs=("packets",),
    settings={
        "marked_share": Setting(
            "share of a QP's data packets",
            "CNPs and ECN-CE marks above this share of a QP's packets are DCQCN throttling more than now and then.",
        ),
    },
)
def roce_congestion(ctx: RunContext, *, marked_share: float = 0.01) -> Iterator[Finding]:
    """
    What it finds: congestion notifications on a RoCE QP in a packet capture: data packets
    marked ECN-CE (IP ECN = 11) by a switch and CNPs (BTH opcode 0x81) sent back to throttle
    the sender, more than 1 per 100 data packets.

    Why it slows the run: each CNP makes the sender's NIC cut its rate (DCQCN) and recover
    only slowly; steady marking means a congested link or an incast, and the QP runs far
    below line rate. If marking is too late or PFC is off, the same congestion becomes loss.

    How to fix: check the ECN/PFC configuration end to end: the RoCE traffic class
    (`NCCL_IB_TC`, DSCP) maps to a lossless priority with ECN marking on every switch, the
    NIC's DCQCN is enabled (`/sys/class/net/<iface>/ecn/roce_np|roce_rp/enable/<prio>`,
    `mlnx_qos`), and CNPs go on their own high priority (`cnp_dscp`, `cnp_802p_prio`). Then
    look for oversubscribed uplinks or an unbalanced ECMP hash (many QPs on one path):
    `NCCL_IB_QPS_PER_CONNECTION` and `NCCL_IB_SPLIT_DATA_ON_QPS` spread the traffic.
    """
    for analysis, qp in _qps_above(ctx, marked_share, "cnps", "ce_marked"):
        yield _finding(
            ctx,
            "RoCE congestion (ECN-CE marks, CNPs)",
            f"QP 0x{qp['qp']:06x} from {{}} to {{}}: {qp['ce_marked']} of {qp['packets']} data packets "
            f"ECN-CE marked ({qp['ce_share']:.1%}) and {count(qp['cnps'], 'CNP')} sent back to throttle the sender",
            _events(analysis, qp["flow"], "ECN-CE", "CNP"),
            (qp["src"], qp["dst"]),
        )


@rule(
    "TL304",
    "tcp-retransmissions",
    Severity.WARNING,
    needs=("packets",),
    settings={
        "loss_share": Setting(
            "share of data segments",
            "Loss-driven retransmissions at or above this share of a host pair's "
            "segments are a warning (where TCP's throughput bound halves on a training link).",
        ),
        "critical_share": Setting("share of data segments", "At or above this share the finding is critical."),
        "min_losses": Setting(
            "retransmissions", "Fewer loss-driven retransmissions between two hosts say nothing about a rate."
        ),
    },
)
def tcp_retransmissions(
    ctx: RunContext, *, loss_share: float = 0.001, critical_share: float = 0.01, min_losses: int = 3
) -> Iterator[Finding]:
    """
    What it finds: TCP segments lost between two hosts (all their connections together: NCCL's
    socket transport and gloo open several per peer), measured by the loss-driven
    retransmissions of a packet capture: fast retransmissions, timeouts, and tail-loss probes
    that repaired a lost tail. Tail-loss probes on a healthy connection and spurious resends
    (the receiver already had the bytes: acknowledged before, or D-SACKed after) are counted
    apart and not taken for loss, nor are capture duplicates. It fires at 0.1% of the data
    segments (warning) and at 1% (critical), with at least 3 loss-driven retransmissions.

    Why it slows the run: a TCP connection's throughput falls with the square root of its loss
    rate p: at most 1.22 x MSS / (RTT x sqrt(p)) (Mathis, Semke, Mahdavi and Ott, "The
    macroscopic behavior of the TCP congestion avoidance algorithm", 1997). For a training link
    (1448-byte MSS, 100 us round trip) that bound is 4.5 Gb/s at p = 0.1%, under half of a
    10 Gb/s link, and 1.4 Gb/s at 1%: the thresholds above are where loss alone halves, then
    cuts to a seventh, the socket transport's throughput; on faster links the same loss costs
    more. Each loss also costs a fast-retransmit round trip at best and an RTO (200 ms minimum
    on Linux) at worst, and the collective waits for the slowest connection.

    How to fix: find the loss: `ethtool -S <iface>` drops and errors on both hosts, `ip -s
    link`, `nstat -az | grep -i retrans` (TcpExtTCPLossProbes against TcpRetransSegs), switch
    port counters; for IPoIB check the mode and MTU agree on both sides (`cat
    /sys/class/net/ib0/mode`). If NCCL should not be on TCP at all, see TL101. Zero windows
    instead point at a receiving process that does not read.
    """
    analysis = ctx.packets
    if analysis is None:
        return
    counts = [
        "segments",
        "retransmissions",
        "loss_retransmissions",
        "tail_probes",
        "spurious_retransmissions",
        "fast_retransmissions",
        "retransmitted_bytes",
        "zero_windows",
    ]
    pairs = (
        analysis.tcp.group_by("src", "dst")
        .agg(pl.col(counts).sum(), flows=pl.col("flow"))
        .filter(
            pl.col("loss_retransmissions") >= min_losses,
            pl.col("loss_retransmissions") >= loss_share * pl.col("segments"),
        )
        .sort("loss_retransmissions", "src", "dst", descending=[True, False, False])  # equal losses by address
    )
    for pair in pairs.iter_rows(named=True):
        events = analysis.events.filter(
            pl.col("flow").is_in(pair["flows"]), pl.col("kind").is_in([TCP_LOSS, "zero window"])
        )
        share = pair["loss_retransmissions"] / pair["segments"]
        finding = _finding(
            ctx,
            "TCP segments lost",
            f"{{}} to {{}}: {pair['retransmissions']} of {pair['segments']} data segments retransmitted "
            f"({pair['retransmissions'] / pair['segments']:.1%}, as tshark counts them), "
            f"{number(pair['loss_retransmissions'])} of them after a loss ({share:.2%}, "
            f"{pair['fast_retransmissions']} fast); not counted as loss: "
            f"{count(pair['tail_probes'], 'tail-loss probe')} and "
            f"{count(pair['spurious_retransmissions'], 'spurious retransmission')}; "
            f"{number(pair['retransmitted_bytes'], 'bytes')} resent over {count(len(pair['flows']), 'connection')}, "
            f"{count(pair['zero_windows'], 'zero window')}",
            events,
            (pair["src"], pair["dst"]),
        )
        finding.severity = Severity.CRITICAL if share >= critical_share else Severity.WARNING
        yield finding


@rule("TL305", "capture-duplicates", Severity.INFO, needs=("packets",))
def capture_duplicates(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: frames that appear twice in a capture: the same IP id and the same bytes,
    less than half a millisecond apart, as when a mirrored port or two capture points see
    the same packet. Wireshark flags them as retransmissions and duplicate ACKs.

    Why it slows the run: it does not: the network sent the packet once. It is noted so that
    nobody blames the network for "retransmissions" that are an artefact of the capture;
    tracelens leaves these frames out of the loss and retransmission counts.

    How to fix: nothing on the cluster. For cleaner captures, capture on one point only (not
    both a mirror port and the host), or deduplicate first (`editcap -d in.pcap out.pcap`).
    """
    analysis = ctx.packets
    if analysis is None:
        return
    duplicates = analysis.events.filter(pl.col("kind") == "capture duplicate")
    totals = dict(ctx.captures.select("file", "frames").iter_rows())
    for (file,), frames in duplicates.group_by("file", maintain_order=True):
        total = totals[file]
        yield Finding(
            severity=Severity.INFO,
            title="Duplicate frames in the capture",
            summary=f"{file}: {frames.height} of {total} frames are capture duplicates (same IP id and bytes "
            "as the frame before, < 0.5 ms apart), not retransmissions.",
            evidence=row_evidence(
                frames.iter_rows(named=True), text=lambda r: f"duplicate of the previous frame of {r['flow']}"
            ),
            window=time_window(frames),
        )
