"""Synthetic fabric dumps as the real tools print them (docs/formats/fabric.md):
`perfquery` (basic and -x), the same PMA counters and the mlx5 hw_counters read from sysfs
(`grep "" .../ports/1/counters/* .../hw_counters/*`, what RoCE ports, which have no LID
to query, leave), `ibstat` and `ethtool -S`, each after a `date` line, as a collection
script run before, during and after a job leaves them.

`FabricPort` describes one HCA port and how its counters move; `port_dumps` writes one
host's dump files at one moment. Counter values are a pure function of the port, the
moment and the port's story, so before/after pairs regenerate byte-identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tracelens.ingest.fabric.hw_counters import SYSFS_NAMES
from tracelens.ingest.fabric.perfquery import BASIC_BITS

BASIC_ORDER = [
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
]
DATA_ORDER = ["PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts"]
CAST_ORDER = ["PortUnicastXmitPkts", "PortUnicastRcvPkts", "PortMulticastXmitPkts", "PortMulticastRcvPkts"]
WORDS_PER_SECOND = 400e9 / 8 / 4 * 0.6  # a 400 Gb/s port at 60% load, in 4-byte words
SYSFS_FILES = {name: file for file, name in SYSFS_NAMES.items()}  # perfquery name -> sysfs counters/ file
HW_COUNTERS = (  # mlx5's hw_counters/ files that tell about RDMA transport and congestion
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_transport_retries_exceeded",
    "rnr_nak_retry_err",
    "rp_cnp_handled",
    "rp_cnp_ignored",
)


@dataclass(frozen=True)
class FabricPort:
    """An HCA port: identity, link, and counters that rise by `per_second` from `base`."""

    ca: str
    port: int = 1
    lid: int = 1
    rate: int = 400
    width: str = "4X"
    state: str = "Active"
    phys_state: str = "LinkUp"
    link_layer: str = "InfiniBand"
    base: dict[str, int] = field(default_factory=dict)  # values when the counters were cleared
    per_second: dict[str, float] = field(default_factory=dict)  # rises besides traffic
    background: dict[str, float] = field(default_factory=dict)  # rises per second all along (a port's usual few errors)

    def counters(self, seconds: float, rising_s: float | None = None) -> dict[str, int]:
        """Every counter's value `seconds` after the counters were cleared, `per_second` having
        applied for `rising_s` of them (all of them by default), `background` for all of them."""
        words = int(WORDS_PER_SECOND * seconds)
        values = {name: 0 for name in BASIC_ORDER + ["PortXmitWait", "QP1Dropped"]}
        values |= {
            "PortXmitData": words,
            "PortRcvData": words,
            "PortXmitPkts": words // 1024,
            "PortRcvPkts": words // 1024,
            "PortUnicastXmitPkts": words // 1024,
            "PortUnicastRcvPkts": words // 1024,
            "PortMulticastXmitPkts": 3,
            "PortMulticastRcvPkts": 3,
        }
        for name, rate in self.per_second.items():
            values[name] = values.get(name, 0) + int(rate * (seconds if rising_s is None else rising_s))
        for name, rate in self.background.items():
            values[name] = values.get(name, 0) + int(rate * seconds)
        for name, value in self.base.items():
            values[name] = values.get(name, 0) + value
        return values


def field_line(name: str, value: int | str) -> str:
    """`Name:.....value` with the value at column 34, as libibmad pads it."""
    return f"{name}:".ljust(33, ".") + str(value)


def date_line(at: datetime) -> str:
    """`date -u` output, e.g. `Tue Mar  5 09:00:00 UTC 2024`."""
    return at.strftime("%a %b ") + f"{at.day:2d}" + at.strftime(" %H:%M:%S UTC %Y")


def perfquery(port: FabricPort, values: dict[str, int], extended: bool = False) -> str:
    """One port block of `perfquery` (basic PortCounters, saturating) or `perfquery -x`."""
    if extended:
        lines = [
            f"# Port extended counters: Lid {port.lid} port {port.port} (CapMask: 0x5300 CapMask2: 0x0000002)",
            field_line("PortSelect", port.port),
            field_line("CounterSelect", "0x0000"),
        ]
        lines += [field_line(n, values[n]) for n in DATA_ORDER + CAST_ORDER]
        lines += [field_line("CounterSelect2", "0x00000000")]
        lines += [field_line(n, values[n]) for n in BASIC_ORDER + ["PortXmitWait", "QP1Dropped"]]
        return "\n".join(lines) + "\n\n"
    pinned = {n: min(v, 2 ** BASIC_BITS[n] - 1) for n, v in values.items() if n in BASIC_BITS}
    lines = [
        f"# Port counters: Lid {port.lid} port {port.port} (CapMask: 0x1400)",
        field_line("PortSelect", port.port),
        field_line("CounterSelect", "0x0000"),
    ]
    lines += [field_line(n, pinned[n]) for n in BASIC_ORDER[:10]]
    lines += [field_line("CounterSelect2", "0x00")]
    lines += [field_line(n, pinned[n]) for n in BASIC_ORDER[10:] + DATA_ORDER + ["PortXmitWait"]]
    return "\n".join(lines) + "\n"


def sysfs(port: FabricPort, values: dict[str, int]) -> str:
    """`grep "" .../ports/N/counters/* .../ports/N/hw_counters/*` for one port (grep sorts the files)."""
    base = f"/sys/class/infiniband/{port.ca}/ports/{port.port}"
    pma = sorted(
        (SYSFS_FILES[n], min(v, 2 ** BASIC_BITS.get(n, 64) - 1)) for n, v in values.items() if n in SYSFS_FILES
    )
    hw = sorted((n, values.get(n, 0)) for n in {*HW_COUNTERS, *values} - SYSFS_FILES.keys() - {"QP1Dropped"})
    return "".join(f"{base}/counters/{f}:{v}\n" for f, v in pma) + "".join(
        f"{base}/hw_counters/{n}:{v}\n" for n, v in hw
    )


def ibstat(ports: list[FabricPort]) -> str:
    """`ibstat` for the CAs of `ports` (tabs, as the tool prints them; RoCE ports have no LID or SM)."""
    lines = []
    for i, port in enumerate(ports):
        guid = f"0x0c42a1030065{i:04x}"
        roce = port.link_layer == "Ethernet"
        lines += [
            f"CA '{port.ca}'",
            "\tCA type: MT4129",
            "\tNumber of ports: 1",
            "\tFirmware version: 28.39.1002",
            "\tHardware version: 0",
            f"\tNode GUID: {guid}",
            f"\tSystem image GUID: {guid}",
            f"\tPort {port.port}:",
            f"\t\tState: {port.state}",
            f"\t\tPhysical state: {port.phys_state}",
            f"\t\tRate: {port.rate}",
            f"\t\tBase lid: {port.lid}",
            "\t\tLMC: 0",
            f"\t\tSM lid: {0 if roce else 1}",
            f"\t\tCapability mask: {'0x00010000' if roce else '0xa751e848'}",
            f"\t\tPort GUID: {guid}",
            f"\t\tLink layer: {port.link_layer}",
        ]
    return "\n".join(lines) + "\n"


def ethtool(values: dict[str, int]) -> str:
    """`ethtool -S` output: the header, then `     name: value` lines."""
    return "NIC statistics:\n" + "".join(f"     {name}: {value}\n" for name, value in values.items())


def port_dumps(
    host: str,
    ports: list[FabricPort],
    at: datetime,
    seconds: float,
    extended: bool = True,
    rising_s: float | None = None,
    tool: str = "perfquery",
) -> str:
    """A collection script's output on one host: hostname, date, then perfquery (`-x` if `extended`)
    or the sysfs counters of each port."""
    dump = {"perfquery": lambda p, v: perfquery(p, v, extended), "sysfs": sysfs}[tool]
    blocks = "".join(dump(p, p.counters(seconds, rising_s)) for p in ports)
    return f"# hostname\n{host}\n{date_line(at)}\n{blocks}"
