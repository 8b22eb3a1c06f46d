"""HCA ports as the dumps last saw them, and the ranks behind each port.

NCCL names the HCAs each process uses (`NET/IB : Using [0]mlx5_0:1/IB ...`, table
nccl_net, what="ib_device"); the communicator lines give each process's rank
(nccl_comms, by host and pid). Together they tell which ranks a port carries.
"""

from __future__ import annotations

import polars as pl

from tracelens.tables import RunTables

PORT = ["host", "ca", "port"]


def port_label(host: str | None, node: str | None, ca: str | None, port: int | None) -> str:
    """`node01 mlx5_0 port 1 (Lid 12)`, `Lid 2052 port 1`, `node01 ens1f0` ..."""
    where = " ".join(p for p in (host, ca or node, f"port {port}" if port is not None else None) if p)
    return where + (f" ({node})" if ca and node and node != ca else "")


def latest_ports(tables: RunTables) -> pl.DataFrame:
    """One row per (host, ca, port): the last dump's view (ibstat, ibstatus or ibv_devinfo)."""
    ports = tables["ib_ports"].filter(pl.col("ca").is_not_null())
    return ports.sort("ts", "file", "line", nulls_last=False).unique(PORT, keep="last").sort(PORT)


def port_ranks(tables: RunTables) -> pl.DataFrame:
    """(host, ca, port, rank) for every rank whose NCCL process uses that HCA port."""
    devices = (
        tables.scan("nccl_net")
        .filter(pl.col("what") == "ib_device")
        .select("host", pl.col("name").alias("ca"), "port", "pid")
        .collect()
    )
    comms = tables.scan("nccl_comms").select("host", "pid", "rank").drop_nulls().unique().collect(engine="streaming")
    return devices.join(comms, on=["host", "pid"]).select(*PORT, "rank").unique().sort(*PORT, "rank")


def ranks_on(port_ranks: pl.DataFrame, host: str | None, ca: str | None, port: int | None) -> list[int]:
    """The ranks using one HCA port (a port NCCL names without a number matches any), from `port_ranks`."""
    ranks = port_ranks.filter(
        pl.col("host").eq_missing(host)
        & pl.col("ca").eq_missing(ca)
        & (pl.col("port").is_null() | pl.col("port").eq_missing(port))
    )
    return ranks["rank"].to_list()


def nccl_devices(tables: RunTables) -> pl.DataFrame:
    """(host, ca) pairs NCCL reports using."""
    devices = tables.scan("nccl_net").filter(pl.col("what") == "ib_device")
    return devices.select("host", pl.col("name").alias("ca")).collect().unique()
