"""What NCCL said about its set-up, per host: version and build, processes and ranks, networks,
HCAs, interfaces, transports per channel class, echoed NCCL_* settings and errors.

One reading of these facts serves the rules (TL106's version and setting skew), the report's
NCCL section and `tracelens diff`, so that they cannot disagree on, say, a version.

A version line prints `NCCL version 2.21.5+cuda12.4`: the version is `2.21.5`, what follows it
(`+cuda12.4`, the CUDA it was built for, or a packager's tag) is the build, kept apart: two hosts
on 2.21.5 built for different CUDA versions run the same NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracelens.tables import RunTables

# the first x.y.z of a version line's message, and the build tag glued to it
VERSION = r"(\d+\.\d+\.\d+)([\w.+-]*)"
# versions in the order they were released, by their numbers: 2.9.9 before 2.10.0, v4 before v6
RELEASE_ORDER = pl.col("version").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64))


@dataclass(frozen=True)
class Version:
    version: str  # 2.21.5
    build: str  # +cuda12.4 as printed after the version; "" when none


@dataclass(frozen=True)
class Transport:
    """Channel connections of one kind on a host: transport (NET, P2P/IPC, SHM ...), network plugin, GDR."""

    transport: str | None
    net: str | None
    gdr: bool | None
    connections: int

    @property
    def inter_node(self) -> bool:
        return self.transport in ("NET", "COLLNET")

    @property
    def label(self) -> str | None:
        """`NET/IB/GDRDMA`, `P2P/IPC` ...: the transport, its network and GPUDirect RDMA as one name."""
        if self.transport is None:
            return None
        return self.transport + (f"/{self.net}" if self.net is not None else "") + ("/GDRDMA" if self.gdr else "")


@dataclass(frozen=True)
class NetRow:
    """One network, plugin, device or interface NCCL named (a row of nccl_net, for the columns kept)."""

    what: str  # network, plugin, ib_device, socket_if, bootstrap_if, oob_if ...
    name: str | None
    port: int | None
    link_layer: str | None
    address: str | None


@dataclass(frozen=True)
class NcclHost:
    """The NCCL set-up of one host; `host` None for the lines no host was named for."""

    host: str | None
    versions: tuple[Version, ...]  # distinct, oldest first
    processes: int  # distinct pids that logged NCCL lines
    ranks: tuple[int, ...]
    net: tuple[NetRow, ...]  # distinct, in the order first logged
    transports: tuple[Transport, ...]  # most connections first
    settings: tuple[tuple[str, str], ...]  # distinct (name, value), by name and value
    errors: int

    def named(self, what: str) -> list[str]:
        """The distinct names NCCL gave for `what` (network, plugin, socket_if ...), sorted."""
        return sorted({r.name for r in self.net if r.what == what and r.name is not None})


def versions(tables: RunTables) -> pl.DataFrame:
    """One row per `NCCL version` line: file, line, host, pid, message, version and build."""
    message = pl.col("message")
    return (
        tables.scan("nccl_events")
        .filter(pl.col("kind") == "version")
        .select("file", "line", "host", "pid", "message")
        .with_columns(version=message.str.extract(VERSION, 1), build=message.str.extract(VERSION, 2).fill_null(""))
        .drop_nulls("version")
        .collect(engine="streaming")
    )


# A network plugin's name with its version, as NCCL or the plugin logs it: aws-ofi-nccl's own `Using
# aws-ofi-nccl 1.5.0aws` (to 1.9) and `Initializing aws-ofi-nccl 1.13.2-aws` or `... git-6e504db`, NCCL's
# `Loaded net plugin AWS Libfabric (v6)` (the plugin API it loaded), HPC-X's `P2P plugin IBext_v8`.
PLUGIN_VERSION = r"^(.+?)[ _]\(?(git-[0-9a-f]+|v\d+|\d+\.\d+(?:\.\d+)?[\w.+-]*)\)?$"


def plugin_versions(tables: RunTables) -> pl.DataFrame:
    """One row per line naming a network plugin with its version: file, line, host, pid, plugin,
    version and build. A release's version is its x.y[.z] and what follows (`aws`, `-aws`, the
    packager's tag) its build, as for NCCL's own version; an API level (`v6`) or a git build is
    the version whole."""
    name = pl.col("name")
    release = name.str.extract(PLUGIN_VERSION, 2)
    return (
        tables.scan("nccl_net")
        .filter(pl.col("what") == "plugin")
        .select("file", "line", "host", "pid", plugin=name.str.extract(PLUGIN_VERSION, 1).str.strip_chars(),
                version=pl.coalesce(release.str.extract(r"^(\d+\.\d+(?:\.\d+)?)"), release),
                build=release.str.extract(r"^\d+\.\d+(?:\.\d+)?(.*)$").fill_null(""))
        .drop_nulls("version")
        .collect(engine="streaming")
    )  # fmt: skip


# a setting's value as set: without the spaces around it and the period that ends NCCL's sentence
_SETTING_VALUE = pl.col("value").fill_null("").str.strip_chars().str.strip_chars_end(".")


def settings(tables: RunTables) -> pl.LazyFrame:
    """The echoed NCCL_* settings (file, line, host, pid, name, value), the value without the period
    that ends NCCL's `... set by environment to 1.` sentence (and without spaces around it); a setting
    echoed with nothing after `to` has the empty value."""
    return tables.scan("nccl_env").select("file", "line", "host", "pid", "name", value=_SETTING_VALUE)


def launcher_settings(tables: RunTables) -> pl.LazyFrame:
    """The NCCL_* settings a launcher printed as it exported them (kept in deepspeed_settings), in the
    columns and values of `settings` (no pid): NCCL echoes a setting only at NCCL_DEBUG=INFO."""
    rows = tables.scan("deepspeed_settings").filter(pl.col("key").str.starts_with("NCCL_"))
    return rows.select("file", "line", "host", pid=pl.lit(None, pl.Int64), name=pl.col("key"), value=_SETTING_VALUE)


def _by_host(frame: pl.DataFrame) -> dict[str | None, pl.DataFrame]:
    return {key[0]: part for key, part in frame.partition_by("host", as_dict=True, maintain_order=True).items()}


def hosts(tables: RunTables, version_lines: pl.DataFrame) -> list[NcclHost]:
    """Per host that logged NCCL lines (sorted by name, unnamed last), its NCCL set-up. Each table is
    read for the columns kept and aggregated before it is collected: a big run's are big."""
    pid = pl.col("pid")
    processes = (
        tables.scan("nccl_events")
        .group_by("host")
        .agg(n=pl.when(pid.null_count() < pl.len()).then(pid.n_unique()).otherwise(0))
        .collect(engine="streaming")
    )
    if processes.height == 0:
        return []
    ranks = (
        tables.scan("nccl_comms")
        .group_by("host")
        .agg(pl.col("rank").drop_nulls().unique().sort())
        .collect(engine="streaming")
    )
    net = (
        tables.scan("nccl_net")
        .select("host", "what", "name", "port", "link_layer", "address")
        .unique(maintain_order=True)
        .collect(engine="streaming")
    )
    channels = (
        tables.scan("nccl_channels")
        .group_by("host", "transport", "net", "gdr")
        .len()
        # ties by name
        .sort("len", "transport", "net", "gdr", descending=[True, False, False, False], nulls_last=True)
        .collect(engine="streaming")
    )
    env = settings(tables).select("host", "name", "value").unique().sort("name", "value").collect(engine="streaming")
    errors = tables.scan("nccl_errors").group_by("host").len().collect(engine="streaming")
    split = {name: _by_host(frame) for name, frame in
             {"versions": version_lines, "ranks": ranks, "net": net, "channels": channels, "env": env,
              "errors": errors, "processes": processes}.items()}  # fmt: skip
    empty = pl.DataFrame()
    out = []
    for host in sorted(processes["host"].drop_nulls().to_list()) + ([None] if processes["host"].has_nulls() else []):
        part = {name: frames.get(host, empty) for name, frames in split.items()}
        found = (
            part["versions"].select("version", "build").unique().sort(RELEASE_ORDER, "build").rows()
            if part["versions"].height
            else []
        )
        out.append(
            NcclHost(
                host=host,
                versions=tuple(Version(v, b) for v, b in found),
                processes=int(part["processes"]["n"][0]),
                ranks=tuple(part["ranks"]["rank"][0]) if part["ranks"].height else (),
                net=tuple(NetRow(*r) for r in part["net"].drop("host").rows()) if part["net"].height else (),
                transports=tuple(Transport(*r) for r in part["channels"].drop("host").rows())
                if part["channels"].height
                else (),
                settings=tuple(part["env"].select("name", "value").rows()) if part["env"].height else (),
                errors=int(part["errors"]["len"][0]) if part["errors"].height else 0,
            )
        )
    return out
