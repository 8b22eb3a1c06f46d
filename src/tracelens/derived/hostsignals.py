"""Signals from the host evidence that rules and report sections share: GPU utilisation in
a window against the run's own baseline, the line rate of each host's ports, the networks
interfaces share, and the kernel events that matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from ipaddress import IPv4Interface

import polars as pl

from tracelens.prose import count
from tracelens.tables import RunTables

INCIDENT_KINDS = (
    "link_down",
    "link_up",
    "tx_timeout",
    "pcie_aer",
    "xid",
    "nic_error",
    "oom_kill",
    "soft_lockup",
    "hung_task",
)
KIND_TEXT = {
    "link_down": "link down", "link_up": "link up", "tx_timeout": "NIC transmit timeout", "pcie_aer": "PCIe AER error",
    "xid": "GPU Xid error", "nic_error": "NIC firmware/health error", "oom_kill": "OOM kill",
    "soft_lockup": "CPU soft lockup", "hung_task": "hung task",
}  # fmt: skip


DROP_RATIO = 0.7  # utilisation at 70% of its own level or less has fallen (TL601's drop_ratio)


@dataclass(frozen=True)
class Utilisation:
    """GPU utilisation of one host in a window and outside it (the run's own baseline)."""

    host: str
    inside: float  # mean % over the window's samples
    outside: float | None  # mean % over the host's other samples; None without any
    samples: int
    gpus: int

    @property
    def dropped(self) -> bool:
        """Utilisation fell well below its own level outside the window."""
        return self.fell(DROP_RATIO)

    def fell(self, ratio: float) -> bool:
        """Utilisation in the window at most `ratio` times a busy level outside it (50% or more)."""
        return self.outside is not None and self.outside >= 50 and self.inside <= ratio * self.outside

    def text(self) -> str:
        base = f" (usually {self.outside:.0f}%)" if self.outside is not None else ""
        return f"{self.host}'s {count(self.gpus, 'GPU')} at {self.inside:.0f}%{base}"


def utilisation(tables: RunTables, begin: datetime, end: datetime, hosts: list[str] | None = None) -> list[Utilisation]:
    """Per host with timed GPU samples in [begin, end]: mean utilisation inside and outside."""
    samples = tables["gpu_samples"].filter(
        pl.col("ts").is_not_null(), pl.col("util_gpu").is_not_null(), pl.col("host").is_not_null()
    )
    if hosts:
        samples = samples.filter(pl.col("host").is_in(hosts))
    if samples.height == 0:
        return []
    inside = pl.col("ts").is_between(begin, end)  # samples are timed to the second: no margin
    per_host = (
        samples.group_by("host")
        .agg(
            inside=pl.col("util_gpu").filter(inside).mean(),
            outside=pl.col("util_gpu").filter(~inside).mean(),
            samples=inside.sum(),
            gpus=pl.col("gpu").filter(inside).n_unique(),
        )
        .filter(pl.col("samples") > 0)
        .sort("host")
    )
    return [
        Utilisation(r["host"], r["inside"], r["outside"], r["samples"], r["gpus"])
        for r in per_host.iter_rows(named=True)
    ]


def utilisation_phrase(tables: RunTables, begin: datetime, end: datetime, hosts: list[str] | None = None) -> str:
    """`GPU utilisation fell: node07's 8 GPUs at 35% (usually 93%)`, or "" without samples."""
    found = utilisation(tables, begin, end, hosts) or utilisation(tables, begin, end)
    if not found:
        return ""
    verb = "fell" if any(u.dropped for u in found) else "stayed"
    return f"GPU utilisation {verb}: " + ", ".join(u.text() for u in found[:4])


def port_rates(tables: RunTables) -> pl.DataFrame:
    """The Active ports of each host with their rate (Gb/s): the latest state per port."""
    ports = tables["ib_ports"].filter(pl.col("rate_gbps").is_not_null(), pl.col("host").is_not_null())
    return (
        ports.sort("ts", nulls_last=False, maintain_order=True)
        .group_by("host", "ca", "port")
        .agg(pl.all().last())
        .filter(pl.col("state").fill_null("Active") == "Active")
        .select("host", "ca", "port", "rate_gbps", "width", "link_layer", "file", "line")
        .sort("host", "ca", "port")
    )


def largest_size(run: pl.DataFrame) -> pl.DataFrame:
    """An nccl-tests run's result at its largest message size, the figure quoted for it: the
    out-of-place row (nccl-tests' first busbw column), or the in-place one when only it was read."""
    largest = run.filter(pl.col("size_bytes") == run["size_bytes"].max())
    out = largest.filter(pl.col("placement") == "out", pl.col("busbw_gbs").is_not_null())
    return out if out.height else largest


PHYSICAL = r"^(?:en|eth|ib|bond|p\d+p\d|mlx|hsn|roce)"  # names of NIC ports (not docker0, veth, cali...)


def latest_interfaces(tables: RunTables) -> pl.DataFrame:
    """Each host's interfaces as its latest listing shows them (loopback left out)."""
    rows = tables["interfaces"].filter(pl.col("mtu").is_not_null(), pl.col("ifname") != "lo")
    return (
        rows.sort("ts", nulls_last=False, maintain_order=True)
        .group_by("host", "ifname")
        .agg(pl.all().last())
        .sort("host", "ifname", nulls_last=True)
    )


def shared_links(tables: RunTables) -> pl.DataFrame:
    """Interfaces that must agree on their MTU, grouped by `link` (a label saying why): addresses in
    one IPv4 network across hosts; the two ends of a veth pair (`vh-a@if9 ... link-netns B` and
    index 9 in B's listing); a bond and its members; and, where no address says more, NIC ports
    of one name on several hosts (ens1f0 everywhere is one fabric)."""
    rows = latest_interfaces(tables)
    if rows.height == 0:
        return rows.with_columns(link=pl.lit(None, pl.String))
    nets = networks(tables).select("host", "ifname", pl.format("network {}", "network").alias("link"))
    ends = (
        rows.filter(pl.col("peer_ifindex").is_not_null(), pl.col("link_netns").is_not_null())
        .join(
            rows.select("host", "ifindex", pl.col("ifname").alias("peer")),
            left_on=["link_netns", "peer_ifindex"],
            right_on=["host", "ifindex"],
        )
        .select("host", "ifname", "peer", "link_netns")
    )
    here, there = pl.format("{}/{}", "host", "ifname"), pl.format("{}/{}", "link_netns", "peer")
    label = pl.format("veth pair {} - {}", pl.min_horizontal(here, there), pl.max_horizontal(here, there)).alias("link")
    pairs = pl.concat(
        [
            ends.select("host", "ifname", label),
            ends.select(pl.col("link_netns").alias("host"), pl.col("peer").alias("ifname"), label),
        ]
    )
    bonds = rows.filter(pl.col("master").is_not_null()).select("host", "ifname", "master")
    bonded = pl.concat(
        [
            bonds.select("host", "ifname", pl.format("bond {} on {}", "master", "host").alias("link")),
            bonds.select(
                "host", pl.col("master").alias("ifname"), pl.format("bond {} on {}", "master", "host").alias("link")
            ).unique(),
        ]
    )
    named = rows.filter(
        pl.col("ipv4").is_null(), pl.col("ifname").str.contains(PHYSICAL), pl.col("master").is_null()
    ).select("host", "ifname", pl.format("{} on every host", "ifname").alias("link"))
    links = pl.concat([nets, pairs, bonded, named]).unique(maintain_order=True)
    return links.join(rows, on=["host", "ifname"], how="inner")


def networks(tables: RunTables) -> pl.DataFrame:
    """Interfaces with an IPv4 address, their network (10.0.0.0/24) and MTU: the latest listing per host."""
    rows = tables["interfaces"].filter(
        pl.col("ipv4").is_not_null(), pl.col("mtu").is_not_null(), pl.col("ifname") != "lo"
    )
    if rows.height == 0:
        return rows.with_columns(network=pl.lit(None, pl.String))
    latest = (
        rows.sort("ts", nulls_last=False, maintain_order=True)
        .group_by("host", "ifname", maintain_order=True)
        .agg(pl.all().last())
    )
    return latest.with_columns(
        network=pl.col("ipv4").map_elements(
            lambda a: str(IPv4Interface(a).network) if "/" in a else None, return_dtype=pl.String
        )
    ).filter(pl.col("network").is_not_null())


def incidents(tables: RunTables) -> pl.DataFrame:
    """The kernel events of the kinds that matter (INCIDENT_KINDS)."""
    return tables["kernel_events"].filter(pl.col("kind").is_in(INCIDENT_KINDS))


def gpu_lanes(samples: pl.DataFrame, points: int = 600) -> pl.DataFrame:
    """Mean GPU utilisation per host over time for a chart (columns host, ts, util),
    averaged over bins of time so a long `-l 1` loop stays a few hundred points per host."""
    timed = samples.filter(pl.col("ts").is_not_null(), pl.col("util_gpu").is_not_null())
    if timed.height < 2:
        return pl.DataFrame(schema={"host": pl.String, "ts": pl.Datetime("ns", "UTC"), "util": pl.Float64})
    span = (timed["ts"].max() - timed["ts"].min()).total_seconds()
    return (
        timed.with_columns(pl.col("host").fill_null("?"))
        .sort("ts")
        .group_by_dynamic("ts", every=f"{max(1, int(span / points))}s", group_by="host")
        .agg(util=pl.col("util_gpu").mean())
        .select("host", pl.col("ts").dt.convert_time_zone("UTC"), "util")
    )


def _pci(address: pl.Expr) -> pl.Expr:
    """`00000000:3B:00.0`, `0000:3b:00.0`, `PCI:0000:3b:00`: the bus and device part, lower case (`3b:00`)."""
    return address.str.to_lowercase().str.extract(r"([0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-9a-f])?$", 1)


def pci_owners(tables: RunTables) -> dict[tuple[str | None, str], str]:
    """(host, `3b:00`) -> what sits there: `GPU 2` (nvidia-smi's bus ids) or `NIC mlx5_core ens1f0` (the
    kernel's driver lines), so a PCIe error can say whether it hit a GPU or a NIC."""
    gpus = (
        tables["gpu_samples"]
        .filter(pl.col("bus_id").is_not_null())
        .select(
            "host",
            _pci(pl.col("bus_id")).alias("pci"),
            pl.format("GPU {}", pl.col("gpu").cast(pl.Int64)).alias("owner"),
        )
    )
    nics = (
        tables["kernel_events"]
        .filter(
            pl.col("subsystem").is_in(["mlx5_core", "mlx4_core", "mlx4_en", "bnxt_en", "ice", "i40e", "ixgbe", "igb"]),
            pl.col("device").is_not_null(),
        )
        .select(
            "host",
            _pci(pl.col("device")).alias("pci"),
            pl.format(
                "NIC {}{}",
                "subsystem",
                pl.when(pl.col("netdev").is_not_null()).then(pl.format(" {}", "netdev")).otherwise(pl.lit("")),
            ).alias("owner"),
        )
    )
    both = (
        pl.concat([gpus, nics])
        .filter(pl.col("pci").is_not_null())
        .sort("owner", descending=True)
        .unique(["host", "pci"], keep="first")
    )
    return {(r["host"], r["pci"]): r["owner"] for r in both.iter_rows(named=True)}
