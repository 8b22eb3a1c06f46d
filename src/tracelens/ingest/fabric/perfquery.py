"""`perfquery` dumps (basic, `-x` extended, `-E`/`-D`/... detail blocks) into ib_counters.

The line grammar is grammars/perfquery.lark. A file may hold several port blocks, blocks
of several dumps (with `date` lines between), or a block whose header was lost (the
port then comes from its `PortSelect` line). Each counter row records the counter's
width in that dump (`bits`): basic PortCounters saturate at 2**bits - 1 instead of
wrapping, which the delta stage must know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lark import Transformer

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, LineGrammar, blocks, counter_frame, read_batch

_SNIFF = LineStart(rb"# Port (?:extended )?counters: |# Port\w+ counters: |\w+:\.{3,}(?:\d|0x)")

# Basic PortCounters widths (libibmad fields.c); the extended data counters are 64-bit.
BASIC_BITS = {
    "SymbolErrorCounter": 16,
    "LinkErrorRecoveryCounter": 8,
    "LinkDownedCounter": 8,
    "PortRcvErrors": 16,
    "PortRcvRemotePhysicalErrors": 16,
    "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16,
    "PortXmitConstraintErrors": 8,
    "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4,
    "ExcessiveBufferOverrunErrors": 4,
    "VL15Dropped": 16,
    "PortXmitData": 32,
    "PortRcvData": 32,
    "PortXmitPkts": 32,
    "PortRcvPkts": 32,
    "PortXmitWait": 32,
    "QP1Dropped": 16,
}
DETAIL_BITS = 16  # -E, -D ... detail counters
EXTENDED_DATA = {
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
}
# Names older scripts and OFED 1.x perfquery printed.
ALIASES = {
    "SymbolErrors": "SymbolErrorCounter",
    "LinkRecovers": "LinkErrorRecoveryCounter",
    "LinkDowned": "LinkDownedCounter",
    "RcvErrors": "PortRcvErrors",
    "RcvRemotePhysErrors": "PortRcvRemotePhysicalErrors",
    "RcvSwRelayErrors": "PortRcvSwitchRelayErrors",
    "XmtDiscards": "PortXmitDiscards",
    "XmtConstraintErrors": "PortXmitConstraintErrors",
    "RcvConstraintErrors": "PortRcvConstraintErrors",
    "LinkIntegrityErrors": "LocalLinkIntegrityErrors",
    "ExcBufOverrunErrors": "ExcessiveBufferOverrunErrors",
    "XmtData": "PortXmitData",
    "RcvData": "PortRcvData",
    "XmtPkts": "PortXmitPkts",
    "RcvPkts": "PortRcvPkts",
    "XmtWait": "PortXmitWait",
}
SELECTORS = {"PortSelect", "CounterSelect", "CounterSelect2"}  # not counters
CAP_XMIT_WAIT = 0x1000  # without it perfquery prints PortXmitWait as 0, whatever happened
CAP2_ADDL_EXT = 0x2  # -x error counters are 64-bit (else they are the basic ones)


@dataclass(frozen=True)
class Header:
    kind: str  # perfquery, perfquery_x, perfquery_detail, samples
    node: str
    port: int
    cap_mask: int | None = None
    cap_mask2: int | None = None


@dataclass(frozen=True)
class Field:
    name: str
    value: int | None  # None for hex (select/mask) fields


class _PerfqueryValues(Transformer):
    def counters_header(self, items):
        extended = any(getattr(t, "type", "") == "EXTENDED" for t in items)
        portid, port = [t for t in items if getattr(t, "type", "") in ("PORTID", "INT")]
        masks = next((t for t in items if isinstance(t, tuple)), (None, None))
        return Header("perfquery_x" if extended else "perfquery", str(portid).strip(), int(port), *masks)

    def detail_header(self, items):
        _, portid, port = items
        return Header("perfquery_detail", str(portid).strip(), int(port))

    def samples_header(self, items):
        portid, port = items
        return Header("samples", str(portid).strip(), int(port))

    def capmask(self, items):
        masks = [int(t, 16) for t in items]
        return masks[0], masks[1] if len(masks) > 1 else None

    def field(self, items):
        name, value = items[0], items[-1]
        return Field(ALIASES.get(str(name), str(name)), int(value) if value.type == "INT" else None)


LINES = LineGrammar("perfquery", _PerfqueryValues)


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


def _headerless_kind(fields: list[Field]) -> str:
    names = [f.name for f in fields if f.name not in SELECTORS]
    if names and not any(n in BASIC_BITS or n in EXTENDED_DATA for n in names):
        return "perfquery_detail"
    if "PortUnicastXmitPkts" in names or (
        "PortXmitData" in names
        and "SymbolErrorCounter" in names
        and names.index("PortXmitData") < names.index("SymbolErrorCounter")
    ):
        return "perfquery_x"
    return "perfquery"


def _bits(header: Header, name: str) -> int:
    if header.kind == "perfquery_detail":
        return DETAIL_BITS
    if header.kind == "perfquery_x" and (name in EXTENDED_DATA or (header.cap_mask2 or 0) & CAP2_ADDL_EXT):
        return 64
    return BASIC_BITS.get(name, 64)


def _block_rows(source: InputFile, block: list[DumpLine]) -> list[dict]:
    head = block[0].value if isinstance(block[0].value, Header) else None
    fields = [line for line in block if isinstance(line.value, Field)]
    if head is None:
        select = next((f.value.value for f in fields if f.value.name == "PortSelect"), None)
        if select is None:
            return []
        head = Header(_headerless_kind([f.value for f in fields]), None, select)  # type: ignore[arg-type]
    if head.kind == "samples":
        return []
    lid = re.match(r"Lid (\d+)", head.node or "")
    rows = []
    for line in fields:
        name, value = line.value.name, line.value.value
        if value is None or name in SELECTORS:
            continue
        if name == "PortXmitWait" and head.cap_mask is not None and not head.cap_mask & CAP_XMIT_WAIT:
            continue  # not supported by this port: the printed 0 means nothing
        rows.append(
            line.provenance(source)
            | {
                "node": head.node,
                "lid": int(lid[1]) if lid else None,
                "port": head.port,
                "counter": name,
                "value": value,
                "source": head.kind,
                "bits": _bits(head, name),
            }
        )
    return rows


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    starts = blocks(lines, lambda line: isinstance(line.value, Header))
    return {"ib_counters": [row for block in starts for row in _block_rows(source, block)]}


@input_format("perfquery", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, LINES, _rows, counter_frame)
