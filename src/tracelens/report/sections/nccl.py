"""NCCL facts per host: versions, ranks, networks, HCAs, transports per channel, settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracelens.derived import RunContext
from tracelens.derived.nccl import NcclHost

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 30
TITLE = "NCCL per host"
TEMPLATE = "sections/nccl.html.j2"


_INTERFACE_ROLES = {"bootstrap_if": "bootstrap", "oob_if": "IB out-of-band", "socket_if": "socket transport"}


def _gdr_label(value: bool | None) -> str:
    return "" if value is None else "yes" if value else "no"


def _host(h: NcclHost) -> dict:
    return {
        "host": h.host or "(host not named)",
        "versions": [{"version": v.version, "build": v.build} for v in h.versions],
        "ranks": list(h.ranks),
        "processes": h.processes,
        "networks": h.named("network"),
        "hcas": [
            f"{r.name}" + (f":{r.port}" if r.port is not None else "") + (f"/{r.link_layer}" if r.link_layer else "")
            for r in h.net
            if r.what == "ib_device"
        ],
        "interfaces": [
            f"{_INTERFACE_ROLES[r.what]} {r.name}" + (f" ({r.address})" if r.address else "")
            for r in h.net
            if r.what in _INTERFACE_ROLES
        ],
        "errors": h.errors,
        "transports": [
            {"transport": t.transport, "net": t.net, "gdr": _gdr_label(t.gdr), "n": t.connections} for t in h.transports
        ],
        "settings": [{"name": name, "value": value} for name, value in h.settings],
    }


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """NCCL facts per host (the hosts named, or the unnamed lines when no host is); None when no NCCL
    line was read."""
    hosts = ctx.nccl_hosts
    named = [h for h in hosts if h.host is not None]
    return {"hosts": [_host(h) for h in named or hosts]} if hosts else None
