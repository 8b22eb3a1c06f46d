"""`ibstatus` dumps (the infiniband-diags script printing sysfs port values) into ib_ports.

The line grammar is grammars/ibstatus.lark. `rate: 100 Gb/sec (4X EDR)` gives both the
rate and the width; RoCE ports keep an IB speed name ("EDR"), so the link layer comes
from `link_layer`, never from the rate.
"""

from __future__ import annotations

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, LineGrammar, read_batch
from tracelens.ingest.fabric.ports import (
    Columns,
    Port,
    PortLines,
    port_rows,
    read_float,
    read_int,
    read_phys_state,
    read_state,
    read_text,
    read_width,
)

_SNIFF = LineStart(rb"Infiniband device '[^']*' port \d+ status:")

COLUMNS: Columns = {
    "base lid": {"lid": read_int},
    "state": {"state": read_state},
    "phys state": {"phys_state": read_phys_state},
    "rate": {"rate_gbps": read_float, "width": read_width},
    "link_layer": {"link_layer": read_text},
}


class _IbstatusValues(PortLines):
    def port(self, items):
        device, number = items
        return Port(int(number), device[1:-1])


LINES = LineGrammar("ibstatus", _IbstatusValues)


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    return {"ib_ports": port_rows(source, lines, "ibstatus", COLUMNS)}


@input_format("ibstatus", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, LINES, _rows)
