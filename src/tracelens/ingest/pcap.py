"""Packet captures (pcap and pcapng) into the `packets` table.

The file is memory-mapped and decoded a chunk of records at a time
(tracelens.packets.records walks the records, tracelens.packets.decode reads
their headers vectorized), so a capture larger than memory is read in bounded
memory. In a run (the source has a spill folder, the run's private working
folder) the rows go there as Parquet as they are decoded, one file per bucket of
host pairs, and the table is a lazy scan of them: memory follows a chunk, not the
capture, and the per-connection analysis (tracelens.derived.flows) reads one
bucket's file at a time. Account: lines = frames read, parsed = frames with an IP, RoCE or
InfiniBand header, ignored = other link-layer protocols (ARP, LLDP ...),
unrecognized = frames on an unknown link type or with a cut or malformed
network header.
"""

from __future__ import annotations

import ctypes
import mmap
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracelens.ingest import SAMPLE_LIMIT, Account, IngestResult, InputFile
from tracelens.packets import decode as dec
from tracelens.packets.records import CaptureError, CaptureReader, Records, is_capture
from tracelens.tables import TS, conform

FORMAT = "pcap"
PRIORITY = 10

BUCKET_PACKETS = 250_000  # packets of a bucket the per-connection analysis holds at once (~700 bytes each at its peak)
MAX_BUCKETS = 256  # one open file each while the capture is read; beyond 64M packets, buckets grow instead

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


def ingest(source: InputFile) -> IngestResult:
    result = IngestResult()
    account = result.account
    if source.path.stat().st_size == 0:
        account.errors.append(f"{source.name}: empty file, not a capture")
        return result
    with source.path.open("rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        reader = CaptureReader(np.frombuffer(mapped, np.uint8))
    except CaptureError as exc:
        account.errors.append(f"{source.name}: {exc}")
        return result
    spill = _BucketFiles(source.spill) if source.spill is not None else None
    frames, buckets = [], 0
    # The record walk finds the next chunk's records while this chunk is decoded (numpy, which lets
    # go of the interpreter in its big gathers): two cores for one capture.
    with ThreadPoolExecutor(1) as walker:
        chunks = reader.chunks()
        upcoming = walker.submit(next, chunks, None)
        while (rec := upcoming.result()) is not None:
            upcoming = walker.submit(next, chunks, None)
            buckets = buckets or _buckets(rec, len(reader.data))
            table, status = dec.decode(reader.view, rec, buckets)
            frame = _frame(source, rec, table)
            if spill is not None:
                spill.write(frame)
            else:
                frames.append(frame)
            _count(account, rec, status)
            # the pages decoded so far leave this process's memory (the page cache keeps them): a
            # mapped capture of several GB would otherwise count whole in its resident size
            mapped.madvise(mmap.MADV_DONTNEED, 0, int(rec.offset[0]) // mmap.PAGESIZE * mmap.PAGESIZE)
    account.errors.extend(f"{source.name}: {note}" for note in reader.notes)
    for linktype in sorted(reader.linktypes - set(LINKTYPE_NAMES)):
        account.errors.append(
            f"{source.name}: link type {linktype} is not one tracelens decodes; its packets were skipped"
        )
    if spill is not None:
        if (scan := spill.close()) is not None:
            result.add("packets", scan)
    elif frames:
        result.add("packets", pl.concat(frames))  # in chunks: read it by selecting columns first
    _give_back_freed_memory()
    return result


def _buckets(first: Records, size: int) -> int:
    """How many buckets of host pairs the capture's rows go in: about BUCKET_PACKETS frames each, the
    number of frames guessed from the file's size and the first chunk's bytes per record."""
    per_record = (int(first.offset[-1] + first.caplen[-1]) - int(first.offset[0])) / len(first) + 16
    return int(min(MAX_BUCKETS, max(1, -(-size // int(per_record * BUCKET_PACKETS)))))


TEXT_COLUMNS = ["file", "host", "ts_quality", "src", "dst", "proto"]


class _BucketFiles:
    """The capture's rows as Parquet in the run's private working folder (a folder of its own there,
    0700, removed with the run): one file per bucket, a row group per chunk, so that reading a bucket
    reads one file (its `bucket` column is one value: a filter on it skips the others unread)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(dir=root, prefix="packets-"))
        self.writers: dict[int, pq.ParquetWriter] = {}

    def write(self, frame: pl.DataFrame) -> None:
        bucket = frame["bucket"].to_numpy()
        order = np.argsort(bucket, kind="stable")  # the chunk's rows bucket by bucket, in frame order within
        rows = frame[order]
        bounds = np.searchsorted(bucket[order], np.arange(bucket.max() + 2))
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            table = rows.slice(int(bounds[b]), int(bounds[b + 1] - bounds[b])).to_arrow()
            if b not in self.writers:
                self.writers[b] = pq.ParquetWriter(
                    self.folder / f"bucket-{b:04d}.parquet",
                    table.schema,
                    compression="lz4",
                    use_dictionary=TEXT_COLUMNS,  # the text repeats (addresses, file); numbers are written plain
                    write_statistics=["bucket"],  # what a filter on the bucket skips files by
                )
            self.writers[b].write_table(table)

    def close(self) -> pl.LazyFrame | None:
        """A lazy scan of every bucket's file; None when no frame was read."""
        for writer in self.writers.values():
            writer.close()
        paths = [self.folder / f"bucket-{bucket:04d}.parquet" for bucket in sorted(self.writers)]
        return pl.scan_parquet(paths) if paths else None


def _give_back_freed_memory() -> None:
    """Return the decode's freed heap to the system (glibc keeps it otherwise: about 90 MB per million
    packets stayed in the process after a capture was read)."""
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


def _frame(source: InputFile, rec: Records, table: pa.Table) -> pl.DataFrame:
    n = len(rec)
    provenance = {
        "file": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([source.name])),
        "ts": pa.array(rec.ts_ns, mask=~rec.ts_valid, type=TS),
        "ts_quality": pa.DictionaryArray.from_arrays(
            pa.array(rec.ts_valid.astype(np.int32)), pa.array(["none", "exact"])
        ),
    }
    for name, column in provenance.items():
        table = table.append_column(name, column)
    # in the table's types now, chunk by chunk: a capture's rows are not held twice when the run adds them;
    # its text columns (file, host, addresses, protocol) stay categorical
    frame = pl.from_arrow(table).with_columns(host=pl.lit(None, pl.Categorical))  # type: ignore[union-attr]
    return conform("packets", frame)


def _undecodable(rec: Records, i: int) -> str:
    link = LINKTYPE_NAMES[int(rec.linktype[i])]
    return f"{link} frame of {int(rec.caplen[i])} captured bytes: network header cut off or malformed"
