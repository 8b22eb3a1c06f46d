"""Per-interval counter deltas and rates from successive dumps of the same host and port.

A counter series is one (host, source, node, port, counter). Between two successive
dumps of a series:

- "delta": the value rose (or stayed); delta = after - before.
- "saturated": a counter narrower than 64 bits stands at its maximum (2**bits - 1).
  IB PortCounters stop there instead of wrapping, so the increase is unknown: at least
  the distance to the maximum. No delta is given.
- "reset": the value went down, so the counter was cleared in between; delta = after
  is a lower bound (what counted since the clear).

Copies of one dump (same value within the same second) count once. A series with a single dump
gives one row, "since_clear": the value counts from the last
reset or reboot, over an unknown time that may or may not cover the run.

Rates divide by the interval between the dump times. PortXmitData and PortRcvData count
4-byte words; `delta_bytes` converts. `stall_share` is the share of the interval the
port could not send: PortXmitWait ticks times the tick length, or the pause duration
(µs) an mlx5 NIC reports per priority.
"""

from __future__ import annotations

import polars as pl

from tracelens.tables import RunTables

SERIES = ["host", "source", "node", "port", "counter"]

# What a counter says, as regexes over the names perfquery, sysfs, hw_counters and mlx5's
# ethtool -S use. KINDS lists them worst first; the rules and the report share them.
PHYSICAL = (
    r"^(?:SymbolErrorCounter|LinkErrorRecoveryCounter|PortRcvErrors|PortRcvRemotePhysicalErrors"
    r"|LocalLinkIntegrityErrors|ExcessiveBufferOverrunErrors|PortLocalPhysicalErrors|PortMalformedPktErrors"
    r"|PortBufferOverrunErrors|rx_symbol_err_phy|rx_pcs_symbol_err_phy|rx_crc_errors_phy)$"
)
LINK_DOWN = r"^(?:LinkDownedCounter|link_down_events_phy)$"
DISCARDS = r"^(?:PortXmitDiscards|rx_discards_phy|tx_discards_phy|rx_prio\d_(?:buf_discard|cong_discard|discards))$"
WAIT = r"^(?:PortXmitWait|[rt]x_prio\d_pause_duration)$"
SIGNALS = (
    r"^(?:[rt]x_prio\d_pause|[rt]x_pause_ctrl_phy|np_cnp_sent|"
    r"rp_cnp_handled|np_ecn_marked_roce_packets|rx_prio\d_marked)$"
)
CONGESTION = f"{DISCARDS}|{WAIT}|{SIGNALS}"
RDMA_ERRORS = (
    r"^(?:local_ack_timeout_err|out_of_sequence|packet_seq_err|implied_nak_seq_err|rnr_nak_retry_err"
    r"|req_transport_retries_exceeded)$"
)
KINDS = {
    "link down": LINK_DOWN,
    "physical errors": PHYSICAL,
    "discards": DISCARDS,
    "RDMA errors": RDMA_ERRORS,
    "blocked time": WAIT,
    "congestion signals": SIGNALS,
}


def kind_of(counter: pl.Expr) -> pl.Expr:
    """The KINDS name of a counter, else "traffic" or "other"."""
    (first, pattern), *rest = [*KINDS.items(), ("traffic", r"(?i)data|pkts|packets|bytes")]
    expr = pl.when(counter.str.contains(pattern)).then(pl.lit(first))
    for name, pattern in rest:
        expr = expr.when(counter.str.contains(pattern)).then(pl.lit(name))
    return expr.otherwise(pl.lit("other"))


WORD_COUNTERS = {"PortXmitData", "PortRcvData"}  # in units of 4 bytes
# PortXmitWait counts "ticks" whose length the IBTA leaves to the vendor. Assumed here:
# one tick is 4 ns (a stall share over 100% in a finding would expose a wrong guess).
XMIT_WAIT_TICK_S = 4e-9


def resolved_counters(tables: RunTables) -> pl.DataFrame:
    """ib_counters with `ca` filled in where a perfquery `Lid N` is a port listed by
    ibstat/ibstatus/ibv_devinfo on the same host (switch ports stay without a CA)."""
    counters = tables["ib_counters"]
    lids = (
        tables["ib_ports"]
        .filter(pl.col("lid").is_not_null() & (pl.col("lid") > 0) & pl.col("ca").is_not_null())
        .select("host", "lid", pl.col("ca").alias("_ca"), pl.col("port").alias("_port"))
        .unique(["host", "lid"])
    )
    joined = counters.join(lids, on=["host", "lid"], how="left", nulls_equal=False)
    return joined.with_columns(ca=pl.coalesce("ca", pl.when(pl.col("_port") == pl.col("port")).then("_ca"))).drop(
        "_ca", "_port"
    )


def _stall_seconds(counter: pl.Expr, delta: pl.Expr) -> pl.Expr:
    return (
        pl.when(counter == "PortXmitWait")
        .then(delta.cast(pl.Float64) * XMIT_WAIT_TICK_S)
        .when(counter.str.ends_with("_pause_duration"))
        .then(delta.cast(pl.Float64) * 1e-6)
    )


def counter_deltas(tables: RunTables) -> pl.DataFrame:
    """One row per series and interval (or per lone dump): before, after, delta, status, rates
    (the RunContext keeps it: every fabric rule and the report read the same result)."""
    rows = (
        resolved_counters(tables)
        .sort([*SERIES, "dump_ts", "file", "line"], nulls_last=True)
        .with_columns(_second=pl.col("dump_ts").dt.truncate("1s"))
        .unique([*SERIES, "_second", "value"], keep="first", maintain_order=True)  # one dump, copied twice
        .drop("_second")
    )
    value, before = pl.col("value"), pl.col("value").shift(1).over(SERIES)
    top = (pl.lit(2, pl.UInt64).pow(pl.col("bits").cast(pl.UInt64)) - 1).cast(pl.UInt64)
    saturated = (pl.col("bits") < 64) & (value == top)
    lone = pl.len().over(SERIES) == 1
    with_prev = rows.with_columns(
        before=before,
        start=pl.col("dump_ts").shift(1).over(SERIES),
        lone=lone,
        saturated=saturated,
    ).filter(pl.col("lone") | pl.col("before").is_not_null())
    status = (
        pl.when(pl.col("saturated"))
        .then(pl.lit("saturated"))
        .when(pl.col("lone"))
        .then(pl.lit("since_clear"))
        .when(value < pl.col("before"))
        .then(pl.lit("reset"))
        .otherwise(pl.lit("delta"))
    )
    delta = (
        pl.when(pl.col("status") == "saturated")
        .then(None)
        .when(pl.col("status").is_in(["since_clear", "reset"]))
        .then(value)
        .otherwise(value - pl.col("before"))
    )
    interval = (pl.col("dump_ts") - pl.col("start")).dt.total_microseconds() / 1e6
    counter = pl.col("counter")
    return (
        with_prev.with_columns(status=status)
        .with_columns(delta=delta, interval_s=pl.when(interval > 0).then(interval))
        .with_columns(
            rate_per_s=pl.col("delta").cast(pl.Float64) / pl.col("interval_s"),
            delta_bytes=pl.when(counter.is_in(list(WORD_COUNTERS)))
            .then(pl.col("delta") * 4)
            .when(counter.str.ends_with("_bytes"))
            .then(pl.col("delta")),
            stall_share=_stall_seconds(counter, pl.col("delta")) / pl.col("interval_s"),
        )
        .select(
            "host",
            "source",
            "node",
            "ca",
            "lid",
            "port",
            "counter",
            "bits",
            "start",
            pl.col("dump_ts").alias("end"),
            "interval_s",
            "before",
            pl.col("value").alias("after"),
            "delta",
            "status",
            "rate_per_s",
            "delta_bytes",
            "stall_share",
            "file",
            "line",
            "ts_quality",
        )
    )


PORT_KEY = ["host", "node", "ca", "port"]


def movements(deltas: pl.DataFrame) -> pl.DataFrame:
    """Per port and counter, what moved over all its intervals (counters that rose or are
    saturated only), worst kind first, then the biggest rate or value."""
    moved = deltas.filter((pl.col("status") == "saturated") | (pl.col("delta") > 0))
    ranks = {name: i for i, name in enumerate([*KINDS, "traffic", "other"])}
    return (
        moved.group_by(*PORT_KEY, "counter")
        .agg(
            pl.col("bits").first(),
            pl.col("after").max(),
            pl.col("delta").sum(),
            pl.col("delta_bytes").sum(),
            pl.col("interval_s").sum(),
            pl.col("stall_share").max(),
            saturated=(pl.col("status") == "saturated").any(),
            since_clear=pl.col("start").is_null().all(),
            reset=(pl.col("status") == "reset").any(),
            start=pl.col("start").min(),
            end=pl.col("end").max(),
        )
        .with_columns(kind=kind_of(pl.col("counter")))
        .with_columns(
            rank=pl.col("kind").replace_strict(ranks, return_dtype=pl.Int32),
            rate_per_s=pl.when(pl.col("interval_s") > 0).then(pl.col("delta") / pl.col("interval_s")),
        )
        # the counter's name breaks ties (equal deltas over equal intervals are common: CNPs sent and handled)
        .sort(
            "rank",
            pl.col("rate_per_s").fill_null(0),
            "delta",
            *PORT_KEY,
            "counter",
            descending=[False, True, True, *[False] * len(PORT_KEY), False],
            nulls_last=True,
        )
    )


def describe(move: dict) -> str:
    """A movements() row in words: `+7 (28/h)`, `saturated at 65535 ...`, `1 since the last clear`."""
    if move["saturated"]:
        return f"saturated at its {move['bits']}-bit maximum {move['after']} (increase unknown)"
    if move["since_clear"]:
        return f"{move['after']} since the last clear"
    text = f"+{move['delta']}"
    if move["stall_share"] is not None:
        text += f" ({move['stall_share']:.1%} of the time blocked)"
    elif move["delta_bytes"] and move["interval_s"]:
        text += f" ({move['delta_bytes'] / move['interval_s'] / 1e9:.3g} GB/s)"
    elif move["interval_s"]:
        text += f" ({move['delta'] / move['interval_s'] * 3600:.3g}/h)"
    if move["reset"]:
        text += " (cleared in between: at least this many)"
    return text
