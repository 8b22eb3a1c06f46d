"""tshark as the reference for TCP analysis: per-flow counts of its expert flags."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
FLOW = ["src", "sport", "dst", "dport"]


def run(path: Path, *args: str) -> list[list[str]]:
    """tshark's tab-separated output lines for `path`, split."""
    out = subprocess.run([TSHARK, "-r", str(path), *args], capture_output=True, text=True, check=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def per_flow(path: Path, display_filter: str) -> pl.DataFrame:
    """src, sport, dst, dport, len: how many IPv4 TCP frames of each direction match `display_filter`."""
    rows = run(
        path,
        "-Y",
        display_filter,
        "-T",
        "fields",
        "-e",
        "ip.src",
        "-e",
        "tcp.srcport",
        "-e",
        "ip.dst",
        "-e",
        "tcp.dstport",
    )
    schema = {"src": pl.String, "sport": pl.Int32, "dst": pl.String, "dport": pl.Int32}
    return (
        pl.DataFrame([(a, int(b), c, int(d)) for a, b, c, d in rows], orient="row", schema=schema).group_by(FLOW).len()
    )
