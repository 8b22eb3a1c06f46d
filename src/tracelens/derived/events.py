"""Network events of every source on one UTC time axis: what the correlation rules (TL41x) join
by time, and what the report's timeline draws in its lanes.

One row per event, from the tables the timeline has aligned:

- NCCL: every WARN or error line (nccl_errors) and the first line of each process that chose
  the socket network; [lo, hi] is the line's time bracket (tracelens.timeline).
- counters: every counter that rose between two dumps of a port (fabric.deltas), except
  traffic (derived.counters); [lo, hi] is the interval between the dumps, `count` the rise.
- packets: every NAK, PSN gap, retransmission, CNP, ECN-CE mark, RNR NAK and zero window the
  flow analysis found (derived.flows); lo = hi = the frame's time.
- kernel: the host's kernel log records of its NIC: link down, transmit timeouts (a bad link),
  firmware/health errors; lo = hi = the record's time, `port` the netdev.

`cause` says what an event is a sign of (CAUSES); `host` and `peer` are the two ends where
known (capture addresses named after the hosts NCCL says use them), `port` an HCA port as
`mlx5_1:1` (or a netdev).

The counter deltas, packet analysis and host names are the RunContext's (it passes them in), so
nothing here is computed a second time.
"""

from __future__ import annotations

import polars as pl

from tracelens.derived.counters import kind_of
from tracelens.derived.flows import PacketAnalysis
from tracelens.derived.hostsignals import KIND_TEXT
from tracelens.tables import RunTables

CAUSES = {
    "link": "a bad link (packet loss, link errors)",
    "congestion": "fabric congestion",
    "socket": "NCCL on TCP sockets",
    "receiver": "a slow receiver",
    "failure": "NCCL communication failures",
    "stall": "a stalled collective",
    "straggler": "a slow rank (straggler)",  # from the step timers, not the network (rules.correlate)
}

_NCCL_CAUSE = {
    "ib_completion": "link", "ib_async_event": "link",
    "watchdog_timeout": "stall", "blocking_wait_timeout": "stall", "watchdog_exception": "stall",
    "watchdog_abort": "stall", "watchdog_stuck": "stall",
}  # fmt: skip
# nccl_errors kinds that are no incident: foreign traffic NCCL dropped, the subnet manager's own events,
# a plugin's set-up notice that GPUDirect RDMA is off
_NCCL_NO_INCIDENT = ["foreign_connection", "ib_sm_event", "gdr_disabled"]
_COUNTER_CAUSE = {
    "link down": "link",
    "physical errors": "link",
    "RDMA errors": "link",
    "discards": "congestion",
    "blocked time": "congestion",
    "congestion signals": "congestion",
}
_PACKET_CAUSE = {
    "NAK (PSN sequence error)": "link", "PSN gap": "link", "RoCE retransmission": "link", "TCP retransmission": "link",
    "NAK (other)": "failure",
    "CNP": "congestion", "ECN-CE": "congestion",
    "RNR NAK": "receiver", "zero window": "receiver",
}  # fmt: skip
_KERNEL_CAUSE = {"link_down": "link", "tx_timeout": "link", "nic_error": "failure"}
BLOCKED_NOTED = 0.01  # PortXmitWait or pause time under this share of an interval is normal
# RDMA error counters (out_of_sequence, local_ack_timeout_err ...) count at both ends of a lossy
# path, where physical errors count at the bad port only: they weigh less in locating the link.
SYMPTOM_STRENGTH = 0.5

SCHEMA = {
    "source": pl.String, "cause": pl.String, "what": pl.String, "host": pl.String, "peer": pl.String, "port": pl.String,
    "lo": pl.Datetime("ns", "UTC"), "hi": pl.Datetime("ns", "UTC"), "count": pl.Int64, "strength": pl.Float64,
    "file": pl.String, "line": pl.Int64, "frame": pl.Int64, "text": pl.String,
}  # fmt: skip


def network_events(
    tables: RunTables, deltas: pl.DataFrame, packets: PacketAnalysis | None, names: dict[str, str]
) -> pl.DataFrame:
    """Every network event of the run (columns SCHEMA), in time order; events without a time are left
    out. `deltas`, `packets` and `names`: the run's counter deltas, packet analysis and host names."""
    # ties stay in source order
    return _timed([_nccl(tables, names), _counters(deltas), _packets(packets, names), _kernel(tables)]).sort(
        "lo", "source", maintain_order=True
    )


def kernel_network_events(tables: RunTables) -> pl.DataFrame:
    """The network events of the hosts' kernel logs alone (columns SCHEMA), in time order."""
    return _timed([_kernel(tables)]).sort("lo", maintain_order=True)  # records of one second in log order


def _timed(parts: list[pl.DataFrame]) -> pl.DataFrame:
    frame = pl.concat(
        [
            p.select([pl.col(c).cast(t) if c in p.columns else pl.lit(None, t).alias(c) for c, t in SCHEMA.items()])
            for p in parts
        ]
    )
    return frame.filter(pl.col("lo").is_not_null())


def port_name(ca: pl.Expr, node: pl.Expr, port: pl.Expr) -> pl.Expr:
    """`mlx5_1:1`; the node (a Lid or a netdev) when the CA is unknown."""
    return (
        pl.when(port.is_not_null())
        .then(pl.format("{}:{}", pl.coalesce(ca, node), port))
        .otherwise(pl.coalesce(ca, node))
    )


def _peer_host(peer: pl.Expr, names: dict[str, str]) -> pl.Expr:
    """A peer `10.0.0.2<47125>` as its host name when NCCL said which host uses that address."""
    ip = peer.str.replace(r"<\d+>$", "").str.replace(r"%.*$", "").str.strip_chars("[]")
    return ip.replace(names) if names else ip


def _nccl(tables: RunTables, names: dict[str, str]) -> pl.DataFrame:
    kind = pl.col("kind").str.replace_all("_", " ").str.replace("^ib ", "IB ")
    errors = tables["nccl_errors"].filter(~pl.col("kind").is_in(_NCCL_NO_INCIDENT))
    errors = errors.select(
        pl.lit("NCCL").alias("source"),
        pl.col("kind").replace_strict(_NCCL_CAUSE, default="failure").alias("cause"),
        pl.coalesce(pl.format("{} ({})", kind, "status_name"), kind).alias("what"),
        "host",
        _peer_host(pl.col("peer"), names).alias("peer"),
        pl.col("ts_lo").alias("lo"),
        pl.col("ts_hi").alias("hi"),
        pl.lit(1).alias("count"),
        "file",
        "line",
        pl.col("message").alias("text"),
    )
    return pl.concat([errors, _socket_choice(tables)], how="diagonal_relaxed")


def _socket_choice(tables: RunTables) -> pl.DataFrame:
    """The first line of each process that chose NCCL's socket network (`Using network Socket`,
    `NET/IB : No device found`); channels `via NET/Socket` where no process says so, since both
    ends of a connection to a socket host list it."""
    chose = (
        tables.scan("nccl_net")
        .filter(
            ((pl.col("what") == "network") & (pl.col("name").str.to_lowercase() == "socket"))
            | (pl.col("what") == "ib_missing")
        )
        .collect()
    )
    if chose.height == 0:
        chose = (
            tables.scan("nccl_channels")
            .filter(pl.col("transport") == "NET", pl.col("net").str.to_lowercase() == "socket")
            .collect()
        )
    return tables.with_text(
        chose.sort("file", "line").unique(["host", "pid"], keep="first", maintain_order=True)
    ).select(
        pl.lit("NCCL").alias("source"),
        pl.lit("socket").alias("cause"),
        pl.lit("NCCL on NET/Socket").alias("what"),
        "host",
        pl.col("ts_lo").alias("lo"),
        pl.col("ts_hi").alias("hi"),
        pl.lit(1).alias("count"),
        "file",
        "line",
        pl.col("message").alias("text"),
    )


INT64_MAX = 2**63 - 1  # a counter delta beyond it (an all-ones 64-bit counter) counts as the most there can be


def _counters(deltas: pl.DataFrame) -> pl.DataFrame:
    deltas = deltas.filter(pl.col("start").is_not_null())
    moved = deltas.with_columns(kind=kind_of(pl.col("counter"))).filter(
        pl.col("kind").is_in(list(_COUNTER_CAUSE)),
        (pl.col("status") == "saturated") | (pl.col("delta") > 0),
        (pl.col("kind") != "blocked time") | (pl.col("stall_share") >= BLOCKED_NOTED),
    )
    return moved.select(
        pl.lit("counters").alias("source"),
        pl.col("kind").replace_strict(_COUNTER_CAUSE).alias("cause"),
        pl.when(pl.col("kind") == "RDMA errors").then(SYMPTOM_STRENGTH).otherwise(1.0).alias("strength"),
        pl.col("counter").alias("what"),
        "host",
        port_name(pl.col("ca"), pl.col("node"), pl.col("port")).alias("port"),
        pl.col("start").alias("lo"),
        pl.col("end").alias("hi"),
        pl.col("delta").fill_null(1).cast(pl.Int64, strict=False).fill_null(INT64_MAX).alias("count"),
        "file",
        "line",
        pl.format("{}: {} (was {})", "counter", "after", "before").alias("text"),
    )


def _packets(packets: PacketAnalysis | None, names: dict[str, str]) -> pl.DataFrame:
    if packets is None:
        return pl.DataFrame()
    events = packets.events.filter(pl.col("kind").is_in(list(_PACKET_CAUSE)))
    name = (lambda c: pl.col(c).replace(names)) if names else pl.col
    return events.select(
        pl.lit("packets").alias("source"),
        pl.col("kind").replace_strict(_PACKET_CAUSE).alias("cause"),
        pl.col("kind").alias("what"),
        name("src").alias("host"),
        name("dst").alias("peer"),
        pl.col("ts").alias("lo"),
        pl.col("ts").alias("hi"),
        pl.lit(1).alias("count"),
        "file",
        "frame",
        pl.format("{}: {}", "kind", "flow").alias("text"),
    )


def _kernel(tables: RunTables) -> pl.DataFrame:
    rows = tables["kernel_events"].filter(pl.col("kind").is_in(list(_KERNEL_CAUSE)))
    return rows.select(
        pl.lit("kernel").alias("source"),
        pl.col("kind").replace_strict(_KERNEL_CAUSE).alias("cause"),
        pl.col("kind").replace_strict(KIND_TEXT).alias("what"),
        "host",
        pl.coalesce("netdev", "device").alias("port"),
        pl.col("ts").alias("lo"),
        pl.col("ts").alias("hi"),
        pl.lit(1).alias("count"),
        "file",
        "line",
        pl.col("message").alias("text"),
    )
