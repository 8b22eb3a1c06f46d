"""Text logs: one pass over the lines, shared by every line parser.

A launcher's stdout mixes DeepSpeed lines, NCCL lines and application output,
so a log is not one format: each parser in LINE_PARSERS looks at every chunk,
claims the lines it knows, and the file's account takes the strongest claim
per line. Lines nobody claims are counted as ignored (application output).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import polars as pl

from tracelens.ingest import Account, IngestResult, InputFile
from tracelens.ingest import deepspeed, nccl, nccl_tests, stacks
from tracelens.ingest.lines import IGNORED, NOT_MINE, PARSED, UNRECOGNIZED, read_chunks

FORMAT = "log"
PRIORITY = 1000  # the catch-all: any text nobody else claimed


class LineParser(Protocol):
    """One per file: `feed` each chunk in order, then `finish`."""

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        """Parse a chunk (columns line, text); return a UInt8 status per line (lines.py codes)."""

    def finish(self, result: IngestResult) -> None:
        """Add the parsed tables to `result`."""


LINE_PARSERS = [nccl.NcclParser, deepspeed.DeepSpeedParser, stacks.StackParser, nccl_tests.NcclTestsParser]


def sniff(head: bytes) -> bool:
    return b"\x00" not in head[:4096]


def ingest(source: InputFile) -> IngestResult:
    parsers = [cls(source) for cls in LINE_PARSERS]
    account = Account()
    # The parsers read each chunk side by side while the next chunk is read: the work is mostly
    # polars, which releases the GIL, so two cores do it in two thirds of the time (300 MB
    # benchmark log: 3.3 s -> 2.2-2.6 s). Each parser still sees the chunks in order, one at a time.
    with ThreadPoolExecutor(max_workers=len(parsers) + 1) as pool:
        chunks = read_chunks(source.path)
        upcoming = pool.submit(next, chunks, None)
        while (chunk := upcoming.result()) is not None:
            upcoming = pool.submit(next, chunks, None)  # read the next chunk while this one is parsed
            _account(account, chunk, [f.result() for f in [pool.submit(p.feed, chunk) for p in parsers]])
    result = IngestResult(account=account)
    for parser in parsers:
        parser.finish(result)
    return result


def _account(account: Account, chunk: pl.DataFrame, claims_per_parser: list[pl.Series]) -> None:
    """Count each line of the chunk under its strongest claim; keep samples of the unrecognised."""
    claims = pl.DataFrame([claim.alias(str(i)) for i, claim in enumerate(claims_per_parser)])
    status = claims.select(pl.max_horizontal(pl.all()).fill_null(NOT_MINE)).to_series()
    counts = status.value_counts()
    by_code = dict(zip(counts[counts.columns[0]].to_list(), counts["count"].to_list()))
    account.lines += chunk.height
    account.parsed += by_code.get(PARSED, 0)
    account.unrecognized += by_code.get(UNRECOGNIZED, 0)
    account.ignored += by_code.get(IGNORED, 0) + by_code.get(NOT_MINE, 0)
    if by_code.get(UNRECOGNIZED) and len(account.samples) < 20:
        bad = chunk.filter(status == UNRECOGNIZED).head(20)
        account.add_samples(list(zip(bad["line"].to_list(), bad["text"].to_list())))
