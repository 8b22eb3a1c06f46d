"""Fabric dumps for tests: a file read by the module that claims it, and two generated nodes
dumped before and after."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath

import polars as pl

from synth.fabric import FabricPort, port_dumps
from synth.fabric import ibstat as ibstat_text
from tracelens.discover import host_from_path
from tracelens.ingest import InputFile
from tracelens.ingest.fabric import ethtool, hw_counters, ibstat, ibstatus, ibv_devinfo, perfquery
from tracelens.tables import RunTables

FABRIC = [perfquery, ibstat, ibstatus, ibv_devinfo, ethtool, hw_counters]


def sniffed(path: Path):
    """The fabric module whose sniffer claims the file (exactly one must)."""
    head = path.read_bytes()[: 64 << 10]
    claims = [m for m in FABRIC if m.sniff(head)]
    assert len(claims) <= 1, f"{path.name} claimed by {[m.FORMAT for m in claims]}"
    return claims[0] if claims else None


def read(path: Path, module=None, name: str | None = None):
    module = module or sniffed(path)
    return module.ingest(InputFile(path=path, name=name or path.name, format=module.FORMAT))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


T0 = datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)


def ingest_folder(folder: Path) -> RunTables:
    """The fabric files of a folder as the pipeline reads them (host from the node folder)."""
    tables = RunTables()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        head = path.read_bytes()[: 64 << 10]
        module = next(m for m in FABRIC if m.sniff(head))
        rel = PurePosixPath(path.relative_to(folder).as_posix())
        result = module.ingest(InputFile(path=path, name=str(rel), format=module.FORMAT))
        for name, frame in result.tables.items():
            tables.add(name, frame.with_columns(pl.col("host").fill_null(host_from_path(rel))))
    return tables


def two_nodes(
    tmp_path: Path,
    faults: dict[tuple[str, str], dict[str, float]],
    extended: bool = True,
    base: dict[tuple[str, str], dict[str, int]] | None = None,
) -> Path:
    """node01 and node02, two HCAs each, dumped before and 30 minutes after (one hour after a clear)."""
    for n, host in enumerate(["node01", "node02"]):
        ports = [
            FabricPort(
                ca, lid=10 * (n + 1) + i, per_second=faults.get((host, ca), {}), base=(base or {}).get((host, ca), {})
            )
            for i, ca in enumerate(["mlx5_0", "mlx5_1"])
        ]
        folder = tmp_path / host
        folder.mkdir()
        (folder / "perfquery-before.txt").write_text(port_dumps(host, ports, T0, 3600, extended))
        (folder / "perfquery-after.txt").write_text(port_dumps(host, ports, T0 + timedelta(minutes=30), 5400, extended))
        (folder / "ibstat.txt").write_text(ibstat_text(ports))
    return tmp_path
