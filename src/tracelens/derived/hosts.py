"""Name the hosts behind capture addresses, from what the run printed about its interfaces and
about how its processes found each other.

NCCL logs the interface and address each process uses (`Bootstrap : Using
eth0:10.1.1.1<0>`, `NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.1.1.1<0>`,
`NET/Socket : Using [0]eth0:10.1.1.1<0>`); the NCCL ingest puts them in
`nccl_net` (what = bootstrap_if / oob_if / socket_if, address, host). A host's own
interface listing (`ip addr`, `ifconfig`) gives its addresses too. Without either (gloo, no
listing collected), the rendezvous does (`rendezvous`): the host that started PyTorch's c10d store
has the address its clients reached it at, and the launchers' master address is rank 0's host's.
With two hosts and a capture between two addresses, one tied ties the other. A capture address
that none of these ties to a host keeps its address, and the report says so.
"""

from __future__ import annotations

import polars as pl

from tracelens.tables import RunTables

INTERFACE_ROWS = ("bootstrap_if", "oob_if", "socket_if")
# an IP address of a host of the job: not a name, not loopback or the wildcard
_ROUTABLE = r"^(?:\d{1,3}\.){3}\d{1,3}$|:"
_LOCAL = r"^(?:127\.|0\.0\.0\.0$|::1?$)"


def _routable(address: pl.Expr) -> pl.Expr:
    return address.str.contains(_ROUTABLE) & ~address.str.contains(_LOCAL)


def host_names(tables: RunTables) -> dict[str, str]:
    """IP address -> host name, for every address a process of the run said it uses, or that its
    rendezvous or the capture's two ends tie to one host."""
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
    pairs = pl.concat([rows.select(address.alias("ip"), "host"), listed, _rendezvous(tables)]).unique(
        maintain_order=True
    )
    names = dict(zip(pairs["ip"].to_list(), pairs["host"].to_list()))
    return names | _the_other_end(tables, names)


def _rendezvous(tables: RunTables) -> pl.DataFrame:
    """(ip, host) from the rendezvous: the c10d store's address is its server's host, the master
    address rank 0's host; an address two hosts claim ties neither."""
    rows = tables.scan("rendezvous").filter(pl.col("host").is_not_null()).collect()
    if rows.height == 0:
        return pl.DataFrame(schema={"ip": pl.String, "host": pl.String})
    reached = rows.filter(pl.col("role") == "store_client", _routable(pl.col("address"))).select("port", "address")
    servers = rows.filter(pl.col("role") == "store_server").select("port", "host")
    store = servers.join(reached, on="port").select(ip="address", host="host")
    rank0 = tables.scan("steps").filter(pl.col("rank") == 0, pl.col("host").is_not_null()).select("host").unique()
    masters = rows.filter(pl.col("role") == "master", _routable(pl.col("address"))).select(ip="address").unique()
    ties = pl.concat([store, masters.join(rank0.collect(), how="cross")]).unique()
    return ties.filter(pl.col("host").n_unique().over("ip") == 1)


def _run_hosts(tables: RunTables) -> list[str]:
    """The hosts the ranks' logs name: those that log steps, and those that only rendezvoused (under
    DeepSpeed's default printing only rank 0 logs its steps)."""
    named = [tables.scan(name).select("host") for name in ("steps", "rendezvous")]
    return sorted(pl.concat(named).unique().collect()["host"].drop_nulls().to_list())


def _capture_ends(tables: RunTables) -> pl.Series:
    """Every address the capture's packets come from or go to."""
    ends = tables.scan("packets").select(pl.concat([pl.col("src"), pl.col("dst")]).cast(pl.String).alias("ip"))
    return ends.unique().collect()["ip"].drop_nulls()


def _the_other_end(tables: RunTables, names: dict[str, str]) -> dict[str, str]:
    """With two hosts and a capture between two addresses of which one is tied, the other address is
    the other host's."""
    hosts = set(_run_hosts(tables))
    if len(hosts) != 2 or not tables.height("packets"):
        return {}
    ends = _capture_ends(tables).to_frame().filter(_routable(pl.col("ip")))["ip"].to_list()
    tied = [ip for ip in ends if names.get(ip) in hosts]
    if len(ends) != 2 or len(tied) != 1:
        return {}
    (other,) = set(ends) - set(tied)
    (host,) = hosts - {names[tied[0]]}
    return {other: host}


def untied(tables: RunTables, names: dict[str, str]) -> str:
    """A note when the run names hosts but some capture addresses could not be tied to any: findings
    about those addresses then name the addresses, and what would tie them."""
    hosts = _run_hosts(tables)
    if not hosts or not tables.height("packets"):
        return ""
    loose = sorted(set(_capture_ends(tables).to_list()) - set(names) - set(hosts))
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
