"""NCCL_DEBUG=INFO output as a given NCCL version writes it.

The functions here return the lines (or message bodies) of one process; which
words and fields appear depends on the version, following the per-version
tables of docs/formats/nccl.md. When lines
are printed, interleaved and into which file is `runs`' business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Version:
    """An NCCL release and the CUDA it was built for; `at_least("2.23")` picks formats."""

    text: str = "2.21.5"
    cuda: str = "12.4"

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.text.split("."))

    def at_least(self, text: str) -> bool:
        return self.key >= tuple(int(part) for part in text.split("."))

    def between(self, first: str, before: str) -> bool:
        return self.at_least(first) and not self.at_least(before)

    @property
    def banner(self) -> str:
        return f"NCCL version {self.text}+cuda{self.cuda}"


@dataclass(frozen=True)
class Host:
    """One node as NCCL sees it: GPUs, network devices, NCCL build and NCCL_* environment."""

    name: str
    ip: str
    gpus: int = 4
    version: Version = field(default_factory=Version)
    iface: str = "eth0"  # bootstrap and socket interface
    hcas: tuple[str, ...] = ("mlx5_0", "mlx5_1")  # () = no IB device found
    link_layer: str = "IB"  # of the HCA ports, as NCCL lists them: IB or RoCE
    gdr: bool = True  # GPUDirect RDMA usable (nvidia-peermem loaded)
    p2p: str = "P2P/IPC/read"  # intra-node transport token
    env: tuple[tuple[str, str], ...] = ()  # NCCL_* variables set, echoed by NCCL

    @property
    def network(self) -> str:
        env = dict(self.env)
        if not self.hcas or env.get("NCCL_IB_DISABLE") == "1" or env.get("NCCL_NET") == "Socket":
            return "Socket"
        return "IB"


@dataclass
class Process:
    """One rank's process as NCCL names it in every line: `host:pid:tid [cudaDev]`."""

    host: Host
    pid: int
    dev: int
    init_tid: int  # the thread running communicator init
    proxy_tid: int  # the proxy progress thread, where network errors surface
    version_shown: bool = False

    @property
    def version(self) -> Version:
        return self.host.version

    def info(self, message: str, tid: int | None = None) -> str:
        return self._fit(f"{self.host.name}:{self.pid}:{tid or self.pid} [{self.dev}] NCCL INFO {message}")

    def warn(self, where: str, message: str, tid: int, when: datetime) -> list[str]:
        """A WARN comes after an empty line; from 2.26 it carries a local-time stamp."""
        stamp = when.strftime("[%Y-%m-%d %H:%M:%S] ") if self.version.at_least("2.26") else ""
        return ["", self._fit(f"{stamp}{self.host.name}:{self.pid}:{tid} [{self.dev}] {where} NCCL WARN {message}")]

    def _fit(self, line: str) -> str:
        """Up to 2.28 a line is formatted into a 1024-byte buffer and cut at 1023 characters."""
        return line if self.version.at_least("2.29") else line[:1023]


def env_echo(name: str, value: str) -> str:
    """Integer parameters end with a period, string ones do not."""
    return f"{name} set by environment to {value}{'.' if value.lstrip('-').isdigit() else ''}"


def process_start(proc: Process) -> list[str]:
    """What every process prints before its first communicator: driver, bootstrap, plugin probe."""
    v, host = proc.version, proc.host
    major, minor = v.cuda.split(".")
    lines = [f"cudaDriverVersion {int(major) * 1000 + int(minor) * 10}"]
    if v.at_least("2.23"):
        lines.append(v.banner)  # from 2.23 an INFO line of every process
    lines += [env_echo(k, val) for k, val in host.env if k == "NCCL_SOCKET_IFNAME"]
    lines.append(f"Bootstrap : Using {host.iface}:{host.ip}<0>")
    if v.at_least("2.19"):
        lines += [
            "NET/Plugin: No plugin found (libnccl-net.so)",
            "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: "
            "No such file or directory : when loading libnccl-net.so",
            "NET/Plugin: Using internal network plugin.",
        ]
    else:
        lines += [
            "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: "
            "No such file or directory",
            "NET/Plugin : No plugin found, using internal implementation",
        ]
    return lines


def net_init(proc: Process) -> list[str]:
    """Which network NCCL picks on this host, and why."""
    host = proc.host
    lines = [env_echo(k, val) for k, val in host.env if k != "NCCL_SOCKET_IFNAME"]
    oob = f"{host.iface}:{host.ip}<0>"
    if host.network == "IB":
        devices = " ".join(f"[{i}]{hca}:1/{host.link_layer}" for i, hca in enumerate(host.hcas))
        lines.append(f"NET/IB : Using {devices} [RO]; OOB {oob}")
    else:
        if host.hcas == () and dict(host.env).get("NCCL_IB_DISABLE") != "1":
            lines.append("NET/IB : No device found.")
        lines.append(f"NET/Socket : Using [0]{oob}")
    if proc.version.between("2.19", "2.22"):
        lines.append("Using non-device net plugin version 0")
    lines.append(f"Using network {host.network}")
    return lines


def gdr_disabled(proc: Process) -> list[str]:
    """Per-HCA GPUDirect RDMA verdicts, NET subsystem lines: shown with NCCL_DEBUG_SUBSYS=INIT,NET."""
    return [f"NET/IB : GPU Direct RDMA Disabled for HCA {i} '{hca}'" for i, hca in enumerate(proc.host.hcas)]


@dataclass
class Member:
    """A process's seat in a communicator."""

    proc: Process
    ptr: str  # the `comm 0x...` pointer, distinct per process


@dataclass
class Comm:
    """A communicator: members in rank order, one ring in rank order, one binary tree of hosts per channel."""

    members: list[Member]
    comm_hash: str
    channels: int = 2

    def __post_init__(self) -> None:
        # Indexes, so that jobs of hundreds of ranks stay quick to lay out.
        self._host = [m.proc.host.name for m in self.members]
        self._ranks_on: dict[str, list[int]] = {}
        for rank, host in enumerate(self._host):
            self._ranks_on.setdefault(host, []).append(rank)
        self._tree_edges: dict[int, list[tuple[int, int]]] = {}

    @property
    def nranks(self) -> int:
        return len(self.members)

    def host_of(self, rank: int) -> str:
        return self._host[rank]

    def hosts(self) -> list[str]:
        return list(self._ranks_on)

    def locals(self, rank: int) -> list[int]:
        return self._ranks_on[self._host[rank]]

    def tree(self, channel: int, rank: int) -> tuple[list[int], int]:
        """(children, parent) of `rank`: a chain inside each host below its first rank; hosts in a binary tree."""
        local = self.locals(rank)
        k = local.index(rank)
        if k > 0:
            return local[k + 1 : k + 2], local[k - 1]
        hosts = self.hosts()[:: -1 if channel % 2 else 1]
        i = hosts.index(self.host_of(rank))
        children = local[1:2] + [self._ranks_on[hosts[j]][0] for j in (2 * i + 1, 2 * i + 2) if j < len(hosts)]
        return children, self._ranks_on[hosts[(i - 1) // 2]][0] if i > 0 else -1

    def ring_edges(self) -> list[tuple[int, int]]:
        return [(r, (r + 1) % self.nranks) for r in range(self.nranks)] if self.nranks > 1 else []

    def tree_edges(self, channel: int) -> list[tuple[int, int]]:
        """Tree connections go both ways: up for reduce, down for broadcast."""
        if channel not in self._tree_edges:
            edges = []
            for r in range(self.nranks):
                parent = self.tree(channel, r)[1]
                if parent >= 0:
                    edges += [(r, parent), (parent, r)]
            self._tree_edges[channel] = edges
        return self._tree_edges[channel]


def _dev(comm: Comm, rank: int) -> str:
    return f"{rank}[{comm.members[rank].proc.dev}]"  # nvmlDev in 2.18+


def _via(host: Host, channel: int) -> str:
    if host.network == "Socket":
        return "NET/Socket/0"
    return f"NET/IB/{channel % len(host.hcas)}{'/GDRDMA' if host.gdr else ''}"


def connection_lines(comm: Comm, rank: int, edges: list[tuple[int, int]], channel: int) -> list[str]:
    """`Channel CC/0 : a[d] -> b[d] ...` lines this rank prints for the given connections."""
    lines = []
    me = comm.members[rank].proc.host
    for src, dst in edges:
        head = f"Channel {channel:02d}/0 : {_dev(comm, src)} -> {_dev(comm, dst)}"
        same_host = comm.host_of(src) == comm.host_of(dst)
        if src == rank:
            lines.append(f"{head} via {me.p2p}" if same_host else f"{head} [send] via {_via(me, channel)}")
        elif dst == rank and not same_host:
            lines.append(f"{head} [receive] via {_via(me, channel)}")
    return lines


def _ring_order(comm: Comm, channel: int, version: Version) -> str:
    """Rank 0 prints each ring: ` %3d` for the first 20 ranks up to 2.22, ` %*d` for all of them from 2.23."""
    head = f"Channel {channel:02d}/{comm.channels:02d} :"
    if version.at_least("2.23"):
        width = len(str(comm.nranks - 1))
        return head + "".join(f" {r:{width}d}" for r in range(comm.nranks))
    return head + " " + "".join(f" {r:3d}" for r in range(min(comm.nranks, 20)))


def _trees(comm: Comm, rank: int) -> str:
    parts = []
    for c in range(comm.channels):
        children, parent = comm.tree(c, rank)
        down = "/".join(str(x) for x in (children + [-1, -1, -1])[:3])
        parts.append(f" [{c}] {down}->{rank}->{parent}")
    return "Trees" + "".join(parts)


def _affinity(dev: int, gpus: int) -> str:
    return "ffffffff,00000000" if dev >= max(gpus // 2, 1) else "00000000,ffffffff"


def comm_init(comm: Comm, rank: int, timings: Callable[[], list[float]]) -> list[str]:
    """Everything one member prints from Init START to Init COMPLETE.

    `timings` gives the eight phase durations of 2.22.3+'s `Init timings` line.
    """
    member = comm.members[rank]
    proc, v, n = member.proc, member.proc.version, comm.nranks
    local = comm.locals(rank)
    api = "ncclCommInitRank " if v.at_least("2.21") else ""
    ident = (
        f"{api}comm {member.ptr} rank {rank} nranks {n} cudaDev {proc.dev} nvmlDev {proc.dev} "
        f"busId {bus_id(proc.dev)} commId 0x{comm.comm_hash}"
    )
    lines = [f"{ident} - Init START"]
    if proc.host.network == "IB" and not proc.host.gdr:
        lines += gdr_disabled(proc)
    lines.append(f"Setting affinity for GPU {proc.dev} to {_affinity(proc.dev, proc.host.gpus)}")
    if v.at_least("2.20"):
        lines.append(
            f"comm {member.ptr} rank {rank} nRanks {n} nNodes {len(comm.hosts())} "
            f"localRanks {len(local)} localRank {local.index(rank)} MNNVL 0"
        )
    if rank == 0:
        lines += [_ring_order(comm, c, v) for c in range(comm.channels)]
    lines += [_trees(comm, rank), "P2P Chunksize set to 524288"]
    for c in range(comm.channels):
        lines += connection_lines(comm, rank, comm.ring_edges(), c)
    gdr = int(proc.host.network == "IB" and proc.host.gdr)
    lines.append(f"Connected all rings, use ring PXN 0 GDR {gdr}" if v.at_least("2.24.3") else "Connected all rings")
    for c in range(comm.channels):
        lines += connection_lines(comm, rank, comm.tree_edges(c), c)
    lines += ["Connected all trees", f"threadThresholds 8/8/64 | {8 * n}/8/64 | 512 | 512"]
    collnet = "0 collnet channels, " if v.at_least("2.20") else ""
    lines.append(
        f"{comm.channels} coll channels, {collnet}0 nvls channels, {2 * comm.channels} p2p channels, "
        f"{comm.channels} p2p channels per peer"
    )
    lines.append(f"{ident} - Init COMPLETE")
    if v.at_least("2.22.3"):
        t = timings()
        lines.append(
            f"Init timings - {api.strip()}: rank {rank} nranks {n} total {sum(t):.2f} (kernels {t[0]:.2f}, "
            f"alloc {t[1]:.2f}, bootstrap {t[2]:.2f}, allgathers {t[3]:.2f}, topo {t[4]:.2f}, graphs {t[5]:.2f}, "
            f"connections {t[6]:.2f}, rest {t[7]:.2f})"
        )
    return lines


_BUS_IDS = ("1b000", "29000", "3d000", "4e000", "9b000", "ac000", "bc000", "dc000")


def bus_id(dev: int) -> str:
    """PCI bus id of GPU `dev` on the synthetic 8-GPU board."""
    return _BUS_IDS[dev % len(_BUS_IDS)]


# Where each version's IB completion WARN is raised and how it words it.
_IB_WARN_SITE = (("2.28.7", 2543), ("2.23", 2121), ("2.20", 1909), ("2.18", 1295))
_WC_STATUS = {5: "IBV_WC_WR_FLUSH_ERR", 12: "IBV_WC_RETRY_EXC_ERR"}
_WC_OPCODE = {0: "IBV_WC_SEND", 128: "IBV_WC_RECV"}


@dataclass(frozen=True)
class IbError:
    """One failed work completion as the NCCL proxy reports it."""

    peer: str  # ip<port> of the remote side
    status: int  # ibv_wc_status: 12 retry exceeded, 5 flushed after an earlier error
    vendor_err: int
    req: str  # Send / Recv
    local_gid: str
    remote_gid: str
    hca: str
    opcode: int = 0
    length: int = 0


def ib_completion_error(proc: Process, err: IbError, when: datetime) -> list[str]:
    """The completion WARN and the error propagation that follows it up to the proxy thread."""
    v = proc.version
    gids = f" localGid {err.local_gid} remoteGids{err.remote_gid}"
    if v.at_least("2.28.7"):
        message = (
            f"NET/IB: Got completion from peer {err.peer} with status={_WC_STATUS[err.status]}({err.status}) "
            f"opcode={_WC_OPCODE[err.opcode]}({err.opcode}) reqSize={err.length} vendor_err={err.vendor_err} "
            f"req_type={err.req}{gids} hca {err.hca}"
        )
    elif v.at_least("2.22.3"):
        message = (
            f"NET/IB: Got completion from peer {err.peer} with status={err.status} opcode={err.opcode} "
            f"len={err.length} vendor err {err.vendor_err} ({err.req}){gids} hca {err.hca}"
        )
    elif v.at_least("2.20"):
        message = (
            f"NET/IB : Got completion from peer {err.peer} with status={err.status} opcode={err.opcode} "
            f"len={err.length} vendor err {err.vendor_err} ({err.req}){gids}"
        )
    else:
        message = (
            f"NET/IB : Got completion from peer {err.peer} with error {err.status}, opcode {err.opcode}, "
            f"len {err.length}, vendor err {err.vendor_err} ({err.req}){gids}"
        )
    line = next(n for first, n in _IB_WARN_SITE if v.at_least(first))
    thread = "Progress Thread" if v.at_least("2.19") else "Proxy Thread"
    return proc.warn(f"transport/net_ib.cc:{line}", message, proc.proxy_tid, when) + [
        proc.info("transport/net.cc:1146 -> 6", proc.proxy_tid),
        proc.info(f"proxy.cc:{886 if v.at_least('2.19') else 858} -> 6 [{thread}]", proc.proxy_tid),
    ]


def collective(
    op: str, op_count: int, buff: str, count: int, datatype: int, member: Member, nranks: int, stream: str
) -> str:
    """A COLL-subsystem line, one per collective call and rank (NCCL_DEBUG_SUBSYS=COLL)."""
    return (
        f"{op}: opCount {op_count:x} sendbuff {buff} recvbuff {buff} count {count} datatype {datatype} op 0 root 0 "
        f"comm {member.ptr} [nranks={nranks}] stream {stream}"
    )
