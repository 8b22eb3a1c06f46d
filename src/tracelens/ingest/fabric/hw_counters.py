"""RDMA port counters from sysfs (`grep "" .../ports/1/hw_counters/*`, `.../counters/*`)
and `rdma statistic show link` into ib_counters.

The format is grammars/hw_counters.lark, read with the equivalent regular expressions
below (tests prove they agree). `hw_counters/` rows keep the driver's names
(out_of_sequence, local_ack_timeout_err ...; source "hw_counters"); the IB PMA
`counters/` files get perfquery's names (symbol_error -> SymbolErrorCounter; source
"sysfs_counters"), so the rules read them like perfquery dumps.
"""

from __future__ import annotations

import re

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, counter_frame, read_batch
from tracelens.ingest.fabric.perfquery import BASIC_BITS, EXTENDED_DATA

_SYSFS = re.compile(
    r"^\s*(?:(?:\S*/)?(?P<dev>[^/\s]+)/ports/(?P<port>\d+)/)?(?P<dir>hw_counters|counters)/(?P<name>\w+):(?P<value>\d+)\s*$"
)
_RDMA = re.compile(r"^\s*link\s+(?P<dev>[^\s/]+)/(?P<port>\d+)\s+(?P<pairs>(?:[A-Za-z_]\w*\s+\d+\s*)+)$")
_SYSFS_SNIFF = re.compile(rb"/ports/\d+/(?:hw_)?counters/\w+:\d+")
_LINK = LineStart(rb"link \S+/\d+ \w+ \d+")

# sysfs names of the IB PMA counters (drivers/infiniband/core/sysfs.c) -> perfquery names.
SYSFS_NAMES = {
    "symbol_error": "SymbolErrorCounter",
    "link_error_recovery": "LinkErrorRecoveryCounter",
    "link_downed": "LinkDownedCounter",
    "port_rcv_errors": "PortRcvErrors",
    "port_rcv_remote_physical_errors": "PortRcvRemotePhysicalErrors",
    "port_rcv_switch_relay_errors": "PortRcvSwitchRelayErrors",
    "port_xmit_discards": "PortXmitDiscards",
    "port_xmit_constraint_errors": "PortXmitConstraintErrors",
    "port_rcv_constraint_errors": "PortRcvConstraintErrors",
    "local_link_integrity_errors": "LocalLinkIntegrityErrors",
    "excessive_buffer_overrun_errors": "ExcessiveBufferOverrunErrors",
    "VL15_dropped": "VL15Dropped",
    "port_xmit_data": "PortXmitData",
    "port_rcv_data": "PortRcvData",
    "port_xmit_packets": "PortXmitPkts",
    "port_rcv_packets": "PortRcvPkts",
    "port_xmit_wait": "PortXmitWait",
    "unicast_xmit_packets": "PortUnicastXmitPkts",
    "unicast_rcv_packets": "PortUnicastRcvPkts",
    "multicast_xmit_packets": "PortMulticastXmitPkts",
    "multicast_rcv_packets": "PortMulticastRcvPkts",
}


def parse_line(text: str) -> list[dict] | None:
    """One line -> its counters as dicts (device, port, counter, value, source, bits), or None."""
    if m := _SYSFS.match(text):
        name, source, bits = m["name"], "hw_counters", 64
        if m["dir"] == "counters":
            name, source = SYSFS_NAMES.get(name, name), "sysfs_counters"
            bits = 64 if name in EXTENDED_DATA else BASIC_BITS.get(name, 64)
        return [
            {
                "ca": m["dev"],
                "port": int(m["port"]) if m["port"] else None,
                "counter": name,
                "value": int(m["value"]),
                "source": source,
                "bits": bits,
            }
        ]
    if m := _RDMA.match(text):
        words = m["pairs"].split()
        return [
            {
                "ca": m["dev"],
                "port": int(m["port"]),
                "counter": name,
                "value": int(value),
                "source": "hw_counters",
                "bits": 64,
            }
            for name, value in zip(words[::2], words[1::2])
        ]
    return None


def sniff(head: bytes) -> bool:
    return (b"/ports/" in head and _SYSFS_SNIFF.search(head) is not None) or _LINK.search(head)


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    return {
        "ib_counters": [
            line.provenance(source) | {"node": counter["ca"]} | counter for line in lines for counter in line.value
        ]
    }


@input_format("hw_counters", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, parse_line, _rows, counter_frame)
