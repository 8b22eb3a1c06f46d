"""`ibv_devinfo` and `ibv_devinfo -v` dumps into ib_ports.

The line grammar is grammars/ibv_devinfo.lark. With `-v` the port's rate is its
active width times its lane speed (`4X (2)` × `25.0 Gbps (32)` = 100 Gb/s). The -v
device section's capability flags (one per line under `device_cap_flags`) are read
and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracelens.ingest import Batch, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import DumpLine, LineGrammar, read_batch
from tracelens.ingest.fabric.ports import (
    Columns,
    Device,
    Port,
    PortLines,
    first_number,
    port_rows,
    read_float,
    read_int,
    read_phys_state,
    read_state,
    read_text,
    read_width,
)

_SNIFF = LineStart(rb"\s*(?:hca_id:\s+\S+\r?\n\s+transport:|(?:max|active)_mtu:\s+\d+ \(\d\))")

COLUMNS: Columns = {
    "vendor_part_id": {"ca_type": read_text},
    "node_guid": {"node_guid": read_text},
    "state": {"state": read_state},
    "phys_state": {"phys_state": read_phys_state},
    "max_mtu": {"max_mtu": read_int},
    "active_mtu": {"active_mtu": read_int},
    "port_lid": {"lid": read_int},
    "link_layer": {"link_layer": read_text},
    "active_width": {"width": read_width},
    "active_speed": {"lane_gbps": read_float},
}


class _DevinfoValues(PortLines):
    def device(self, items):
        return Device(str(items[1]).strip())

    def gid(self, items):
        index = first_number(items[0])
        value, _, roce = str(items[1]).partition(",")
        return Gid(index, value.strip(), roce.strip().removeprefix("RoCE ") or None)

    def word(self, items):
        return "word"


@dataclass(frozen=True)
class Gid:
    """A `GID[  3]:  ::ffff:10.0.0.1, RoCE v2` line of `ibv_devinfo -v`."""

    index: int
    gid: str
    roce: str | None  # v1 / v2; None on InfiniBand


LINES = LineGrammar("ibv_devinfo", _DevinfoValues)


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


def _rate(row: dict) -> None:
    lanes = int(row["width"][:-1]) if row.get("width") else None
    lane_gbps = row.pop("lane_gbps", None)
    row["rate_gbps"] = lanes * lane_gbps if lanes and lane_gbps else None


def _gids(source: InputFile, lines: list[DumpLine]) -> list[dict]:
    """The GID table of each port (`-v`), under the device and port lines above it."""
    rows, ca, port = [], None, None
    for line in lines:
        if isinstance(line.value, Device):
            ca, port = line.value.name, None
        elif isinstance(line.value, Port):
            port = line.value.number
        elif isinstance(line.value, Gid):
            ipv4 = line.value.gid.removeprefix("::ffff:") if line.value.gid.startswith("::ffff:") else None
            rows.append(
                {
                    **{k: v for k, v in line.provenance(source).items() if k != "dump_ts"},
                    "ca": ca,
                    "port": port,
                    "index": line.value.index,
                    "gid": line.value.gid,
                    "ipv4": ipv4,
                    "roce": line.value.roce,
                    "source": "ibv_devinfo",
                }
            )
    return rows


def _rows(source: InputFile, lines: list[DumpLine]) -> dict[str, list[dict]]:
    return {"ib_ports": port_rows(source, lines, "ibv_devinfo", COLUMNS, finish=_rate), "gids": _gids(source, lines)}


@input_format("ibv_devinfo", priority=100, sniff=sniff, batches=True)
def ingest(sources: list[InputFile]) -> Batch:
    return read_batch(sources, LINES, _rows)
