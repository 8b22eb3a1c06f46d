"""Name the hosts behind capture addresses, from what the run printed about its interfaces.

NCCL logs the interface and address each process uses (`Bootstrap : Using
eth0:10.1.1.1<0>`, `NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.1.1.1<0>`,
`NET/Socket : Using [0]eth0:10.1.1.1<0>`); the NCCL ingest puts them in
`nccl_net` (what = bootstrap_if / oob_if / socket_if, address, host). A host's own
interface listing (`ip addr`, `ifconfig`) gives its addresses too. A capture address
that none of these ties to a host keeps its address, and the report says so.
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
    listed = (
        tables.scan("interfaces")
        .filter(pl.col("ipv4").is_not_null(), pl.col("host").is_not_null())
        .select(pl.col("ipv4").str.replace(r"/\d+$", "").alias("ip"), "host")
        .collect()
    )
    pairs = pl.concat([rows.select(address.alias("ip"), "host"), listed]).unique(maintain_order=True)
    return dict(zip(pairs["ip"].to_list(), pairs["host"].to_list()))


def untied(tables: RunTables, names: dict[str, str]) -> str:
    """A note when the run names hosts but some capture addresses could not be tied to any: findings
    about those addresses then name the addresses, and what would tie them."""
    hosts = tables.scan("steps").select("host").unique().collect()["host"].drop_nulls().to_list()
    if not hosts or not tables.height("packets"):
        return ""
    seen = tables.scan("packets").select(pl.concat([pl.col("src"), pl.col("dst")]).cast(pl.String).unique())
    loose = sorted(set(seen.collect().to_series().drop_nulls().to_list()) - set(names) - set(hosts))
    if not loose:
        return ""
    shown = ", ".join(loose[:6]) + (" ..." if len(loose) > 6 else "")
    return (
        f"The capture's addresses {shown} could not be tied to the run's hosts ({', '.join(sorted(hosts)[:6])}): "
        "nothing in the run says which host has which address; findings name the addresses. An interface "
        "listing of each host (`ip -br addr` into its folder) or NCCL's INIT lines would tie them."
    )


def describe(ip: str, names: dict[str, str]) -> str:
    """`host (ip)` when the host is known, else the address."""
    return f"{names[ip]} ({ip})" if ip in names else ip
