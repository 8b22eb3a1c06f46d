"""Packet captures (pcap and pcapng) into the `packets` table.

The file is memory-mapped and decoded a chunk of records at a time
(tracelens.capture_decoder.records walks the records, in a process of its own for a big
capture, tracelens.capture_decoder.walker; tracelens.capture_decoder.decode reads their headers
vectorized, two chunks at once in threads), so a capture larger than memory is
read in bounded memory on every core. In a run (the source has a spill folder,
the run's private working folder) the rows go there as Parquet as they are
decoded, one file per bucket of host pairs, and the table is a lazy scan of
them: memory follows a chunk, not the capture, and the per-connection analysis
(tracelens.derived.flows) reads one bucket's file at a time (a big one a piece
at a time). Account: lines = frames read, parsed = frames with an IP, RoCE or
InfiniBand header, ignored = other link-layer protocols (ARP, LLDP ...),
unrecognized = frames on an unknown link type or with a cut or malformed
network header.
"""

from __future__ import annotations

import ctypes
import mmap
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracelens.capture_decoder import decode as dec
from tracelens.capture_decoder import records, walker
from tracelens.capture_decoder.columns import Column
from tracelens.capture_decoder.records import CaptureError, CaptureReader, Records, is_capture
from tracelens.ingest import SAMPLE_LIMIT, Account, IngestResult, InputFile, input_format
from tracelens.tables import SCHEMAS, conform

BUCKET_PACKETS = 250_000  # packets of a bucket, about: the per-connection analysis reads a bucket at a time
MAX_BUCKETS = 256  # one open file each while the capture is read; beyond 64M packets, buckets grow instead
SPILL_ROWS = 1 << 20  # rows held before each bucket's are written as a row group (a row group has a fixed cost)
DECODERS = 2  # chunks decoded at once, beside the record walk
WALK_APART_RECORDS = 1 << 20  # captures of about this many records are walked by a process of their own

LINKTYPE_NAMES = {
    dec.ETHERNET: "Ethernet",
    dec.SLL: "Linux cooked v1",
    dec.SLL2: "Linux cooked v2",
    dec.IPOIB: "IPoIB",
    dec.ERF: "ERF",
    dec.INFINIBAND: "InfiniBand",
    **{lt: "raw IP" for lt in dec.RAW_IP},
}


def sniff(head: bytes) -> bool:
    return is_capture(head)


@input_format("pcap", priority=10, sniff=sniff, reads_lines=False)
def ingest(source: InputFile) -> IngestResult:
    result = IngestResult()
    account = result.account
    if source.path.stat().st_size == 0:
        account.errors.append(f"{source.name}: empty file, not a capture")
        return result
    mapped = records.mapped(source.path)
    try:
        reader = CaptureReader(np.frombuffer(mapped, np.uint8), source.path)
    except CaptureError as exc:
        account.errors.append(f"{source.name}: {exc}")
        return result
    # the walk of a capture of many records runs in a process of its own (tracelens.capture_decoder.walker): beside
    # the decoding threads, in this one, it would hold them up; for fewer, that process's start costs more
    # than it saves, and its pages would be mapped twice
    apart = reader.estimated_records() >= WALK_APART_RECORDS
    walks = walker.walked(source.path) if apart else nullcontext(reader.walk())
    frames: list[pa.Table] = []
    spill: _BucketFiles | None = None
    buckets = 1
    # Up to DECODERS chunks are decoded at once in threads (numpy and arrow let go of the interpreter in
    # their loops), while this thread reads the next chunk's walk and hands the chunks decoded to the
    # spill, which writes its files on the same threads: every core busy.
    with walks as walked, ThreadPoolExecutor(DECODERS) as pool:
        decoding: deque[tuple[Records, Future]] = deque()

        def finish() -> None:
            rec, done = decoding.popleft()
            table, bounds, status = done.result()
            if spill is not None:
                spill.add(table, bounds)
            else:
                frames.append(table)
            _count(account, rec, status)
            # the pages decoded so far leave this process's memory (the page cache keeps them): a
            # mapped capture of several GB would otherwise count whole in its resident size
            mapped.madvise(mmap.MADV_DONTNEED, 0, int(rec.offset[0]) // mmap.PAGESIZE * mmap.PAGESIZE)

        padding = 0
        for chunk in walked:
            reader.notes.extend(chunk.notes)
            padding = chunk.padding
            if not len(chunk.starts):
                continue
            rec = reader.records(chunk)
            if chunk.before == 0:  # the first chunk: how many buckets the rows go in
                buckets = _buckets(rec, len(reader.data))
                spill = _BucketFiles(source.spill, buckets, pool) if source.spill is not None else None
            decoding.append((rec, pool.submit(_decode, reader, rec, buckets, source.name, spill is not None)))
            while len(decoding) > DECODERS or (decoding and decoding[0][1].done()):
                finish()
        while decoding:
            finish()
        scan = spill.close() if spill is not None else None
    account.errors.extend(f"{source.name}: {note}" for note in reader.notes)
    if padding:
        after = f"after its {account.lines:,} packets" if account.lines else "after its headers, before any packet"
        account.notes.append(
            f"ends in {padding:,} zero bytes {after} (padding, or space allocated and never written), not a "
            "record cut short"
        )
    elif not account.lines and not reader.notes:
        account.notes.append("a capture of no packets: its headers and nothing after them")
    for linktype in sorted(reader.linktypes - set(LINKTYPE_NAMES)):
        account.errors.append(
            f"{source.name}: link type {linktype} is not one tracelens decodes; its packets were skipped"
        )
    if scan is not None:
        result.add("packets", scan)
    elif frames:
        result.add("packets", conform("packets", pl.from_arrow(pa.concat_tables(frames))))
    _give_back_freed_memory()
    return result


def _decode(
    reader: CaptureReader, rec: Records, buckets: int, name: str, by_bucket: bool
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """A chunk's rows in the packets table's columns and types, where each bucket's rows start (and the
    last end), and each frame's status (decode.decode). `by_bucket`: the rows sorted by bucket
    (stable: each bucket's in frame order), for _BucketFiles; else in frame order."""
    decoded, status = dec.decode(reader.view, rec, buckets)
    n = len(rec)
    decoded |= {
        "file": Column(np.zeros(n, np.uint32), texts=[name]),
        "ts": Column(rec.ts_ns, rec.ts_valid),
        "ts_quality": Column(rec.ts_valid.astype(np.uint32), texts=["none", "exact"]),
    }
    bounds = np.array([0, n])
    if by_bucket:
        order = np.argsort(decoded["bucket"].values.astype(np.uint8), kind="stable")  # radix sort: MAX_BUCKETS is 256
        decoded = {column: values.take(order) for column, values in decoded.items()}
        bounds = np.searchsorted(decoded["bucket"].values, np.arange(buckets + 1))
    columns = [
        decoded[column.name].to_arrow(column.type)
        if column.name in decoded
        else pa.nulls(n, column.type)  # the host, or a layer no frame of the chunk has (no TCP ...)
        for column in SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA), bounds, status


def _buckets(first: Records, size: int) -> int:
    """How many buckets of host pairs the capture's rows go in: about BUCKET_PACKETS frames each, the
    number of frames guessed from the file's size and the first chunk's bytes per record."""
    per_record = (int(first.offset[-1] + first.caplen[-1]) - int(first.offset[0])) / len(first) + 16
    return int(min(MAX_BUCKETS, max(1, -(-size // int(per_record * BUCKET_PACKETS)))))


TEXT_COLUMNS = ["file", "host", "ts_quality", "src", "dst", "proto"]
# Text that repeats (file, host, addresses, protocol) as polars exports a categorical column: read back, it
# is a categorical again without re-coding each row (a third of the cost of reading the rows back).
_CATEGORICAL = pl.DataFrame(schema={"text": pl.Categorical}).to_arrow().schema.field("text")
TEXT = _CATEGORICAL.type
SCHEMA = pa.schema([_CATEGORICAL.with_name(f.name) if f.name in TEXT_COLUMNS else f for f in SCHEMAS["packets"]])


class _BucketFiles:
    """The capture's rows as Parquet in the run's private working folder (a folder of its own there,
    0700, removed with the run): one file per bucket, so that reading a bucket reads one file (its
    `bucket` column is one value: a filter on it skips the others unread). Rows wait until about
    SPILL_ROWS of them are held, then each bucket's go out as one row group, its file written on
    one of `pool`'s threads: a row group costs about a millisecond whatever its size, so a bucket's
    share of each chunk (a few thousand rows) alone would cost more than its rows."""

    def __init__(self, root: Path, buckets: int, pool: ThreadPoolExecutor) -> None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(dir=root, prefix="packets-"))
        self.buckets, self.pool = buckets, pool
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.held: list[list[pa.Table]] = [[] for _ in range(buckets)]
        self.rows = 0
        self.writing: list[Future] = []

    def add(self, rows: pa.Table, bounds: np.ndarray) -> None:
        """A chunk's rows sorted by bucket, each bucket's in frame order (bucket b's from bounds[b] up to
        bounds[b + 1])."""
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            self.held[b].append(rows.slice(int(bounds[b]), int(bounds[b + 1] - bounds[b])))
        self.rows += len(rows)
        if self.rows >= SPILL_ROWS:
            self._flush()

    def _flush(self) -> None:
        for done in self.writing:  # a bucket's row groups in order: the previous ones are written
            done.result()
        self.writing = [
            self.pool.submit(self._write, b, pa.concat_tables(parts)) for b, parts in enumerate(self.held) if parts
        ]
        self.held = [[] for _ in range(self.buckets)]
        self.rows = 0

    def _write(self, bucket: int, table: pa.Table) -> None:
        if bucket not in self.writers:
            self.writers[bucket] = pq.ParquetWriter(
                self.folder / f"bucket-{bucket:04d}.parquet",
                SCHEMA,
                compression="lz4",
                use_dictionary=TEXT_COLUMNS,  # the text repeats (addresses, file); numbers are written plain
                write_statistics=["bucket"],  # what a filter on the bucket skips files by
            )
        self.writers[bucket].write_table(table, row_group_size=len(table))

    def close(self) -> pl.LazyFrame | None:
        """A lazy scan of every bucket's file; None when no frame was read."""
        self._flush()
        for done in self.writing:
            done.result()
        for writer in self.writers.values():
            writer.close()
        paths = [self.folder / f"bucket-{bucket:04d}.parquet" for bucket in sorted(self.writers)]
        return pl.scan_parquet(paths) if paths else None


def _give_back_freed_memory() -> None:
    """Return the decode's freed heap to the system (glibc keeps it otherwise, in proportion to the
    packets read, for the rest of the run)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def _count(account: Account, rec: Records, status: np.ndarray) -> None:
    account.lines += len(rec)
    account.parsed += int((status == dec.PARSED).sum())
    account.ignored += int((status == dec.IGNORED).sum())
    bad = np.flatnonzero(status == dec.UNDECODABLE)
    account.unrecognized += len(bad)
    on_known_link = bad[np.isin(rec.linktype[bad], list(LINKTYPE_NAMES))]  # unknown links get one error line
    account.add_samples([(int(rec.frame[i]), _undecodable(rec, i)) for i in on_known_link[:SAMPLE_LIMIT]])


def _undecodable(rec: Records, i: int) -> str:
    link = LINKTYPE_NAMES[int(rec.linktype[i])]
    return f"{link} frame of {int(rec.caplen[i])} captured bytes: network header cut off or malformed"
