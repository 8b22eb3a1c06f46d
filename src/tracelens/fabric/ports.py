"""HCA ports as the dumps last saw them, and the ranks behind each port.

NCCL names the HCAs each process uses (`NET/IB : Using [0]mlx5_0:1/IB ...`, table
nccl_net, what="ib_device"); the communicator lines give each process's rank
(nccl_comms, by host and pid). Together they tell which ranks a port carries.
"""

from __future__ import annotations

import polars as pl

from tracelens.tables import RunTables

PORT = ["host", "ca", "port"]


def latest_ports(tables: RunTables) -> pl.DataFrame:
    """One row per (host, ca, port): the last dump's view (ibstat, ibstatus or ibv_devinfo)."""
    ports = tables["ib_ports"].filter(pl.col("ca").is_not_null())
    return ports.sort("ts", "file", "line", nulls_last=False).unique(PORT, keep="last").sort(PORT)


def port_ranks(tables: RunTables) -> pl.DataFrame:
    """(host, ca, port, rank) for every rank whose NCCL process uses that HCA port."""
    devices = (
        tables["nccl_net"]
        .filter(pl.col("what") == "ib_device")
        .select("host", pl.col("name").alias("ca"), "port", "pid")
    )
    comms = tables["nccl_comms"].select("host", "pid", "rank").drop_nulls().unique()
    return devices.join(comms, on=["host", "pid"]).select(*PORT, "rank").unique().sort(*PORT, "rank")


def ranks_on(tables: RunTables, host: str | None, ca: str | None, port: int | None) -> list[int]:
    """The ranks using one HCA port (a port NCCL names without a number matches any)."""
    ranks = port_ranks(tables).filter(
        pl.col("host").eq_missing(host) & pl.col("ca").eq_missing(ca) & (pl.col("port").is_null() | pl.col("port").eq_missing(port))
    )
    return ranks["rank"].to_list()


def nccl_devices(tables: RunTables) -> pl.DataFrame:
    """(host, ca) pairs NCCL reports using."""
    return (
        tables["nccl_net"].filter(pl.col("what") == "ib_device")
        .select("host", pl.col("name").alias("ca")).unique()
    )
