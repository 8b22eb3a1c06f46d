"""TL101-TL106: how NCCL moves data between nodes, and the set-ups that make it slow."""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.nccl import RELEASE_ORDER
from tracelens.findings import Finding, Severity
from tracelens.findings.evidence import any_row, evidence, hosts_of, ranks_of
from tracelens.prose import count
from tracelens.rules import rule


def _is_socket(col: str = "net") -> pl.Expr:
    return pl.col(col).str.to_lowercase() == "socket"


def _is_libfabric(col: str = "net") -> pl.Expr:
    """aws-ofi-nccl's networks (`AWS Libfabric`, `Libfabric`; its own lines say `OFI`)."""
    return pl.col(col).str.to_lowercase().str.contains("libfabric|ofi")


def _ib_hcas_seen(ctx: RunContext) -> bool:
    """Whether the run shows InfiniBand/RoCE hardware anywhere (NCCL device lists or port dumps)."""
    return any_row(ctx.scan("nccl_net"), pl.col("what") == "ib_device") or ctx["ib_ports"].height > 0


def _multi_node(ctx: RunContext) -> bool:
    """Whether more than one node is involved: several hosts log NCCL lines, or channels go over a network."""
    if len(hosts_of(ctx.scan("nccl_events"))) > 1:
        return True
    return any_row(ctx.scan("nccl_channels"), pl.col("transport").is_in(["NET", "COLLNET"]))


def _single_node(ctx: RunContext) -> bool:
    """Whether the logs show a one-node job: one host, channel lines present, none over a network."""
    return (
        len(hosts_of(ctx.scan("nccl_events"))) <= 1
        and ctx.tables.height("nccl_channels") > 0
        and not any_row(ctx.scan("nccl_channels"), pl.col("transport").is_in(["NET", "COLLNET"]))
    )


def _ib_disabled_settings(ctx: RunContext) -> pl.DataFrame:
    """Rows (file, line, host, pid, name, value) setting NCCL_IB_DISABLE=1 or NCCL_NET=Socket,
    echoed by NCCL or printed by a launcher."""
    value = pl.col("value").str.strip_chars().str.strip_chars(".").str.to_lowercase()
    disabling = ((pl.col("name") == "NCCL_IB_DISABLE") & value.is_in(["1", "true", "yes"])) | (
        (pl.col("name") == "NCCL_NET") & (value == "socket")
    )
    return pl.concat([ctx.nccl_settings, ctx.launcher_nccl_settings]).filter(disabling).collect()


@rule("TL101", "nccl-socket-transport", Severity.WARNING, needs=("nccl_channels|nccl_net",))
def socket_transport(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: NCCL carrying traffic over NET/Socket (TCP) instead of InfiniBand or RoCE:
    `Using network Socket` (2.3-2.4: `CUDA Dev 0, IP Interfaces : ...`, `Socket NIC
    distance`), `NET/IB : No device found`, `Failed to open libibverbs.so`, `NCCL_IB_DISABLE=1`
    (echoed by NCCL or on the launcher's command line), or channels connected `via NET/Socket`.

    Why it slows the run: the socket transport goes through the kernel TCP stack and host
    memory, reaching a few GB/s at best where an IB or RoCE NIC with GPUDirect RDMA reaches
    25-50 GB/s; every all-reduce of the gradients then takes several times longer and the
    GPUs wait. The fallback is silent: NCCL only says so in its INFO lines.

    How to fix: make the IB devices visible to NCCL: install rdma-core / libibverbs in the
    container and pass the devices (`--device=/dev/infiniband`, `--cap-add=IPC_LOCK`, or the
    RDMA device plugin on Kubernetes), check `ibv_devinfo` lists the HCAs with `state:
    PORT_ACTIVE`, unset `NCCL_IB_DISABLE` and `NCCL_NET=Socket`, and select the HCAs with
    `NCCL_IB_HCA` (e.g. `mlx5_0,mlx5_1`). Confirm with `NCCL_DEBUG=INFO` that it logs `Using
    network IB` and channels `via NET/IB/.../GDRDMA`.
    """
    where = ["file", "line", "host", "pid"]
    net = ctx.scan("nccl_net")
    socket_channels = (
        ctx.scan("nccl_channels").filter((pl.col("transport") == "NET") & _is_socket()).select(where).collect()
    )
    # `NET/Socket : Using ...` is not a signal: NCCL 2.4 and 2.5 print it even when IB carries the traffic.
    signals = pl.concat(
        [
            net.filter((pl.col("what") == "network") & _is_socket("name")).select(where).collect(),
            net.filter(pl.col("what") == "ib_missing").select(where).collect(),
            _ib_disabled_settings(ctx).select(where),
            socket_channels,
        ]
    )
    if signals.height == 0:
        return
    hosts = hosts_of(signals)
    if _ib_hcas_seen(ctx) or _multi_node(ctx):
        severity = Severity.CRITICAL
        why = "while the run shows IB HCAs" if _ib_hcas_seen(ctx) else "in a multi-node run"
    elif _single_node(ctx):
        severity, why = Severity.INFO, "but the job is on one node, so no traffic crosses the network"
    else:
        severity, why = Severity.WARNING, "(the logs do not show whether traffic crossed nodes)"
    detail = (
        f"{count(socket_channels.height, 'channel connection')} via NET/Socket"
        if socket_channels.height
        else "NCCL chose the socket network"
    )
    yield Finding(
        severity=severity,
        title="NCCL fell back to TCP sockets",
        summary=f"{detail} on {count(len(hosts), 'host') if hosts else 'unnamed hosts'} {why}.",
        evidence=evidence(ctx.tables.with_text(signals)),
        hosts=hosts,
        ranks=ranks_of(ctx, signals),
    )


@rule("TL102", "nccl-ib-disabled-by-env", Severity.WARNING, needs=("nccl_env|deepspeed_settings",))
def ib_disabled(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: `NCCL_IB_DISABLE=1` or `NCCL_NET=Socket` set in the environment, as NCCL
    echoes it (`NCCL_IB_DISABLE set by environment to 1.`) or a launcher prints it.

    Why it slows the run: it forbids NCCL from using InfiniBand or RoCE at all, so every
    inter-node transfer goes over TCP sockets. The variable is often left over from
    debugging or copied from a single-node recipe, and it survives into production jobs.

    How to fix: remove `NCCL_IB_DISABLE` (or set it to 0) and `NCCL_NET=Socket` from the job
    environment, the container image (`ENV`), `/etc/nccl.conf` and `~/.nccl.conf`; then check
    the log says `Using network IB`.
    """
    bad = _ib_disabled_settings(ctx)
    if bad.height == 0:
        return
    names = sorted(set(bad["name"].to_list()))
    hosts = hosts_of(bad)
    yield Finding(
        severity=Severity.CRITICAL if _ib_hcas_seen(ctx) else Severity.WARNING,
        title="InfiniBand disabled by environment",
        summary=(
            f"{' and '.join(names)} forces the socket transport on "
            f"{count(len(hosts), 'host') if hosts else 'unnamed hosts'}"
        )
        + (" although IB HCAs are present." if _ib_hcas_seen(ctx) else "."),
        evidence=evidence(ctx.tables.with_text(bad)),
        hosts=hosts,
        ranks=ranks_of(ctx, bad),
    )


@rule("TL103", "nccl-mixed-transports", Severity.CRITICAL, needs=("nccl_channels|nccl_net",))
def mixed_transports(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: ranks of the same job on different network transports: some processes
    use InfiniBand/RoCE (or a vendor plugin) while others use TCP sockets.

    Why it slows the run: a collective runs at the speed of its slowest link, so one node on
    sockets drags every all-reduce down to TCP speed; connecting an IB rank to a socket rank
    can also fail or hang at init.

    How to fix: find what differs on the socket nodes (missing libibverbs or RDMA device in the
    container, a different image, `NCCL_IB_DISABLE` set only there, HCAs down in `ibstat`), make
    all nodes identical, and pin `NCCL_IB_HCA` so every rank selects the same kind of device.
    """
    net = (
        ctx.scan("nccl_net")
        .filter(pl.col("what") == "network")
        .select("file", "line", "host", "pid", pl.col("name").alias("net"))
        .collect()
    )
    channels = (
        ctx.scan("nccl_channels")
        .filter(pl.col("transport") == "NET")
        .select("file", "line", "host", "pid", "net")
        .collect()
    )
    used = pl.concat([net, channels]).drop_nulls("net").with_columns(socket=_is_socket())
    per_process = used.group_by("host", "pid", maintain_order=True).agg(
        pl.col("socket").any().alias("socket"), pl.col("socket").all().alias("only_socket")
    )
    socket_procs = per_process.filter(pl.col("only_socket"))
    other_procs = per_process.filter(~pl.col("socket"))
    if socket_procs.height == 0 or other_procs.height == 0:
        return
    first_rows = used.sort("file", "line").unique(["host", "pid", "socket"], keep="first", maintain_order=True)
    socket_hosts = hosts_of(socket_procs)
    other_hosts = hosts_of(other_procs)
    other_nets = sorted(set(used.filter(~pl.col("socket"))["net"].to_list()))
    yield Finding(
        severity=Severity.CRITICAL,
        title="Ranks on different network transports",
        summary=f"{socket_procs.height} process(es) on {', '.join(socket_hosts) or 'unnamed hosts'} use Socket while "
        f"{other_procs.height} on {', '.join(other_hosts) or 'unnamed hosts'} use {'/'.join(other_nets)}.",
        evidence=evidence(ctx.tables.with_text(first_rows)),
        hosts=socket_hosts + other_hosts,
        ranks=ranks_of(ctx, socket_procs),
    )


@rule("TL104", "nccl-gdr-not-used", Severity.WARNING, needs=("nccl_channels|nccl_net",))
def gdr_not_used(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: InfiniBand/RoCE channels connected without `/GDRDMA` (GPUDirect RDMA), and
    `GPU Direct RDMA Disabled` lines. On AWS EFA (the libfabric plugin, `via NET/AWS
    Libfabric/0`) a channel without `/GDRDMA` is normal where the instance type has no
    GPUDirect (g4dn, p3dn): there only the plugin's own `GDR disabled on GDR-supported
    instance type` counts.

    Why it slows the run: without GPUDirect RDMA the NIC cannot read and write GPU memory
    directly, so every transfer is staged through host memory over PCIe twice, costing
    bandwidth and latency, and CPU proxy threads become a bottleneck at scale.

    How to fix: load the peer-memory module (`modprobe nvidia-peermem`, or nv_peer_mem on old
    drivers; or use DMA-BUF with a recent driver and kernel), check the GPU and NIC share a PCIe
    switch (`nvidia-smi topo -m`), remove `NCCL_NET_GDR_LEVEL=0` / `NCCL_NET_GDR_READ=0` if set,
    and look for `via NET/IB/<n>/GDRDMA` in the log. On EFA: set `FI_EFA_USE_DEVICE_RDMA=1`,
    use an aws-ofi-nccl built with CUDA and a libfabric with FI_HMEM support, and look for
    `via NET/AWS Libfabric/<n>/GDRDMA`.
    """
    where = ["file", "line", "host", "pid"]
    channels = (
        ctx.scan("nccl_channels")
        .filter((pl.col("transport") == "NET") & ~_is_socket() & ~_is_libfabric() & pl.col("net").is_not_null())
        .select(*where, "gdr")
        .collect()
    )
    no_gdr = channels.filter(pl.col("gdr").not_())
    disabled = ctx.scan("nccl_net").filter(pl.col("what") == "gdr_disabled").select(*where, "name").collect()
    if no_gdr.height == 0 and disabled.height == 0:
        return
    by_plugin = disabled.filter(_is_libfabric("name"))
    parts = []
    if no_gdr.height:
        parts.append(f"{no_gdr.height} of {count(channels.height, 'network channel connection')} without /GDRDMA")
    if disabled.height > by_plugin.height:
        parts.append(f"{count(disabled.height - by_plugin.height, '`GPU Direct RDMA Disabled` line')}")
    if by_plugin.height:
        parts.append(
            f"the libfabric (EFA) plugin says `GDR disabled on GDR-supported instance type` "
            f"({count(by_plugin.height, 'line')})"
        )
    disabled = disabled.select(where)
    gdr_env = (
        ctx.nccl_settings.filter(pl.col("name").is_in(["NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ"]))
        .select(*where, "name", "value")
        .collect()
    )
    cause = ""
    if gdr_env.height:
        settings = sorted({f"{r['name']}={r['value']}" for r in gdr_env.iter_rows(named=True)})
        cause = f" ({', '.join(settings)} is set)"
    rows = pl.concat([no_gdr.select(where), disabled, gdr_env.select(where)])
    yield Finding(
        severity=Severity.WARNING,
        title="GPUDirect RDMA not used",
        summary="; ".join(parts) + cause + ".",
        evidence=evidence(ctx.tables.with_text(rows)),
        hosts=hosts_of(rows),
        ranks=ranks_of(ctx, rows),
    )


_VIRTUAL_IF = re.compile(
    r"^(lo|docker\d*|virbr\d*|veth\w*|br-\w+|cni\d*|flannel\.\d+|cali\w+|tun\d*|tap\d*|ip6tnl\d*|vxlan\w*|kube-\w+)$"
)
_LINK_LOCAL = re.compile(r"^(fe80:|169\.254\.|127\.|::1$)", re.IGNORECASE)


@rule("TL105", "nccl-suspect-interface", Severity.WARNING, needs=("nccl_net",))
def suspect_interface(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: NCCL's bootstrap, out-of-band or socket-transport interface on a loopback,
    container bridge or virtual device (`lo`, `docker0`, `virbr0`, `veth*`, `cni0` ...) or on a
    link-local or loopback address (fe80::, 169.254.x.x, 127.x).

    Why it slows the run: such interfaces either do not reach the other nodes (init hangs or
    times out) or go through a software bridge with NAT, so the socket transport and NCCL's
    control traffic crawl or fail intermittently.

    How to fix: name the real data interface: `NCCL_SOCKET_IFNAME=eth0` (or `ib0`, `bond0`; a
    `^docker,lo` prefix list excludes), and for IB/RoCE `NCCL_IB_HCA`; check the address with
    `ip -br addr`.
    """
    net = ctx.scan("nccl_net").filter(pl.col("what").is_in(["bootstrap_if", "oob_if", "socket_if"])).collect()
    # Bootstrap lines of NCCL 2.4-2.9 list every interface; NCCL uses the first one.
    first_bootstrap = (
        net.filter(pl.col("what") == "bootstrap_if").sort("file", "line").unique(["file", "line"], keep="first")
    )
    used = pl.concat([first_bootstrap, net.filter(pl.col("what") != "bootstrap_if")])
    suspect = used.filter(
        pl.col("name").str.contains(_VIRTUAL_IF.pattern)
        | pl.col("address").fill_null("").str.contains(_LINK_LOCAL.pattern)
    )
    if suspect.height == 0:
        return
    choices = sorted(
        {f"{r['what'].removesuffix('_if')} {r['name']}:{r['address']}" for r in suspect.iter_rows(named=True)}
    )
    loopback_multi = suspect.filter(pl.col("name") == "lo").height > 0 and _multi_node(ctx)
    yield Finding(
        severity=Severity.CRITICAL if loopback_multi else Severity.WARNING,
        title="NCCL on a virtual or link-local interface",
        summary=(
            f"NCCL uses {', '.join(choices[:4])}{' ...' if len(choices) > 4 else ''} on "
            f"{count(len(hosts_of(suspect)), 'host') if len(hosts_of(suspect)) else 'unnamed hosts'}."
        ),
        evidence=evidence(ctx.tables.with_text(suspect)),
        hosts=hosts_of(suspect),
        ranks=ranks_of(ctx, suspect),
    )


def _differing(rows: pl.LazyFrame, key: str, value: str) -> pl.DataFrame:
    """The rows of each `key` seen with more than one `value`: the first line of each (key, value, host)."""
    keys = rows.group_by(key).agg(n=pl.col(value).n_unique()).filter(pl.col("n") > 1).select(key)
    found = rows.join(keys, on=key, how="semi").collect(engine="streaming").sort("file", "line")
    return found.unique([key, value, "host"], keep="first", maintain_order=True)


def _per_version(rows: pl.DataFrame) -> str:
    """`2.18.3 on node03; 2.21.5 on node01, node02`: the hosts of each version, oldest version first."""
    per_version = rows.group_by("version").agg(pl.col("host").drop_nulls().unique().sort()).sort(RELEASE_ORDER)
    return "; ".join(
        f"{r['version']} on {', '.join(r['host']) or 'unnamed host'}" for r in per_version.iter_rows(named=True)
    )


def _nccl_versions_of(versions: pl.DataFrame, hosts: list[str]) -> str:
    """What NCCL versions those hosts printed, so a plugin skew reads beside NCCL's own."""
    if not hosts:
        return ""
    shown = versions.filter(pl.col("host").is_in(hosts)).unique(["version", "host"])
    silent = sorted(set(hosts) - set(shown["host"].to_list()))
    parts = ([f"NCCL {_per_version(shown)}"] if shown.height else []) + (
        [f"no NCCL version line from {', '.join(silent)}"] if silent else []
    )
    return f" ({'; '.join(parts)})"


# Settings that legitimately differ per process (device and rank selection).
_PER_PROCESS_SETTINGS = {"CUDA_VISIBLE_DEVICES", "NCCL_COMM_ID", "NCCL_LOCAL_RANK"}


@rule("TL106", "nccl-version-or-setting-skew", Severity.WARNING, needs=("nccl_events|nccl_env|nccl_net",))
def version_skew(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: different NCCL versions, different versions of the same network plugin
    (aws-ofi-nccl, the HPC-X IBext plugin, a plugin's API level), or different values of the
    same NCCL_* setting, across the hosts or ranks of one run.

    Why it slows the run: ranks that disagree on protocol, algorithm, buffer sizes or network
    settings either fail at init (`Mismatched NCCL version`), hang in a collective, or silently
    pick different paths so the slowest one paces everyone. A network plugin speaks its own wire
    protocol between hosts: two releases of it may not talk to each other at all.

    How to fix: run every node from the same container image, NCCL build and plugin build
    (`python -c "import torch; print(torch.cuda.nccl.version())"` on each; the plugin's
    `NET/OFI Initializing aws-ofi-nccl ...` line with NCCL_DEBUG=INFO), and set NCCL_* variables
    in one place that every rank inherits (the launcher's env export or /etc/nccl.conf), not per node.
    """
    versions = ctx.nccl_versions
    if versions["version"].n_unique() > 1:
        first = versions.sort("file", "line").unique(["version", "host"], keep="first")
        yield Finding(
            severity=Severity.CRITICAL,
            title="NCCL versions differ across the run",
            summary=f"{versions['version'].n_unique()} NCCL versions: {_per_version(first)}.",
            evidence=evidence(first),
            hosts=hosts_of(first),
        )
    first = _differing(ctx.nccl_plugin_versions.lazy(), "plugin", "version")
    if first.height:
        described = "; ".join(
            f"{plugin}: {_per_version(part)}"
            for (plugin,), part in first.partition_by("plugin", as_dict=True, maintain_order=True).items()
        )
        yield Finding(
            severity=Severity.CRITICAL,
            title="NCCL network plugin versions differ across the run",
            summary=f"{described}.{_nccl_versions_of(versions, hosts_of(first))}",
            evidence=evidence(ctx.tables.with_text(first)),
            hosts=hosts_of(first),
        )
    env = ctx.nccl_settings.filter(~pl.col("name").is_in(list(_PER_PROCESS_SETTINGS)))
    rows = _differing(env, "name", "value")
    if rows.height == 0:
        return
    skewed = rows.group_by("name").agg(pl.col("value").unique().sort()).sort("name")
    described = "; ".join(
        f"{r['name']} = {' / '.join(v or '(empty)' for v in r['value'])}" for r in skewed.iter_rows(named=True)
    )
    yield Finding(
        severity=Severity.WARNING,
        title="NCCL settings differ across the run",
        summary=f"{count(skewed.height, 'setting')} with different values: {described}.",
        evidence=evidence(ctx.tables.with_text(rows)),
        hosts=hosts_of(rows),
        ranks=ranks_of(ctx, rows),
    )
