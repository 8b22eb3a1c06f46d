"""Fabric dumps for tests: a file read by the format that claims it, and two generated nodes
dumped before and after."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath

import polars as pl

from synth.fabric import FabricPort, port_dumps
from synth.fabric import ibstat as ibstat_text
from tracelens.discover import host_from_path
from tracelens.ingest import Format, InputFile, find_format
from tracelens.tables import RunTables

FABRIC = [find_format(name) for name in ("perfquery", "ibstat", "ibstatus", "ibv_devinfo", "ethtool", "hw_counters")]


def sniffed(path: Path) -> Format | None:
    """The fabric format whose sniffer claims the file (exactly one must)."""
    head = path.read_bytes()[: 64 << 10]
    claims = [f for f in FABRIC if f and f.sniff(head)]
    assert len(claims) <= 1, f"{path.name} claimed by {[f.name for f in claims]}"
    return claims[0] if claims else None


def read(path: Path, fmt: str | None = None, name: str | None = None):
    """The file read as format `fmt`, or as the fabric format that claims it."""
    found = find_format(fmt) if fmt else sniffed(path)
    assert found is not None, path.name
    return found.read(InputFile(path=path, name=name or path.name, format=found.name))


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
        fmt = next(f for f in FABRIC if f and f.sniff(head))
        rel = PurePosixPath(path.relative_to(folder).as_posix())
        result = fmt.read(InputFile(path=path, name=str(rel), format=fmt.name))
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
