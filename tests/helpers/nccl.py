"""NCCL log text through NcclParser: the status of each line and the tables it makes."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracelens.ingest import IngestResult, InputFile
from tracelens.ingest.nccl.log import NcclParser
from tracelens.ingest.text.lines import read_chunks


def ingest(path: Path) -> tuple[list[int], dict[str, pl.DataFrame]]:
    """Status per line and the tables NcclParser makes of one file."""
    parser = NcclParser(InputFile(path=path, name=path.name, format="log"))
    status = []
    for chunk in read_chunks(path):
        status += parser.feed(chunk).to_list()
    result = IngestResult()
    parser.finish(result)
    return status, result.tables


def ingest_text(tmp_path: Path, *lines: str) -> tuple[list[int], dict[str, pl.DataFrame]]:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ingest(path)
