"""`ibv_devinfo` and `ibv_devinfo -v` dumps into ib_ports.

The line grammar is grammars/ibv_devinfo.lark. With `-v` the port's rate is its
active width times its lane speed (`4X (2)` × `25.0 Gbps (32)` = 100 Gb/s). The -v
device section's capability flags (one per line under `device_cap_flags`) are read
and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracelens.ingest import IngestResult, InputFile, LineStart, input_format
from tracelens.ingest.fabric.dumps import LineGrammar, read_dump
from tracelens.ingest.fabric.ports import (
    Columns,
    Device,
    Port,
    PortLines,
    first_number,
    ingest_port_dump,
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


def _gids(source: InputFile) -> pl.DataFrame:
    """The GID table of each port (`-v`), under the device and port lines above it. The dump is
    read a second time: it is short and its lines' parses are cached."""
    lines, _ = read_dump(source, LINES)
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
                    **line.provenance(source),
                    "ca": ca,
                    "port": port,
                    "index": line.value.index,
                    "gid": line.value.gid,
                    "ipv4": ipv4,
                    "roce": line.value.roce,
                    "source": "ibv_devinfo",
                }
            )
    return pl.DataFrame(rows, infer_schema_length=None).drop("dump_ts") if rows else pl.DataFrame()


@input_format("ibv_devinfo", priority=100, sniff=sniff)
def ingest(source: InputFile) -> IngestResult:
    result = ingest_port_dump(source, LINES, "ibv_devinfo", COLUMNS, finish=_rate)
    result.add("gids", _gids(source))
    return result
