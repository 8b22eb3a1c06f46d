"""TL601-TL608: host evidence: GPU utilisation in slow windows, interface and RoCE MTUs,
kernel events, the benchmarks people run before and after (nccl-tests, perftest), and the
RoCE GID NCCL is told to use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.events import CAUSES
from tracelens.derived.hostsignals import (
    DROP_RATIO,
    KIND_TEXT,
    incidents,
    largest_size,
    pci_owners,
    port_rates,
    shared_links,
    utilisation,
)
from tracelens.derived.step_times import MARGIN
from tracelens.findings import Evidence, Finding, Severity
from tracelens.findings.evidence import evidence, row_evidence
from tracelens.prose import count
from tracelens.rules import Setting, rule

MAX_EVIDENCE = 8
# Without the hosts' port dumps: the NIC each GPU of such a node usually has (one per GPU,
# e.g. DGX/HGX A100 with HDR 200 Gb/s, H100 with NDR 400 Gb/s), Gb/s.
USUAL_NIC_PER_GPU = {
    "GB200": 800.0,
    "B200": 400.0,
    "H200": 400.0,
    "H100": 400.0,
    "H800": 400.0,
    "A100": 200.0,
    "A800": 200.0,
    "V100": 100.0,
}


def _samples_evidence(ctx: RunContext, hosts: list[str], begin, end) -> list[Evidence]:
    rows = (
        ctx["gpu_samples"]
        .filter(pl.col("host").is_in(hosts), pl.col("ts").is_between(begin - MARGIN, end + MARGIN))
        .sort("ts")
    )
    shown = rows.head(3).filter(pl.col("util_gpu").is_not_null())
    return row_evidence(shown.iter_rows(named=True), 3, _gpu_sample)


def _gpu_sample(row: Mapping[str, Any]) -> str:
    return f"GPU {row['gpu']} at {row['util_gpu']:.0f}% ({row['source']}, {row['ts']:%H:%M:%S})"


@rule(
    "TL601",
    "gpu-utilisation-in-slow-window",
    Severity.WARNING,
    needs=("steps", "gpu_samples"),
    settings={
        "busy_util": Setting(
            "% GPU utilisation",
            "GPUs at or above this utilisation through a slow window (and not fallen "
            "below their own level) were busy: the window was compute bound.",
        ),
        "drop_ratio": Setting(
            "times the hosts' own level",
            "Utilisation in a slow window at this multiple or less of the "
            "host's level outside it (when that is 50% or more) has fallen: the GPUs waited.",
        ),
    },
)
def gpu_utilisation_in_slow_window(
    ctx: RunContext, *, busy_util: float = 80.0, drop_ratio: float = DROP_RATIO
) -> Iterator[Finding]:
    """
    What it finds: for each slow stretch of steps (the windows TL401 reports), the GPU
    utilisation that nvidia-smi, dmon or DCGM sampled in it against the same hosts' own level
    outside it, joined with what else happened in the window: utilisation that fell to 70% or
    less of its usual level while network events (NCCL errors, counter rises, packet loss) fall
    in the window says "GPUs idle while waiting on the network"; utilisation that stayed at
    80% or more says "GPUs busy: compute bound", so the network is not the cause.

    Why it slows the run: in data-parallel training every GPU waits at each all-reduce for the
    slowest transfer; when the network stalls the GPUs sit idle (utilisation drops) and the
    step time grows, while a compute-bound slowdown keeps them busy (thermal or power
    throttling, a slower kernel, a bigger batch).

    How to fix: GPUs idle while waiting on the network: fix the network cause the finding names
    (see TL410; `perfquery -x`, `ethtool -S`, reseat the cable, drain the node). GPUs busy:
    look at the GPUs, not the network: `nvidia-smi -q -d PERFORMANCE,CLOCK` for throttle reasons
    (HW slowdown, power cap, thermal), `nvidia-smi dmon -s pucvmt` during the run, and the
    model's kernel time with the PyTorch profiler.
    """
    if ctx["gpu_samples"].height == 0:
        return
    episodes = ctx.slow_episodes
    if not episodes:
        return
    events = ctx.network_events.filter(pl.col("cause") != "stall")
    for ep in episodes:
        found = utilisation(ctx.tables, ep.begin, ep.end)
        if not found:
            continue
        window = events.filter(pl.coalesce("hi", "lo") >= ep.begin - MARGIN, pl.col("lo") <= ep.end + MARGIN)
        dropped = [u for u in found if u.fell(drop_ratio)]
        numbers = ", ".join(u.text() for u in found)
        span = f"{ep.begin:%H:%M:%S} to {ep.end:%H:%M:%S} UTC"
        if dropped and window.height:
            causes = window.group_by("cause", "host").agg(pl.col("count").sum())
            # ties by name
            causes = causes.sort("count", "cause", "host", descending=[True, False, False], nulls_last=True)
            top = causes.row(0, named=True)
            hosts = [u.host for u in dropped]
            yield Finding(
                severity=Severity.WARNING,
                score=0.0,
                title=f"GPUs idle while waiting on the network from {span}",
                summary=(
                    f"While steps were slow ({span}) GPU utilisation fell: {numbers}. In the same window "
                    f"{count(window.height, 'network event')} {'points' if window.height == 1 else 'point'} at "
                    f"{CAUSES.get(top['cause'], top['cause'])} on {top['host']}: the GPUs waited on the network."
                ),
                evidence=_samples_evidence(ctx, hosts, ep.begin, ep.end)
                + row_evidence(window.iter_rows(named=True), 3),
                hosts=hosts,
                window=(ep.begin, ep.end),
            )
        elif all(u.inside >= busy_util and not u.fell(drop_ratio) for u in found):
            yield Finding(
                severity=Severity.INFO,
                title=f"GPUs busy while steps were slow from {span}: compute bound",
                summary=(
                    f"While steps were slow ({span}) the GPUs stayed busy: {numbers}. "
                    f"{'No network event falls in the window: ' if window.height == 0 else ''}the slowdown is in the "
                    "GPUs' own work, not in waiting on the network."
                ),
                evidence=_samples_evidence(ctx, [u.host for u in found], ep.begin, ep.end),
                hosts=[u.host for u in found],
                window=(ep.begin, ep.end),
            )


@rule("TL602", "mtu-mismatch", Severity.WARNING, needs=("interfaces",))
def mtu_mismatch(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: interfaces that carry the same traffic but have different MTUs, from the
    hosts' `ip link` / `ip addr` / `ifconfig` listings: addresses in one IPv4 network on
    different hosts (9000 on one node, 1500 on its peer), the two ends of a veth pair, a bond
    and its members, or, where no address says more, NIC ports of one name on several hosts.

    Why it slows the run: TCP negotiates its segment size from each end's MTU, but a host that
    sends jumbo frames to a path or peer that only takes 1500 bytes has them dropped or
    fragmented: NCCL's socket transport and bootstrap stall in retransmissions and
    black-holed large packets while small packets (pings, handshakes) pass.

    How to fix: set one MTU on every host of the network and on the switch ports between them
    (`ip link set dev <if> mtu 9000`, and the same in the node's netplan/NetworkManager
    config so it survives a reboot); check with `ping -M do -s 8972 <peer>`.
    """
    links = shared_links(ctx.tables)
    if links.height == 0:
        return
    flagged: set[tuple[str, str]] = set()
    for (link,), group in links.group_by("link", maintain_order=True):
        ends = {(r["host"], r["ifname"]) for r in group.iter_rows(named=True)}
        if len(ends) < 2 or group["mtu"].n_unique() < 2 or ends <= flagged:
            continue
        flagged |= ends
        per = ", ".join(
            f"{r['host']} {r['ifname']} {r['mtu']}" for r in group.sort("host", "ifname").iter_rows(named=True)
        )
        yield Finding(
            severity=Severity.WARNING,
            title=f"MTU mismatch on {link}: {', '.join(map(str, sorted(group['mtu'].unique().to_list())))}",
            summary=f"The interfaces of {link} use different MTUs: {per}. Frames larger than the smallest MTU are "
            "dropped or fragmented between them.",
            evidence=row_evidence(
                group.iter_rows(named=True),
                text=lambda r: f"{r['ifname']}: mtu {r['mtu']}" + (f" ({r['ipv4']})" if r["ipv4"] else ""),
            ),
            hosts=group["host"].unique().to_list(),
            ports=sorted(set(group["ifname"].to_list())),
        )


@rule("TL603", "roce-active-mtu-low", Severity.WARNING, needs=("ib_ports",))
def roce_active_mtu_low(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: RDMA ports whose active MTU (`ibv_devinfo` active_mtu) is below what the
    port supports (max_mtu), e.g. RoCE at 1024 on a port that takes 4096; on RoCE the active
    MTU follows the netdev's MTU, which the finding names when `rdma link` maps it.

    Why it slows the run: every RDMA message is cut into packets of the active MTU: at 1024
    bytes a 4096-capable link carries four times the packets, headers and per-packet work
    for the same data, and NCCL's bus bandwidth drops by 10-30%.

    How to fix: raise the netdev MTU on every host and switch port of the RoCE network
    (`ip link set dev <netdev> mtu 9000` gives active_mtu 4096; 4200 is the least that
    does), then check `ibv_devinfo | grep active_mtu`. On InfiniBand the subnet manager's
    partition MTU sets it (`mtu=5` for 4096 in partitions.conf).
    """
    ports = ctx["ib_ports"].filter(
        pl.col("active_mtu").is_not_null(),
        pl.col("max_mtu").is_not_null(),
        pl.col("active_mtu") < pl.col("max_mtu"),
        pl.col("state").fill_null("Active") == "Active",
    )
    if ports.height == 0:
        return
    netdevs = (
        ctx["ib_ports"]
        .filter(pl.col("netdev").is_not_null())
        .select("host", "ca", "port", "netdev")
        .unique(["host", "ca", "port"])
    )
    mtus = (
        ctx["interfaces"]
        .select("host", pl.col("ifname").alias("netdev"), "mtu")
        .unique(["host", "netdev"], keep="last")
    )
    rows = (
        ports.drop("netdev")
        .join(netdevs, on=["host", "ca", "port"], how="left")
        .join(mtus, on=["host", "netdev"], how="left")
    )
    for r in rows.sort("host", "ca", "port").iter_rows(named=True):
        via = f" (its netdev {r['netdev']} has MTU {r['mtu']})" if r["netdev"] and r["mtu"] else ""
        yield Finding(
            severity=Severity.WARNING,
            title=(
                f"{r['host'] or ''} {r['ca']} port {r['port']}: active MTU "
                f"{r['active_mtu']} below the {r['max_mtu']} it supports"
            ).strip(),
            summary=(
                f"{r['ca']} port {r['port']} ({r['link_layer'] or 'link layer unknown'}) runs RDMA at MTU "
                f"{r['active_mtu']} although the port supports {r['max_mtu']}{via}: "
                f"{r['max_mtu'] // r['active_mtu']}x the packets for the same data."
            ),
            evidence=row_evidence([r], text=lambda r: f"active_mtu {r['active_mtu']}, max_mtu {r['max_mtu']}"),
            hosts=[r["host"]],
            ports=[f"{r['ca']}:{r['port']}"],
        )


@rule(
    "TL604",
    "socket-interface-without-jumbo-frames",
    Severity.INFO,
    needs=("nccl_net|nccl_channels", "interfaces"),
    settings={
        "jumbo_mtu": Setting("bytes", "An NCCL socket interface with an MTU below this has no jumbo frames."),
    },
)
def socket_interface_without_jumbo_frames(ctx: RunContext, *, jumbo_mtu: int = 9000) -> Iterator[Finding]:
    """
    What it finds: a host whose NCCL traffic goes over the socket transport (`NET/Socket`)
    on an interface that the host's own listing shows at an MTU below 9000 (no jumbo frames).

    Why it slows the run: the socket transport moves every byte through the kernel TCP stack;
    at 1500 bytes per frame it takes six times the packets, interrupts and per-packet CPU work
    of 9000-byte jumbo frames, and the CPU becomes the limit well below the line rate.

    How to fix: first make NCCL use RDMA if the hosts have it (see TL101). If sockets are
    meant: enable jumbo frames end to end (`ip link set dev <if> mtu 9000`, the same on the
    switch ports), raise NCCL_NSOCKS_PERTHREAD/NCCL_SOCKET_NTHREADS, and pin NCCL_SOCKET_IFNAME
    to the fast interface.
    """
    net = ctx.scan("nccl_net")
    on_socket = (pl.col("what") == "network") & (pl.col("name").str.to_lowercase() == "socket")
    socket_hosts = set(net.filter(on_socket).select("host").collect()["host"].drop_nulls().to_list())
    socket_hosts |= set(
        ctx.scan("nccl_channels")
        .filter(pl.col("net").str.to_lowercase() == "socket")
        .select("host")
        .collect()["host"]
        .drop_nulls()
        .to_list()
    )
    if not socket_hosts:
        return
    named = net.filter(
        pl.col("what").is_in(["socket_if", "bootstrap_if", "oob_if"]), pl.col("host").is_in(list(socket_hosts))
    )
    named = named.select("host", pl.col("name").alias("ifname")).collect().unique()
    listed = ctx["interfaces"].filter(pl.col("mtu").is_not_null()).unique(["host", "ifname"], keep="last")
    small = listed.join(named, on=["host", "ifname"], how="inner").filter(pl.col("mtu") < jumbo_mtu)
    for r in small.sort("host").iter_rows(named=True):
        yield Finding(
            severity=Severity.INFO,
            title=f"{r['host']}: NCCL sockets on {r['ifname']} without jumbo frames (MTU {r['mtu']})",
            summary=f"{r['host']} carries NCCL traffic over TCP sockets on {r['ifname']}, whose MTU is {r['mtu']}: "
            f"{jumbo_mtu // r['mtu']}x the packets of jumbo frames for the same data.",
            evidence=row_evidence([r], text=lambda r: f"{r['ifname']}: mtu {r['mtu']}"),
            hosts=[r["host"]],
            ports=[r["ifname"]],
        )


def _windows(ctx: RunContext) -> list[tuple]:
    return [(ep.begin, ep.end) for ep in ctx.slow_episodes]


@rule(
    "TL605",
    "kernel-events",
    Severity.WARNING,
    needs=("kernel_events",),
    shared=("steps",),
    settings={
        "critical_xids": Setting(
            "NVIDIA Xid numbers",
            "An Xid in this list makes the finding critical (the GPU faulted, lost ECC memory "
            "or an NVLink, or fell off the bus); other Xids warn.",
        )
    },
)
def kernel_events(
    ctx: RunContext,
    *,
    critical_xids: tuple[int, ...] = (48, 74, 79, 92, 94, 95, 119, 120, 140, 144, 145, 146, 147, 148, 149, 150, 154),
) -> Iterator[Finding]:
    """
    What it finds: the kernel log events that stall or break a training job, per host and
    kind, with their time: NIC link flaps (link down/up), NIC transmit timeouts (NETDEV
    WATCHDOG, mlx5 TX timeout), PCIe AER errors on the NIC or GPU, NVIDIA Xid errors (with
    what each Xid means), NIC firmware errors, OOM kills, soft lockups and hung tasks; and
    whether they fall in a slow window of the steps. Corrected PCIe errors are reported
    only when they fall in a slow window (a trickle of them is common on healthy hosts).

    Why it slows the run: a link that goes down stops every collective through it until it
    retrains (seconds) and NCCL retries or times out; a transmit timeout resets the NIC's
    queue; PCIe errors retry transfers to the NIC or GPU; an Xid means the GPU faulted or
    fell off the bus, and the rank's collective never completes.

    How to fix: link flaps and TX timeouts: `ethtool -S <if> | grep -E 'link_down|timeout'`,
    `mlxlink -d <dev> -m` for cable/transceiver errors, reseat or replace the cable, update
    NIC firmware. PCIe AER: `lspci -vvv -s <addr>` (LnkSta speed/width), reseat the card,
    check the riser. Xid: follow NVIDIA's Xid catalog for the number (79: drain the node
    and check the GPU's seating and power; 48/94/95: ECC, reset the GPU, RMA if it recurs;
    74/144-150: NVLink, `nvidia-smi nvlink -e`). OOM: lower the batch or host memory use.
    """
    events = incidents(ctx.tables)
    if events.height == 0:
        return
    windows = _windows(ctx)
    owners = pci_owners(ctx.tables)
    in_window = pl.lit(False)
    for begin, end in windows:
        in_window = in_window | pl.col("ts").is_between(begin - MARGIN, end + MARGIN)
    events = events.with_columns(in_window=in_window.fill_null(False))
    keep = (pl.col("kind") != "link_up") & (
        (pl.col("kind") != "pcie_aer") | ~pl.col("detail").fill_null("").str.contains("Corrected") | pl.col("in_window")
    )
    for key, group in events.filter(keep).group_by("host", "kind", maintain_order=True):
        host, kind = key
        group = group.sort("line")
        times = group["ts"].drop_nulls()
        when = (
            f" from {times.min():%Y-%m-%d %H:%M:%S} to {times.max():%H:%M:%S} UTC"
            if times.len() > 1
            else f" at {times.min():%Y-%m-%d %H:%M:%S} UTC"
            if times.len()
            else ""
        )
        devices = ", ".join(
            sorted(
                {_device_text(owners, host, d) for d in group["device"].drop_nulls().to_list()}
                | set(group["netdev"].drop_nulls().to_list())
            )
        )
        details = sorted({d for d in group["detail"].drop_nulls().to_list()})
        flapped = (
            kind == "link_down"
            and events.filter(pl.col("host").eq_missing(host), pl.col("kind") == "link_up").height > 0
        )
        slow = int(group["in_window"].sum())
        xids = set(group["xid"].drop_nulls().to_list())
        severity = (
            Severity.CRITICAL
            if (xids & set(critical_xids)) or kind in ("nic_error", "oom_kill") or slow
            else Severity.WARNING
        )
        what = (
            f"{'link flap' if group.height == 1 else 'link flaps'} (down, then up again)"
            if flapped
            else KIND_TEXT[kind]
        )
        summary = (
            f"{host or 'A host'} logged {group.height} {what}{when}"
            + (f" on {devices}" if devices else "")
            + (f": {'; '.join(details[:4])}" if details else "")
            + "."
        )
        if slow:
            summary += (
                " It falls" if group.height == 1 else f" {slow} of them {'falls' if slow == 1 else 'fall'}"
            ) + " in a slow window of the steps."
        yield Finding(
            severity=severity,
            title=f"{host or 'host'}: {group.height} {what}"
            + (f" ({details[0]})" if kind == "xid" and details else ""),
            summary=summary,
            evidence=row_evidence(group.iter_rows(named=True), MAX_EVIDENCE, "message"),
            hosts=[host] if host else [],
            window=(times.min(), times.max()) if times.len() else None,
            ports=sorted(set(group["netdev"].drop_nulls().to_list())),
        )


def _device_text(owners: dict, host: str | None, address: str) -> str:
    """`0000:a1:00 (GPU 3)` when the address is a GPU or NIC the run's evidence places there."""
    m = re.search(r"([0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-9a-f])?$", address.lower())
    owner = owners.get((host, m[1])) if m else None
    return f"{address} ({owner})" if owner else address


def _rate_of(rates: pl.DataFrame, hosts: list[str]) -> tuple[float, str] | None:
    """The least link bandwidth (Gb/s, all Active ports summed) over `hosts`, and how it was made."""
    mine = rates.filter(pl.col("host").is_in(hosts))
    if mine.height == 0 or mine["host"].n_unique() < len(hosts):
        return None
    per_host = mine.group_by("host").agg(pl.col("rate_gbps").sum(), pl.len().alias("ports")).sort("rate_gbps")
    low = per_host.row(0, named=True)
    return (
        low["rate_gbps"],
        (
            f"{low['host']}'s {count(low['ports'], 'Active port')} "
            f"{'gives' if low['ports'] == 1 else 'give'} {low['rate_gbps']:g} Gb/s"
        ),
    )


@rule(
    "TL606",
    "nccl-tests-below-link",
    Severity.WARNING,
    needs=("nccl_tests",),
    settings={
        "busbw_share": Setting(
            "share of the link bandwidth",
            "Bus bandwidth at the largest size below this share of the "
            "hosts' link bandwidth is far below it (a healthy fabric gives 0.8 to 0.95).",
        ),
    },
)
def nccl_tests_below_link(ctx: RunContext, *, busbw_share: float = 0.6) -> Iterator[Finding]:
    """
    What it finds: nccl-tests runs (`all_reduce_perf` and the other `*_perf`) across hosts
    whose bus bandwidth at the largest message size is under 60% of what the hosts' links
    give (the Active ports' rate summed per host, from ibstat/ibv_devinfo, in GB/s), and any
    run with a non-zero `#wrong` (results that failed validation).

    Why it slows the run: nccl-tests measures exactly the collective the training job runs;
    large messages should reach 80-95% of the link bandwidth. Far less means the job's
    all-reduce is limited by the same problem (a downshifted or lossy link, the wrong
    transport, no GPUDirect RDMA, a bad PCIe topology). Wrong results mean data corruption:
    a faulty GPU, NIC or driver.

    How to fix: rerun with NCCL_DEBUG=INFO and check the transport (`via NET/IB/0/GDRDMA`),
    NCCL_IB_HCA and the ports' rate (`ibstat`); test each link with `ib_write_bw` between the
    two hosts; check `nvidia-smi topo -m` for the GPU-NIC affinity. For #wrong: run
    `dcgmi diag -r 3` on the hosts and drain the failing one.
    """
    tests = ctx["nccl_tests"]
    if tests.height == 0:
        return
    rates = port_rates(ctx.tables)
    for key, run in tests.filter(pl.col("kind") == "row").group_by("file", "run", maintain_order=True):
        name = run["test"].drop_nulls().first() or "nccl-tests"
        hosts = [h for h in (run["rank_hosts"].drop_nulls().first() or "").split(",") if h]
        wrong = run.filter(pl.col("wrong").fill_null(0) > 0)
        if wrong.height:
            yield _benchmark_finding(
                Severity.CRITICAL,
                f"{name}: {count(wrong.height, 'result')} with #wrong > 0",
                f"{name} in {key[0]} found wrong results at {count(wrong.height, 'size')} (up to "
                f"{wrong['wrong'].max()} wrong elements): the data the collective moved was corrupted.",
                wrong,
                hosts,
            )
        if len(hosts) < 2:
            continue
        largest = largest_size(run)
        busbw = float(largest["busbw_gbs"].max())
        rate = _rate_of(rates, hosts) or _usual_rate(run)
        if rate is None:
            continue
        link_gbs = rate[0] / 8
        if busbw >= busbw_share * link_gbs:
            continue
        size = int(largest["size_bytes"][0])
        yield _benchmark_finding(
            Severity.WARNING,
            f"{name}: bus bandwidth {busbw:g} GB/s, {busbw / link_gbs:.0%} of the link",
            f"{name} across {len(hosts)} hosts reached {busbw:g} GB/s bus bandwidth "
            f"at {size:,} bytes, {busbw / link_gbs:.0%} of the {link_gbs:g} GB/s "
            f"the links give ({rate[1]}); a healthy fabric gives 80-95%.",
            largest,
            hosts,
        )


def _usual_rate(run: pl.DataFrame) -> tuple[float, str] | None:
    """The node's NIC bandwidth (Gb/s) assumed from the GPUs the rank lines name, when no port dump says."""
    gpu, per_host = run["gpu_name"].drop_nulls().first(), run["ranks_per_host"].drop_nulls().first()
    model = next((m for m in USUAL_NIC_PER_GPU if gpu and m in gpu), None)
    if not model or not per_host:
        return None
    gbps = USUAL_NIC_PER_GPU[model] * per_host
    return gbps, (
        f"assumed: {count(per_host, model + ' GPU')} per host with one {USUAL_NIC_PER_GPU[model]:g} Gb/s NIC each, "
        "as such nodes usually have; the hosts' ibstat or ibv_devinfo would say"
    )


def _benchmark_finding(severity: Severity, title: str, summary: str, rows: pl.DataFrame, hosts: list[str]) -> Finding:
    shown = row_evidence(rows.iter_rows(named=True), MAX_EVIDENCE, _benchmark)
    return Finding(severity=severity, title=title, summary=summary, evidence=shown, hosts=hosts)


def _benchmark(row: Mapping[str, Any]) -> str:
    where = f"{row['size_bytes']} bytes {row['placement']}-of-place"
    return f"{where}: busbw {row['busbw_gbs']} GB/s, #wrong {row['wrong']}"


@rule(
    "TL607",
    "perftest-below-line-rate",
    Severity.WARNING,
    needs=("perftest",),
    settings={
        "line_share": Setting(
            "share of the line rate",
            "Average bandwidth at the largest size below this share of the port's "
            "line rate is far below it (a healthy link gives 0.9 or more).",
        ),
    },
)
def perftest_below_line_rate(ctx: RunContext, *, line_share: float = 0.75) -> Iterator[Finding]:
    """
    What it finds: perftest bandwidth runs (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`) whose
    average bandwidth at the largest message size is under 75% of the line rate of the port
    they ran on (the device the header names on that host, from ibstat/ibv_devinfo; else the
    host's fastest Active port).

    Why it slows the run: perftest between two hosts reaches 90%+ of the line rate on a
    healthy link with large messages; far less points at the link itself (downshifted width
    or speed, errors and retransmissions, PFC pause storms on RoCE, a wrong MTU), which
    limits every collective the training job runs over it.

    How to fix: check both ports' rate and width (`ibstat`), their error counters
    (`perfquery -x`, `ethtool -S` on RoCE), the active MTU (`ibv_devinfo`), the PCIe link of
    the NIC (`lspci -vvv`, LnkSta), and rerun with `--report_gbits -a` on each port pair to
    find the bad one.
    """
    runs = ctx["perftest"].filter(pl.col("bw_avg").is_not_null())
    if runs.height == 0:
        return
    rates = port_rates(ctx.tables)
    for _, run in runs.group_by("file", "run", maintain_order=True):
        largest = run.filter(pl.col("bytes") == run["bytes"].max()).row(0, named=True)
        host, device = largest["host"], largest["device"]
        ports = rates.filter(pl.col("host").eq_missing(host))
        on_device = ports.filter(pl.col("ca") == device) if device is not None else ports.clear()  # no -d: any port
        ports = on_device if on_device.height else ports
        if ports.height == 0:
            continue
        line = float(ports["rate_gbps"].max())
        gbps = largest["bw_avg"] * (8 / 1000 if (largest["bw_unit"] or "MB/sec").startswith("MB") else 1.0)
        if gbps >= line_share * line:
            continue
        yield Finding(
            severity=Severity.WARNING,
            title=(
                f"{largest['test']}: {gbps:.1f} Gb/s on {device or 'the port'}, "
                f"{gbps / line:.0%} of its {line:g} Gb/s line rate"
            ),
            summary=(
                f"{largest['test']} on {host or 'a host'} {device or ''} averaged {largest['bw_avg']:g} "
                f"{largest['bw_unit']} ({gbps:.1f} Gb/s) at {largest['bytes']:,} bytes: {gbps / line:.0%} of the "
                f"port's {line:g} Gb/s; a healthy link gives 90% or more."
            ),
            evidence=row_evidence(
                [largest], text=lambda r: f"{r['bytes']} bytes: BW average {r['bw_avg']} {r['bw_unit']}"
            ),
            hosts=[host] if host else [],
            ports=[device] if device else [],
        )


@rule("TL608", "roce-gid-index", Severity.WARNING, needs=("nccl_env|deepspeed_settings", "gids|ib_ports"))
def roce_gid_index(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: NCCL_IB_GID_INDEX (as NCCL echoes it) pointing, on some host, at a GID that
    the host's GID table (`show_gids`, `ibv_devinfo -v`) lists as RoCE v1, as a link-local
    address, or not at all: in containers and pods the index of the RoCE v2 IPv4 GID differs
    between hosts (index 5 on one pod, 7 on the next), so one fixed index is wrong somewhere.

    Why it slows the run: RoCE v1 frames are not routable and carry no IP header, so they get
    no DSCP/ECN treatment: no lossless priority, no congestion control; a link-local GID does
    not reach the other subnet. NCCL then fails to connect, or runs over a path that drops
    and retransmits.

    How to fix: on each host find the RoCE v2 GID of the address NCCL should use (`show_gids
    | grep v2`) and set NCCL_IB_GID_INDEX to it, or, with NCCL 2.21+, unset it and set
    NCCL_IB_ADDR_FAMILY=AF_INET (and NCCL_IB_ROCE_VERSION_NUM=2) so NCCL picks the v2 GID of
    the right address family itself.
    """
    gids = ctx["gids"].filter(pl.col("roce").is_not_null())
    settings = pl.concat([ctx.nccl_settings, ctx.launcher_nccl_settings])
    env = settings.filter(pl.col("name") == "NCCL_IB_GID_INDEX").collect()
    if gids.height == 0 or env.height == 0:
        return
    index = int(env["value"].cast(pl.Int64, strict=False).drop_nulls().mode().first() or -1)
    env_rows = env.filter(pl.col("value").cast(pl.Int64, strict=False) == index)
    for (host,), table in gids.group_by("host", maintain_order=True):
        at = table.filter(pl.col("index") == index)
        v2 = table.filter(pl.col("roce") == "v2", pl.col("ipv4").is_not_null())
        good = at.filter(pl.col("roce") == "v2", ~pl.col("gid").str.to_lowercase().str.starts_with("fe80"))
        if good.height:
            continue
        have = f"index {index} is {at['roce'][0]} {at['gid'][0]}" if at.height else f"there is no GID at index {index}"
        better = (
            f"; its RoCE v2 IPv4 GID is at index {', '.join(map(str, sorted(set(v2['index'].to_list()))))}"
            if v2.height
            else ""
        )
        yield Finding(
            severity=Severity.WARNING,
            title=f"{host or 'A host'}: NCCL_IB_GID_INDEX={index} is not a RoCE v2 IPv4 GID there",
            summary=f"NCCL uses GID index {index}, but on {host or 'this host'} {have}{better}.",
            evidence=evidence(ctx.tables.with_text(env_rows.head(1)))
            + row_evidence(
                (at if at.height else v2).head(4).iter_rows(named=True),
                text=lambda r: (
                    f"{r['ca']} port {r['port']} GID[{r['index']}] {r['gid']} {r['roce']} {r['netdev'] or ''}".strip()
                ),
            ),
            hosts=[host] if host else [],
            ports=sorted({f"{r['ca']}:{r['port']}" for r in table.iter_rows(named=True)}),
        )
