"""Name the hosts behind capture addresses, from what NCCL printed about its interfaces.

NCCL logs the interface and address each process uses (`Bootstrap : Using
eth0:10.1.1.1<0>`, `NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.1.1.1<0>`,
`NET/Socket : Using [0]eth0:10.1.1.1<0>`); the NCCL ingest puts them in
`nccl_net` (what = bootstrap_if / oob_if / socket_if, address, host).
"""

from __future__ import annotations

import polars as pl

from tracelens.tables import RunTables

INTERFACE_ROWS = ("bootstrap_if", "oob_if", "socket_if")


def host_names(tables: RunTables) -> dict[str, str]:
    """IP address -> host name, for every address a process of the run said it uses."""
    rows = (
        tables.scan("nccl_net")
        .filter(pl.col("what").is_in(INTERFACE_ROWS), pl.col("address").is_not_null(), pl.col("host").is_not_null())
        .select("address", "host")
        .collect()
    )
    address = pl.col("address").str.replace(r"<\d+>$", "").str.replace(r"%.*$", "").str.strip_chars("[]")
    pairs = rows.select(address.alias("ip"), "host").unique(maintain_order=True)
    return dict(zip(pairs["ip"].to_list(), pairs["host"].to_list()))


def describe(ip: str, names: dict[str, str]) -> str:
    """`host (ip)` when the host is known, else the address."""
    return f"{names[ip]} ({ip})" if ip in names else ip
