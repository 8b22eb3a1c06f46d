"""NCCL facts per host: versions, ranks, networks, HCAs, transports per channel, settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 30
TITLE = "NCCL per host"
TEMPLATE = "sections/nccl.html.j2"


_INTERFACE_ROLES = {"bootstrap_if": "bootstrap", "oob_if": "IB out-of-band", "socket_if": "socket transport"}


SHOWN = {
    "nccl_comms": ["host", "rank"],
    "nccl_channels": ["host", "transport", "net", "gdr"],
    "nccl_net": ["host", "what", "name", "address", "port", "link_layer"],
    "nccl_env": ["host", "name", "value"],
}


def _sorted_unique(frame: pl.DataFrame, column: str) -> list:
    return sorted(v for v in frame[column].unique().to_list() if v is not None)


def _gdr_label(value: bool | None) -> str:
    return "" if value is None else "yes" if value else "no"


def _on_host(frame: pl.DataFrame, host: str | None) -> pl.DataFrame:
    """The rows of `host`; for None, the rows no host was named for."""
    return frame.filter(pl.col("host") == host) if host is not None else frame.filter(pl.col("host").is_null())


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """NCCL facts per host; None when no NCCL line was read."""
    t = ctx.tables
    if t.height("nccl_events") == 0:
        return None
    # the communicator, channel, network and setting tables read for the columns shown (a big run's are big)
    comms, channels, net, env = (
        ctx.scan(name).select(columns).collect(engine="streaming") for name, columns in SHOWN.items()
    )
    # one row per line: read for its processes per host and its version lines only
    events = ctx.scan("nccl_events")
    pids = pl.col("pid")
    processes = (
        events.group_by("host")
        .agg(n=pl.when(pids.null_count() < pl.len()).then(pids.n_unique()).otherwise(0))
        .collect(engine="streaming")
    )
    version_lines = events.filter(pl.col("kind") == "version").select("host", "message").collect(engine="streaming")
    hosts = []
    for host in _sorted_unique(processes, "host") or [None]:
        h_net = _on_host(net, host)
        versions = _on_host(version_lines, host)["message"].str.extract(r"(\d+\.\d+\.\d+\S*)").drop_nulls()
        transports = (
            _on_host(channels, host)
            .group_by("transport", "net", "gdr")
            .len()
            # ties by name
            .sort("len", "transport", "net", "gdr", descending=[True, False, False, False], nulls_last=True)
            .rows(named=True)
        )
        interfaces = (
            h_net.filter(pl.col("what").is_in(list(_INTERFACE_ROLES)))
            .select(
                pl.format("{} {} ({})", pl.col("what").replace_strict(_INTERFACE_ROLES), "name", "address").alias("x")
            )["x"]
            .unique(maintain_order=True)
            .to_list()
        )
        hcas = (
            h_net.filter(pl.col("what") == "ib_device")
            .select(pl.format("{}:{}/{}", "name", "port", "link_layer").alias("x"))["x"]
            .unique(maintain_order=True)
            .to_list()
        )
        hosts.append(
            {
                "host": host or "(host not named)",
                "versions": sorted(set(versions.to_list())),
                "ranks": _sorted_unique(_on_host(comms, host), "rank"),
                "processes": _on_host(processes, host)["n"].sum(),
                "networks": _sorted_unique(h_net.filter(pl.col("what") == "network"), "name"),
                "hcas": hcas,
                "interfaces": interfaces,
                "errors": _on_host(t["nccl_errors"], host).height,
                "transports": [
                    {"transport": r["transport"], "net": r["net"], "gdr": _gdr_label(r["gdr"]), "n": r["len"]}
                    for r in transports
                ],
                "settings": _on_host(env, host)
                .unique(["name", "value"])
                .sort("name", "value")  # a setting whose value differs across the host's processes: by value
                .select("name", "value")
                .rows(named=True),
            }
        )
    return {"hosts": hosts}
