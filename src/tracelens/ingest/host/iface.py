"""Interface listings into `interfaces`, `gids` and `ib_ports`: iproute2 `ip link` / `ip -d
link` / `ip -s link` / `ip addr`, net-tools `ifconfig` (2.x and 1.60 layouts), `show_gids`
and `rdma link show`.

grammars/iface.lark is the spec of the line kinds; each distinct line shape is parsed
once to learn its kind. A listing is short (a line per attribute of a few interfaces), so
its records are then assembled line by line: a header line opens an interface, the lines
under it add its address, MTU bounds (`ip -d`), kind (`veth`, `bond` ...) and counters.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Interface
from typing import Any

import polars as pl

from tracelens.ingest import IngestResult, InputFile, LineStart, input_format
from tracelens.ingest.fabric.ports import read_phys_state, read_state
from tracelens.ingest.host.hostlines import IGNORED, PARSED, ShapeGrammar, account, provenance
from tracelens.ingest.text.lines import read_lines
from tracelens.ingest.text.shell_context import context

GRAMMAR = ShapeGrammar("iface")

_SNIFF = LineStart(
    rb"\d+: [\w.@-]+: <[A-Z0-9_,-]*> mtu \d+|[\w.-]+: flags=\d+<[A-Z0-9_,-]*>\s+mtu \d+|[\w.-]+\s+Link encap:|"
    rb"DEV\s+PORT\s+INDEX\s+GID|link [\w-]+/\d+ state "
)
_IP_LINK = re.compile(
    r"^\s*(?P<index>\d+):\s+(?P<name>[^:\s]+?)(?:@(?:if(?P<peer>\d+)|[^:\s]+))?:\s+<(?P<flags>[^>]*)>(?P<rest>.*)$"
)
_IFC_HEAD = re.compile(r"^(?P<name>[^:\s]+):\s+flags=\d+<(?P<flags>[^>]*)>\s+mtu\s+(?P<mtu>\d+)")
_IFC_OLD = re.compile(r"^(?P<name>\S+)\s+Link encap:(?P<encap>.+?)(?:\s+HWaddr\s+(?P<mac>\S+))?\s*$")
_WORD_VALUE = re.compile(r"\b(mtu|master|state|minmtu|maxmtu)\s+(\S+)")
_IP_STATS = {"RX": ["rx_bytes", None, "rx_errors", "rx_dropped"], "TX": ["tx_bytes", None, "tx_errors", "tx_dropped"]}
_LINK_TYPES = {"Ethernet": "ether", "Local Loopback": "loopback", "UNSPEC": "infiniband", "InfiniBand": "infiniband"}
_MAC = r"(?P<mac>[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5,19}|[0-9a-fA-F]{2}(?:-[0-9a-fA-F]{2}){5,19})"


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head)


class _Listing:
    """Assembles interface records from the lines of a listing, in order."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.gids: list[dict[str, Any]] = []
        self.ports: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.stats_head: tuple[str, list[str]] | None = None
        self.gid_columns: list[str] = []

    def open(self, line: dict, **values: Any) -> None:
        self.current = {"line": line["line"], "stamp": line["stamp"], "prompt_host": line["prompt_host"], **values}
        self.rows.append(self.current)
        self.stats_head = None

    def feed(self, line: dict) -> bool:
        """Read one line of a known kind; False when its values could not be taken."""
        kind, text = line["kind"], line["text"]
        handler = getattr(self, f"_{kind}", None)
        return handler(line, text) is not False if handler else True

    # -- iproute2 ---------------------------------------------------------------------------
    def _ip_link(self, line: dict, text: str):
        m = _IP_LINK.match(text)
        if not m:
            return False
        attrs = dict(_WORD_VALUE.findall(m["rest"]))
        self.open(
            line,
            ifindex=int(m["index"]),
            ifname=m["name"],
            flags=m["flags"],
            mtu=_int(attrs.get("mtu")),
            master=attrs.get("master"),
            state=attrs.get("state"),
            source="ip",
            peer_ifindex=_int(m["peer"]),
        )

    def _ip_linkaddr(self, line: dict, text: str):
        if self.current is None:
            return False
        kind, _, rest = text.strip().partition(" ")
        self.current["link_type"] = kind.removeprefix("link/")
        if kind != "link/none" and (mac := rest.split(" ", 1)[0]):
            self.current["mac"] = mac
        self._mtu_bounds(self.current, rest)
        if netns := re.search(r"\blink-netns (\S+)", rest):
            self.current["link_netns"] = netns[1]

    @staticmethod
    def _mtu_bounds(current: dict[str, Any], text: str) -> None:
        attrs = dict(_WORD_VALUE.findall(text))
        if "minmtu" in attrs:
            current["min_mtu"], current["max_mtu"] = _int(attrs["minmtu"]), _int(attrs["maxmtu"])

    def _ip_detail(self, line: dict, text: str):
        if self.current is None:
            return False
        word = text.split()[0]
        if word != "promiscuity":
            self.current.setdefault("kind", word)
        self._mtu_bounds(self.current, text)

    def _ip_inet(self, line: dict, text: str):
        if self.current is None:
            return False
        parts = text.split()
        if parts[0] == "inet":
            address = _ipv4(parts[1])
            if address is None:
                return False
            self.current.setdefault("ipv4", address)

    def _ip_stats_head(self, line: dict, text: str):
        head = text.split(":", 1)
        self.stats_head = (head[0].strip(), head[1].split()) if "errors" not in head[0] else None

    def _ip_stats(self, line: dict, text: str):
        if self.current is None:
            return False
        if self.stats_head is None:
            return True  # the numbers under `RX errors:` (-s -s): detail the table does not keep
        direction, names = self.stats_head
        for name, value in zip(names, text.split()):
            column = {"bytes": "bytes", "errors": "errors", "dropped": "dropped"}.get(name)
            if column:
                self.current[f"{direction.lower()}_{column}"] = int(value)
        self.stats_head = None

    # -- ifconfig ---------------------------------------------------------------------------
    def _ifc_head(self, line: dict, text: str):
        m = _IFC_HEAD.match(text)
        if not m:
            return False
        flags = m["flags"].split(",")
        self.open(
            line, ifname=m["name"], flags=m["flags"], mtu=int(m["mtu"]), state=_ifconfig_state(flags), source="ifconfig"
        )

    def _ifc_head_old(self, line: dict, text: str):
        m = _IFC_OLD.match(text)
        if not m:
            return False
        self.open(
            line,
            ifname=m["name"],
            link_type=_LINK_TYPES.get(m["encap"].strip(), m["encap"].strip().lower()),
            mac=m["mac"],
            source="ifconfig",
        )

    def _ifc_flags_old(self, line: dict, text: str):
        if self.current is None:
            return False
        flags = text.split("MTU:")[0].split()
        mtu = re.search(r"MTU:(\d+)", text)  # the grammar's `"MTU:" INT`
        self.current.update(flags=",".join(flags), state=_ifconfig_state(flags), mtu=_int(mtu[1]) if mtu else None)

    def _ifc_inet(self, line: dict, text: str):
        if self.current is None:
            return False
        m = re.search(r"inet (?:addr:)?(?P<ip>[\d.]+)\s+(?:.*?(?:netmask |Mask:)(?P<mask>[\d.]+))?", text)
        if m:
            address = _ipv4(m["ip"] + (f"/{m['mask']}" if m["mask"] else ""))
            if address is None:
                return False
            self.current.setdefault("ipv4", address)

    def _ifc_ether(self, line: dict, text: str):
        if self.current is None:
            return False
        m = re.match(rf"\s*(?P<hw>\w+)\s+{_MAC}?.*?(?:\((?P<type>[^)]+)\))?\s*$", text)
        if m:
            self.current.update(link_type=_LINK_TYPES.get(m["type"] or "", m["hw"]), mac=m["mac"])

    def _ifc_counters(self, line: dict, text: str):
        if self.current is None:
            return False
        if m := re.search(r"RX bytes:(\d+).*TX bytes:(\d+)", text):  # the 1.60 layout puts both on one line
            self.current.update(rx_bytes=int(m[1]), tx_bytes=int(m[2]))
            return
        direction = text.strip()[:2].lower()
        for name, value in re.findall(r"\b(bytes|errors|dropped)[: ](\d+)", text):
            self.current[f"{direction}_{name}"] = int(value)

    # -- show_gids and rdma link ------------------------------------------------------------
    def _gids_row(self, line: dict, text: str):
        cells = text.split()
        version = next((c for c in cells if re.fullmatch(r"v[12]", c)), None)
        ipv4 = next((c for c in cells[4:] if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", c)), None)
        netdev = cells[-1].rstrip(".") if cells[-1] not in (version, ipv4) else None
        self.gids.append(
            {
                "line": line["line"],
                "stamp": line["stamp"],
                "prompt_host": line["prompt_host"],
                "ca": cells[0],
                "port": int(cells[1]),
                "index": int(cells[2]),
                "gid": cells[3],
                "ipv4": ipv4,
                "roce": version,
                "netdev": netdev,
                "source": "show_gids",
            }
        )

    def _rdma_link(self, line: dict, text: str):
        m = re.match(
            (
                r"\s*link (?P<ca>[\w-]+)/(?P<port>\d+) state (?P<state>\S+)"
                r"(?: physical_state (?P<phys>\S+))?(?: netdev (?P<nd>\S+))?"
            ),
            text,
        )
        if not m:
            return False
        self.ports.append(
            {
                "line": line["line"],
                "stamp": line["stamp"],
                "prompt_host": line["prompt_host"],
                "ca": m["ca"],
                "port": int(m["port"]),
                "state": read_state(m["state"]),
                "phys_state": read_phys_state(m["phys"] or ""),
                "netdev": m["nd"],
                "source": "rdma_link",
            }
        )


def _ifconfig_state(flags: list[str]) -> str:
    return "UP" if "RUNNING" in flags else "DOWN"


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _ipv4(text: str) -> str | None:
    """An IPv4 address as `10.0.0.1/24` (a netmask given as its prefix length) or bare `10.0.0.1`; None
    when it is none: an octet past 255, a prefix past 32 or not a number, a netmask with holes."""
    try:
        return str(IPv4Interface(text)) if "/" in text else str(IPv4Address(text))
    except ValueError:
        return None


@input_format("interfaces", priority=92, sniff=sniff)
def ingest(source: InputFile) -> IngestResult:
    lines = GRAMMAR.kinds(context(read_lines(source)))
    listing = _Listing()
    failed: set[int] = set()
    for line in lines.filter(pl.col("kind").is_not_null()).iter_rows(named=True):
        if not listing.feed(line):
            failed.add(line["line"])
    status = lines.select(
        pl.when(pl.col("ctx").is_not_null())
        .then(pl.col("ctx"))
        .when(pl.col("line").is_in(list(failed)))
        .then(pl.lit(None, pl.UInt8))
        .when(pl.col("kind").is_in(["gids_head", "gids_sep", "ifc_warning"]))
        .then(pl.lit(IGNORED, pl.UInt8))
        .when(pl.col("kind").is_not_null())
        .then(pl.lit(PARSED, pl.UInt8))
    ).to_series()
    result = IngestResult(account=account(lines, status))
    for table, rows in (("interfaces", listing.rows), ("gids", listing.gids), ("ib_ports", listing.ports)):
        if rows:
            frame = provenance(source, pl.DataFrame(rows, infer_schema_length=None))
            result.add(table, frame.drop("stamp", "prompt_host", "zoned"))
    return result
