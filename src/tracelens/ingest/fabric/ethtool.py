"""`ethtool -S <netdev>` dumps (mlx5 RoCE NICs above all) into ib_counters.

The format is grammars/ethtool.lark; a NIC prints a thousand counters or more, so
lines are read with the equivalent regular expression below (tests prove they agree).
The netdev is named only by the command line when the file shows it
(`$ ethtool -S ens1f0 | grep prio`); it goes in `node`.
"""

from __future__ import annotations

import re

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, counter_frame, read_batch

_SNIFF = LineStart(rb"NIC statistics:|\s+(?:rx|tx)_\w+: \d+\r?$")
_COUNTER = re.compile(r"^\s*(?P<name>[^\s:].*?)\s*:\s*(?P<value>\d+)\s*$")  # bnxt: `[0]: rx_ucast_packets: 5`
_NETDEV = re.compile(r"ethtool\s+(?:-S|--statistics)\s+(?P<dev>[\w.@-]+)")
HEADER = "NIC statistics:"


def parse_line(text: str) -> tuple[str, int] | str | None:
    """`rx_prio0_bytes: 42` -> (name, value); the header -> HEADER; else None."""
    if text.strip() == HEADER:
        return HEADER
    m = _COUNTER.match(text)
    return (m["name"], int(m["value"])) if m else None


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    rows = []
    for line in lines:
        if line.value == HEADER:
            continue
        netdev = _NETDEV.search(line.command or "")
        name, value = line.value
        rows.append(
            line.provenance(source)
            | {
                "node": netdev["dev"] if netdev else None,
                "counter": name,
                "value": value,
                "source": "ethtool",
                "bits": 64,
            }
        )
    return {"ib_counters": rows}


@input_format("ethtool", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, parse_line, _rows, counter_frame)
