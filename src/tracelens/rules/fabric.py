"""TL201-TL206: the InfiniBand/RoCE fabric: link errors, link flaps, drops and congestion,
RDMA retransmissions, degraded ports, RoCE on the wrong priority.

The counter rules read the context's `counter_deltas`: what a counter did between two dumps of a port,
or, for a port dumped once, its value since the counters were last cleared. A rise
between dumps is tied to the run (warning or worse); a value since the last clear
covers an unknown time, maybe months before the run, so it is only info.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.counters import (
    CONGESTION,
    DISCARDS,
    LINK_DOWN,
    PHYSICAL,
    PORT_KEY,
    RDMA_ERRORS,
    WAIT,
    describe,
    movements,
)
from tracelens.derived.ports import nccl_devices, port_label, ranks_on
from tracelens.findings import Finding, Severity
from tracelens.findings.evidence import evidence, row_evidence
from tracelens.prose import during
from tracelens.rules import Setting, rule


def _rising(deltas: pl.DataFrame, pattern: str) -> pl.DataFrame:
    """Rows of counters matching `pattern` that went up (or sit saturated)."""
    rows = deltas.filter(pl.col("counter").str.contains(pattern))
    return rows.filter((pl.col("status") == "saturated") | (pl.col("delta") > 0))


def _in_run(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows measured between two dumps (not values since the last clear)."""
    return rows.filter(pl.col("start").is_not_null())


def _counter(row: Mapping[str, Any]) -> str:
    return f"{row['counter']}: {row['after']}" + (f" (was {row['before']})" if row["before"] is not None else "")


def _port_findings(
    ctx: RunContext, rows: pl.DataFrame, title: str, severity_of: Callable[[pl.DataFrame], Severity]
) -> Iterator[Finding]:
    """One finding per port among `rows`; its severity from the in-run rows, info if none."""
    moves = movements(rows)
    for (host, node, ca, port), group in rows.group_by(PORT_KEY, maintain_order=True):
        in_run = _in_run(group)
        mine = moves.filter(
            pl.all_horizontal(pl.col(c).eq_missing(v) for c, v in zip(PORT_KEY, (host, node, ca, port)))
        )
        phrases = [f"{m['counter']} {describe(m)}" for m in mine.iter_rows(named=True)]
        window = (in_run["start"].min(), in_run["end"].max()) if in_run.height else None
        when = (
            f" {during(*window)}"
            if window
            else " (one dump: not tied to the run; dump before and after the run to measure it)"
        )
        yield Finding(
            severity=severity_of(in_run) if in_run.height else Severity.INFO,
            title=title,
            summary=f"{port_label(host, node, ca, port)}: {'; '.join(phrases)}{when}.",
            evidence=evidence(group, _counter),
            hosts=[host] if host else [],
            ranks=ranks_on(ctx.port_ranks, host, ca, port),
            window=window,
        )


@rule("TL201", "link-physical-errors", Severity.WARNING, needs=("ib_counters",))
def physical_errors(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: physical-layer error counters rising on an HCA or switch port between
    two dumps: SymbolErrorCounter, LinkErrorRecoveryCounter, PortRcvErrors,
    PortRcvRemotePhysicalErrors, LocalLinkIntegrityErrors, ExcessiveBufferOverrunErrors
    (perfquery, sysfs counters), the -E details, and the mlx5 PHY counters
    (rx_symbol_err_phy, rx_crc_errors_phy). A 16/8/4-bit counter pinned at its maximum is
    reported as saturated. A port dumped only once is reported as info.

    Why it slows the run: a marginal cable or transceiver corrupts packets; the receiver
    drops them (PortRcvErrors) and the RC transport only recovers after an ACK timeout,
    so collectives stall for milliseconds to seconds and steps show periodic spikes.
    Link retraining (LinkErrorRecovery) stalls the port outright. PortRcvRemotePhysicalErrors
    points at a bad link further upstream.

    How to fix: reseat or replace the cable or transceiver of the named port (check both
    ends; on a switch port, the link to the neighbour); clear the counters with
    `perfquery -R <lid> <port>` and watch SymbolErrorCounter and PortRcvErrors with
    `perfquery -x <lid> <port>` under load, or run `ibdiagnet` for the whole fabric; drain
    the node from the scheduler until the counters stay at zero.
    """
    yield from _port_findings(
        ctx,
        _rising(ctx.counter_deltas, PHYSICAL),
        "Physical-layer errors on a port",
        lambda rows: Severity.WARNING,
    )


@rule("TL202", "link-down", Severity.CRITICAL, needs=("ib_counters",))
def link_down(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: a port whose link went down between two dumps: LinkDownedCounter
    (perfquery, sysfs) or link_down_events_phy (ethtool -S) rising. Once-dumped ports
    with a non-zero count are info (it may date from a reboot long before the run).

    Why it slows the run: while the link is down every queue pair through it stops;
    NCCL's transfers time out (`transport retry counter exceeded`, status 12), the
    communicator aborts or the job hangs until the watchdog fires. A flapping cable
    does this again and again.

    How to fix: check the port's state and its error counters (`ibstat`, `perfquery -x`,
    `ethtool -S <netdev> | grep -E "link_down|symbol"`), reseat or replace the cable or
    transceiver, and look at the switch log for the port. Keep the node out of jobs until
    the link has stayed up under load.
    """
    yield from _port_findings(
        ctx, _rising(ctx.counter_deltas, LINK_DOWN), "Link went down", lambda rows: Severity.CRITICAL
    )


def _congestion_severity(rows: pl.DataFrame, wait_warns: float) -> Severity:
    dropped = rows.filter(pl.col("counter").str.contains(DISCARDS)).height > 0
    blocked = (
        rows.filter(
            pl.col("counter").str.contains(WAIT)
            & ((pl.col("stall_share") >= wait_warns) | (pl.col("status") == "saturated"))
        ).height
        > 0
    )
    return Severity.WARNING if dropped or blocked else Severity.INFO


@rule(
    "TL203",
    "port-discards-congestion",
    Severity.WARNING,
    needs=("ib_counters",),
    settings={
        "wait_noted": Setting(
            "share of the interval", "PortXmitWait or pause time below this share of an interval is normal."
        ),
        "wait_warns": Setting(
            "share of the interval", "Blocked time at or above this share makes the finding a warning."
        ),
    },
)
def discards_congestion(ctx: RunContext, *, wait_noted: float = 0.01, wait_warns: float = 0.05) -> Iterator[Finding]:
    """
    What it finds: drops and congestion on a port: PortXmitDiscards and the mlx5 discard
    counters (rx_discards_phy, rx_prioN_buf_discard / cong_discard); PortXmitWait as a
    share of the interval the port had data but no credits to send (1% and up; a tick is
    taken as 4 ns); pause frames and pause time (rx/tx_prioN_pause, _pause_duration);
    CNPs sent or handled and ECN-marked packets (np_cnp_sent, rp_cnp_handled,
    np_ecn_marked_roce_packets). Drops, or blocking 5% of the time or more, are warnings.

    Why it slows the run: congestion (incast in the all-reduce, a hot spine link, a slow
    receiver) holds packets back: the port waits for credits or pause frames, DCQCN cuts
    the sender's rate on every CNP, and bus bandwidth falls while no error is logged.
    Discards are real loss in a lossless fabric; each one costs a retransmission timeout.

    How to fix: find the hot link by comparing PortXmitWait per second across ports
    (`perfquery -x` on the switch ports along the path); spread traffic (adaptive routing
    on the switches, `NCCL_IB_QPS_PER_CONNECTION=4`, `NCCL_IB_SPLIT_DATA_ON_QPS=1`), check
    that the fabric is not oversubscribed for this job's placement; on RoCE check PFC and
    ECN settings on the NIC (`mlnx_qos -i <netdev>`) and the switch, and that RoCE uses the
    lossless priority (`NCCL_IB_TC`, `NCCL_IB_SL`).
    """
    rows = _rising(ctx.counter_deltas, CONGESTION)
    waits = pl.col("counter").str.contains(WAIT)
    noted = (pl.col("start").is_null()) | (pl.col("status") == "saturated") | (pl.col("stall_share") >= wait_noted)
    rows = rows.filter(~waits | noted)
    yield from _port_findings(
        ctx, rows, "Drops or congestion on a port", lambda rows: _congestion_severity(rows, wait_warns)
    )


@rule("TL204", "rdma-retransmissions", Severity.WARNING, needs=("ib_counters",))
def rdma_retransmissions(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: RDMA transport error counters of an HCA port rising (sysfs
    hw_counters / `rdma statistic`): local_ack_timeout_err, out_of_sequence,
    packet_seq_err, implied_nak_seq_err, rnr_nak_retry_err, req_transport_retries_exceeded.

    Why it slows the run: each one is a lost or late packet the RC transport had to
    recover. out_of_sequence / packet_seq_err mean loss followed by a go-back-N resend;
    local_ack_timeout_err means nothing came back and the sender waited a full ACK
    timeout (4.096 µs × 2^NCCL_IB_TIMEOUT, seconds at the default) before resending: the
    classic cause of periodic multi-second step spikes. Retries exceeded end in an NCCL error.

    How to fix: find where packets are lost: physical errors and discards on the ports
    along the path (`perfquery -x`, TL201/TL203), on RoCE a lossy priority or PFC off
    (`ethtool -S <netdev> | grep prio`, `mlnx_qos -i <netdev>`). Keep `NCCL_IB_TIMEOUT`
    at its default (do not raise it to hide loss) and `NCCL_IB_RETRY_CNT` at 7.
    """
    yield from _port_findings(
        ctx,
        _rising(ctx.counter_deltas, RDMA_ERRORS),
        "RDMA retransmissions on a port",
        lambda rows: Severity.WARNING,
    )


def _number(value: pl.Expr) -> pl.Expr:
    """`400` rather than `400.0`; `2.5` stays."""
    text = value.cast(pl.String)
    return pl.when(text.str.ends_with(".0")).then(text.str.strip_suffix(".0")).otherwise(text)


def _below_peers(ports: pl.DataFrame, column: pl.Expr, name: str, unit: str = "") -> pl.Series:
    """A text for ports whose `column` is below the most common value among active ports of the same link layer."""
    active = ports.filter(pl.col("state") == "Active").with_columns(_v=column).drop_nulls("_v")
    norms = active.group_by("link_layer").agg(_norm=pl.col("_v").mode().max(), _n=pl.len())
    return (
        ports.with_columns(_v=column)
        .join(norms, on="link_layer", how="left", nulls_equal=True)
        .select(
            pl.when((pl.col("_n") > 1) & (pl.col("_v") < pl.col("_norm"))).then(
                pl.format(
                    f"{name} {{}}{unit} where the other ports have {{}}{unit}",
                    _number(pl.col("_v")),
                    _number(pl.col("_norm")),
                )
            )
        )
        .to_series()
    )


@rule("TL205", "port-degraded", Severity.WARNING, needs=("ib_ports",))
def port_degraded(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: HCA ports (ibstat, ibstatus, ibv_devinfo) that are not Active/LinkUp,
    or active at a lower rate, a narrower width or a smaller active_mtu than most ports of
    the same link layer in the run. Down ports NCCL does not use are info.

    Why it slows the run: NCCL spreads rings and trees over all HCAs and every step
    waits for the slowest link: one port trained at 100 Gb/s among 400 Gb/s ports, or at
    1X width, caps the whole all-reduce; a port that is down takes its GPUs' traffic onto
    another HCA across PCIe/SMP. A small MTU (1024 on RoCE) multiplies packet overhead.

    How to fix: reseat or replace the cable/transceiver of a downshifted or down port and
    check it comes back at full speed (`ibstat`, `ibv_devinfo -v`: active_width,
    active_speed); check the switch port settings; for RoCE set the netdev MTU to 4200 or
    more (`ip link set <netdev> mtu 9000`) so active_mtu becomes 4096; exclude a broken
    HCA with `NCCL_IB_HCA` until it is repaired.
    """
    ports = ctx.latest_ports
    if ports.height == 0:
        return
    width = pl.col("width").str.extract(r"(\d+)").cast(pl.Int32)
    problems = pl.DataFrame(
        {
            "state": ports.select(
                pl.when(pl.col("state").is_not_null() & (pl.col("state") != "Active"))
                .then(pl.format("state {}", pl.col("state")))
                .when(pl.col("phys_state").is_not_null() & (pl.col("phys_state") != "LinkUp"))
                .then(pl.format("physical state {}", pl.col("phys_state")))
            ).to_series(),
            "rate": _below_peers(ports, pl.col("rate_gbps"), "rate", " Gb/s"),
            "width": _below_peers(ports, width, "width", "X"),
            "mtu": _below_peers(ports, pl.col("active_mtu"), "active_mtu"),
        }
    )
    used = nccl_devices(ctx.tables)
    for port, issues in zip(ports.iter_rows(named=True), problems.iter_rows()):
        found = [i for i in issues if i]
        if not found:
            continue
        nccl_on_host = used.filter(pl.col("host").eq_missing(port["host"]))
        unused = nccl_on_host.height > 0 and port["ca"] not in nccl_on_host["ca"].to_list()
        down_only = issues[0] and not any(issues[1:])
        yield Finding(
            severity=Severity.INFO if unused and down_only else Severity.WARNING,
            title="Port down or running below its peers",
            summary=f"{port_label(port['host'], None, port['ca'], port['port'])}: {'; '.join(found)}"
            + (" (NCCL does not use it)." if unused else "."),
            evidence=row_evidence(
                [port], text=lambda p: f"{p['ca']} port {p['port']}: {p['state']}, {p['rate_gbps']} Gb/s"
            ),
            hosts=[port["host"]] if port["host"] else [],
            ranks=ranks_on(ctx.port_ranks, port["host"], port["ca"], port["port"]),
        )


PRIO_BYTES = r"^[rt]x_prio(\d)_bytes$"
PRIO_PAUSE = r"^[rt]x_prio[1-7]_pause$"


@rule(
    "TL206",
    "roce-priority-zero",
    Severity.WARNING,
    needs=("ib_counters",),
    settings={
        "zero_share": Setting(
            "share of the NIC's bytes",
            "A NIC with at least this share of its per-priority bytes on priority 0 carries its RoCE traffic there.",
        ),
    },
)
def roce_priority(ctx: RunContext, *, zero_share: float = 0.99) -> Iterator[Finding]:
    """
    What it finds: a RoCE NIC (ethtool -S per-priority counters) whose traffic is all on
    priority 0 while other NICs of the run carry traffic or pause frames on another
    priority, i.e. a lossless (PFC) priority is configured in the fabric but this NIC's
    RoCE traffic does not use it.

    Why it slows the run: priority 0 is usually lossy: under congestion the switch drops
    RoCE packets instead of pausing the sender, and every drop costs a go-back-N resend
    or an ACK timeout. RoCE bandwidth then collapses to a fraction of line rate.

    How to fix: put RoCE traffic on the lossless priority: `NCCL_IB_TC` (e.g. 106 for
    DSCP 26 / priority 3, as the fabric defines it) or the NIC's default with
    `cma_roce_tos -d <dev> -t 106`; trust DSCP on the NIC (`mlnx_qos -i <netdev> --trust dscp`)
    and enable PFC on that priority (`mlnx_qos -i <netdev> --pfc 0,0,0,1,0,0,0,0`); check
    again with `ethtool -S <netdev> | grep prio`.
    """
    deltas = ctx.counter_deltas.filter(pl.col("source") == "ethtool")
    prio = deltas.filter(pl.col("counter").str.contains(PRIO_BYTES)).with_columns(
        prio=pl.col("counter").str.extract(PRIO_BYTES).cast(pl.Int32)
    )
    nic = ["host", "node"]
    shares = prio.group_by(nic, maintain_order=True).agg(
        total=pl.col("delta").sum(), on_zero=pl.col("delta").filter(pl.col("prio") == 0).sum()
    )
    others = prio.filter((pl.col("prio") > 0) & (pl.col("delta") > 0)).select(*nic, "counter", "file", "line")
    paused = _rising(deltas, PRIO_PAUSE).select(*nic, "counter", "file", "line")
    lossless = pl.concat([others, paused])
    for nic_row in shares.filter((pl.col("total") > 0) & (pl.col("on_zero") >= pl.col("total") * zero_share)).iter_rows(
        named=True
    ):
        elsewhere = lossless.filter(
            ~(pl.col("host").eq_missing(nic_row["host"]) & pl.col("node").eq_missing(nic_row["node"]))
        )
        if elsewhere.height == 0:
            continue
        mine = prio.filter(
            pl.col("host").eq_missing(nic_row["host"])
            & pl.col("node").eq_missing(nic_row["node"])
            & (pl.col("prio") == 0)
        )
        yield Finding(
            severity=Severity.WARNING,
            title="RoCE traffic on priority 0 while the fabric has a lossless priority",
            summary=(
                f"{port_label(nic_row['host'], nic_row['node'], None, None) or 'a NIC'}: "
                f"{nic_row['on_zero'] / nic_row['total']:.0%} of {nic_row['total']} bytes on priority 0, while "
                f"{elsewhere['counter'][0]} moves on "
                f"{port_label(elsewhere['host'][0], elsewhere['node'][0], None, None) or 'another NIC'}."
            ),
            evidence=evidence(mine, _counter) + row_evidence(elsewhere.iter_rows(named=True), 3, "counter"),
            hosts=[nic_row["host"]] if nic_row["host"] else [],
        )
