"""Text logs: one pass over the lines, shared by every line parser.

A launcher's stdout mixes DeepSpeed lines, NCCL lines and application output,
so a log is not one format: the parser of every line format (ingest.line_formats)
looks at every chunk, claims the lines it knows, and the file's account takes
the strongest claim per line. Lines nobody claims are unrecognised (application output, or a form
no parser knows yet), blank ones known but irrelevant.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import polars as pl

from tracelens.ingest import (
    SAMPLE_LIMIT,
    Account,
    IngestResult,
    InputFile,
    LineParser,
    input_format,
    line_formats,
    looks_like_text,
)
from tracelens.ingest.nccl.log import ChunkRecords, NcclParser
from tracelens.ingest.text.lines import (
    CHUNK_BYTES,
    IGNORED,
    PARSED,
    UNRECOGNIZED,
    chunk_spans,
    read_chunks,
    read_span,
    settled,
    strongest_claim,
)
from tracelens.tables import Spill


def sniff(head: bytes) -> bool:
    return looks_like_text(head)


# the catch-all: any text nobody else claimed
@input_format("log", priority=1000, sniff=sniff, splits=True)
def ingest(
    source: InputFile, jobs: int = 1, chunk_bytes: int = CHUNK_BYTES, workers: Executor | None = None
) -> IngestResult:
    """Read the file's lines once for every line parser; past two chunks, with `jobs` > 1, the NCCL
    records of `jobs` chunks are parsed at once, in threads (or on `workers`: Ray tasks)."""
    parsers = [fmt.open(source, _spill(source, chunk_bytes) if fmt.spills else None) for fmt in line_formats()]
    account, samples = Account(), Samples()
    if jobs > 1 and source.size > 2 * chunk_bytes:
        if workers is not None:
            _read_split(source, parsers, account, samples, jobs, chunk_bytes, workers)
        else:
            # Threads, not processes: the parse is polars work that releases the GIL, and threads
            # pay no start-up or pickling of the chunks' tables.
            with ThreadPoolExecutor(jobs) as pool:
                _read_split(source, parsers, account, samples, jobs, chunk_bytes, pool, shared=True)
    else:
        _read_in_threads(source, parsers, account, samples, chunk_bytes)
    account.add_samples(samples.near + samples.rest)
    result = IngestResult(account=account)
    for parser in parsers:
        parser.finish(result)
    return result


def _spill(source: InputFile, chunk_bytes: int) -> Spill | None:
    """Where a parser writes a file's rows as it reads it: only a file of more than one chunk, in the
    run's private folder. A smaller file's rows stay in memory (its tables are no bigger than a chunk)."""
    return Spill(source.spill) if source.spill is not None and source.size > chunk_bytes else None


def _read_in_threads(
    source: InputFile, parsers: list[LineParser], account: Account, samples: Samples, chunk_bytes: int
) -> None:
    # The parsers read each chunk side by side while the next chunk is read: the work is mostly
    # polars, which releases the GIL, so a second core takes a share of it. Each parser still sees
    # the chunks in order, one at a time.
    with ThreadPoolExecutor(max_workers=len(parsers) + 1) as pool:
        chunks = read_chunks(source.path, chunk_bytes)
        upcoming = pool.submit(next, chunks, None)
        while (chunk := upcoming.result()) is not None:
            upcoming = pool.submit(next, chunks, None)  # read the next chunk while this one is parsed
            _account(account, samples, chunk, [f.result() for f in [pool.submit(p.feed, chunk) for p in parsers]])


def _read_split(
    source: InputFile,
    parsers: list[LineParser],
    account: Account,
    samples: Samples,
    jobs: int,
    chunk_bytes: int,
    workers: Executor,
    shared: bool = False,
) -> None:
    """Both cores on one big file: workers parse the chunks' NCCL records (the costly part)
    ahead of time and side by side; the other parsers get each chunk in order (DeepSpeed's blocks
    run across chunks) and the workers' results are taken in order. Workers in this process
    (`shared`) hand back the chunk they read; a chunk parsed elsewhere (a Ray task) is read here
    again. At most jobs + 1 chunks are in flight, so memory stays bounded."""
    nccl_parser = next(p for p in parsers if isinstance(p, NcclParser))
    others = [p for p in parsers if p is not nccl_parser]
    spans = chunk_spans(source.path, chunk_bytes)
    reading = uuid.uuid4().hex  # this reading of the file, for the workers' caches
    with ThreadPoolExecutor(max(len(others), 1)) as threads:
        ahead: deque = deque()

        def submit() -> None:
            if (span := next(spans, None)) is not None:
                ahead.append((span, workers.submit(_parse_nccl, source, span, reading, shared)))

        for _ in range(jobs + 1):
            submit()
        while ahead:
            span, parsing = ahead.popleft()
            submit()
            read, parsed = parsing.result()
            chunk = read if read is not None else read_span(source.path, *span)
            claims = [threads.submit(p.feed, chunk) for p in others]
            _account(account, samples, chunk, [nccl_parser.absorb(parsed), *(c.result() for c in claims)])


# In a worker (thread or Ray task's process): the parser of the reading it is on. Its caches serve
# every chunk of that reading the worker gets; another reading gets a new parser, so that what
# `parse` reports as new is new for the reading (Ray reuses workers across runs).
_WORKER = threading.local()


def _parse_nccl(
    source: InputFile, span: tuple[int, int, int], reading: str, shared: bool
) -> tuple[pl.DataFrame | None, ChunkRecords]:
    """The chunk's NCCL records, and the chunk itself when `shared` (the caller is in this process)."""
    if getattr(_WORKER, "reading", None) != reading:
        _WORKER.reading, _WORKER.parser = reading, NcclParser(source)
    chunk = read_span(source.path, *span)
    return chunk if shared else None, _WORKER.parser.parse(chunk)


@dataclass
class Samples:
    """A file's unrecognised lines to show, gathered chunk by chunk: those a parser came close to (a
    known kind that did not parse) and the others, each in line order; shown near misses first over
    the whole file (one in the last chunk before the others of the first), as a batch shows them."""

    near: list[tuple[int, str]] = field(default_factory=list)
    rest: list[tuple[int, str]] = field(default_factory=list)


def _account(account: Account, samples: Samples, chunk: pl.DataFrame, claims_per_parser: list[pl.Series]) -> None:
    """Count each line of the chunk under its strongest claim (settled: see lines.settled); keep samples
    of the unrecognised."""
    claimed = strongest_claim(claims_per_parser)
    status = chunk.select(settled(pl.lit(claimed), pl.col("text"))).to_series()
    counts = status.value_counts()
    by_code = dict(zip(counts[counts.columns[0]].to_list(), counts["count"].to_list()))
    account.lines += chunk.height
    account.parsed += by_code.get(PARSED, 0)
    account.unrecognized += by_code.get(UNRECOGNIZED, 0)
    account.ignored += by_code.get(IGNORED, 0)
    if not by_code.get(UNRECOGNIZED):
        return
    near = claimed == UNRECOGNIZED
    for kept, which in ((samples.near, near), (samples.rest, (status == UNRECOGNIZED) & ~near)):
        if len(kept) < SAMPLE_LIMIT:
            bad = chunk.filter(which).head(SAMPLE_LIMIT - len(kept))
            kept.extend(zip(bad["line"].to_list(), bad["text"].to_list()))
