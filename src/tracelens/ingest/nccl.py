"""NCCL_DEBUG / ProcessGroupNCCL lines (placeholder until the NCCL grammar lands)."""

from __future__ import annotations

import polars as pl

from tracelens.ingest import IngestResult, InputFile
from tracelens.ingest.lines import NOT_MINE


class NcclParser:
    def __init__(self, source: InputFile) -> None:
        self.source = source

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        return pl.repeat(NOT_MINE, chunk.height, dtype=pl.UInt8, eager=True)

    def finish(self, result: IngestResult) -> None:
        return None
