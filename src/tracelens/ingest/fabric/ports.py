"""What the port-status formats (ibstat, ibstatus, ibv_devinfo) share: turning a stream
of "device", "port" and "attribute" lines into ib_ports rows, and reading the values
each tool prints its own way (`Active`, `4: ACTIVE`, `PORT_ACTIVE (4)`) into one spelling.

A format module's line transformer yields `Device(name)`, `Port(number, device=None)`
and `Attribute(key, value)`; its `COLUMNS` maps the tool's attribute keys to the
ib_ports columns they give, each with its reader. Attributes before the first port belong to the device
and are copied into each of its ports; a dump that starts in the middle of a port
record (a cut paste) still gives that port's row, with the device and number unknown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lark import Transformer

from tracelens.ingest import InputFile
from tracelens.ingest.fabric.dumps import DumpLine
from tracelens.ingest.text.lines import checked_float

STATES = {1: "Down", 2: "Initializing", 3: "Armed", 4: "Active", 5: "ActiveDefer"}
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
_NAMES = {re.sub(r"[^a-z]", "", name.lower()): name for name in [*STATES.values(), *PHYS_STATES.values()]}
_NAMES |= {
    "init": "Initializing",
    "portdown": "Down",
    "portinit": "Initializing",
    "portarmed": "Armed",
    "portactive": "Active",
    "portactivedefer": "ActiveDefer",
}


@dataclass(frozen=True)
class Device:
    name: str


@dataclass(frozen=True)
class Port:
    number: int
    device: str | None = None  # ibstatus names the device on the port line


@dataclass(frozen=True)
class Attribute:
    key: str
    value: str


class PortLines(Transformer):
    """The transformer part the port-status grammars share: `KEY: VALUE` attribute lines and the
    port header (`Port 1:`, `port:   1`)."""

    def attribute(self, items):
        return Attribute(str(items[0]), str(items[1]) if len(items) > 1 else "")

    def port(self, items):
        return Port(first_number(items[0]))


def first_number(token: str) -> int:
    """The number in a token whose pattern holds one (a port header, a GID index)."""
    found = re.search(r"\d+", token)
    if found is None:
        raise ValueError(f"no number in {token!r}")
    return int(found[0])


def read_state(text: str, names: dict[int, str] = STATES) -> str:
    """`Active`, `4: ACTIVE`, `PORT_ACTIVE (4)`: the code when printed, else the name."""
    if m := re.search(r"(?:^|\()(\d+)(?:\)|:|$)", text.strip()):
        return names.get(int(m[1]), text.strip())
    word = re.sub(r"[^a-z]", "", text.lower())
    return _NAMES.get(word, text.strip())


def read_phys_state(text: str) -> str:
    return read_state(text, PHYS_STATES)


def read_int(text: str) -> int | None:
    """`987`, `0x0`, `4096 (5)`: the first number, hex when so written."""
    if m := re.match(r"\s*(0x[0-9a-fA-F]+|\d+)", text):
        return int(m[1], 0) if m[1].startswith("0x") else int(m[1])
    return None


def read_float(text: str) -> float | None:
    m = re.match(r"\s*(\d+(?:\.\d+)?)", text)
    try:
        return checked_float(m[1]) if m else None
    except ValueError:  # no rate a port reports
        return None


def read_width(text: str) -> str | None:
    """`4X (2)`, `100 Gb/sec (4X EDR)`: the link width, e.g. `4X`."""
    m = re.search(r"\b(\d+X)\b", text)
    return m[1] if m else None


def read_text(text: str) -> str:
    return text.strip()


Columns = dict[str, dict[str, Callable[[str], Any]]]  # tool's key -> {ib_ports column: reader}


class _PortRows:
    """Builds ib_ports rows from a dump's Device / Port / Attribute lines."""

    def __init__(self, source: InputFile, tool: str, columns: Columns) -> None:
        self.source = source
        self.tool = tool
        self.columns = columns
        self.device: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None

    def _open_port(self, line: DumpLine, number: int | None, device: str | None = None) -> dict[str, Any]:
        if device is not None:
            self.device = {"ca": device}
        row = line.provenance(self.source) | {"source": self.tool, **self.device, "port": number}
        del row["dump_ts"]
        self.rows.append(row)
        return row

    def feed(self, line: DumpLine) -> None:
        value = line.value
        if isinstance(value, Device):
            self.device = {"ca": value.name}
            self.current = None
        elif isinstance(value, Port):
            self.current = self._open_port(line, value.number, value.device)
        elif isinstance(value, Attribute) and value.key in self.columns:
            readers = self.columns[value.key]
            if self.current is None and not readers.keys() <= DEVICE_COLUMNS:
                self.current = self._open_port(line, None)  # the paste began inside a port record
            target = self.current if self.current is not None else self.device
            for column, reader in readers.items():
                target[column] = reader(value.value)


DEVICE_COLUMNS = {"ca_type", "node_guid"}


def port_rows(
    source: InputFile,
    lines: list[DumpLine],
    tool: str,
    columns: Columns,
    finish: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """A port-status dump's parsed lines as ib_ports rows; `finish` may complete each row (e.g. its rate)."""
    builder = _PortRows(source, tool, columns)
    for line in lines:
        builder.feed(line)
    for row in builder.rows:
        if finish:
            finish(row)
    return builder.rows
