"""`ibstat` dumps (one or many CAs, IB or Ethernet link layer) into ib_ports.

The line grammar is grammars/ibstat.lark; src/tracelens/ingest/fabric/ports.py turns the
CA / Port / attribute lines into rows.
"""

from __future__ import annotations

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, LineGrammar, read_batch
from tracelens.ingest.fabric.ports import (
    Columns,
    Device,
    PortLines,
    port_rows,
    read_float,
    read_int,
    read_phys_state,
    read_state,
    read_text,
)

_SNIFF = LineStart(rb"CA '[^']*'\r?\n\s+CA type:")

COLUMNS: Columns = {
    "CA type": {"ca_type": read_text},
    "Node GUID": {"node_guid": read_text},
    "State": {"state": read_state},
    "Physical state": {"phys_state": read_phys_state},
    "Rate": {"rate_gbps": read_float},
    "Base lid": {"lid": read_int},
    "Link layer": {"link_layer": read_text},
}


class _IbstatValues(PortLines):
    def ca(self, items):
        return Device(items[0][1:-1])


LINES = LineGrammar("ibstat", _IbstatValues)


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    return {"ib_ports": port_rows(source, lines, "ibstat", COLUMNS)}


@input_format("ibstat", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, LINES, _rows)
