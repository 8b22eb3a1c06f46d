"""Packet captures (pcap and pcapng) into the `packets` table.

The file is memory-mapped and decoded a chunk of records at a time
(tracelens.packets.records walks the records, tracelens.packets.decode reads
their headers vectorized), so a capture larger than memory is read in bounded
memory. Account: lines = frames read, parsed = frames with an IP, RoCE or
InfiniBand header, ignored = other link-layer protocols (ARP, LLDP ...),
unrecognized = frames on an unknown link type or with a cut or malformed
network header.
"""

from __future__ import annotations

import ctypes
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa

from tracelens.ingest import SAMPLE_LIMIT, Account, IngestResult, InputFile
from tracelens.packets import decode as dec
from tracelens.packets.records import CaptureError, CaptureReader, Records, is_capture
from tracelens.tables import TS, conform

FORMAT = "pcap"
PRIORITY = 10

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
    frames = []
    # The record walk (a Python loop) finds the next chunk's records while this chunk is decoded
    # (numpy, which lets go of the interpreter in its big gathers): two cores for one capture.
    with ThreadPoolExecutor(1) as walker:
        chunks = reader.chunks()
        upcoming = walker.submit(next, chunks, None)
        while (rec := upcoming.result()) is not None:
            upcoming = walker.submit(next, chunks, None)
            table, status = dec.decode(reader.view, rec)
            frames.append(_frame(source, rec, table))
            _count(account, rec, status)
            # the pages decoded so far leave this process's memory (the page cache keeps them): a
            # mapped capture of several GB would otherwise count whole in its resident size
            mapped.madvise(mmap.MADV_DONTNEED, 0, int(rec.offset[0]) // mmap.PAGESIZE * mmap.PAGESIZE)
    account.errors.extend(f"{source.name}: {note}" for note in reader.notes)
    for linktype in sorted(reader.linktypes - set(LINKTYPE_NAMES)):
        account.errors.append(
            f"{source.name}: link type {linktype} is not one tracelens decodes; its packets were skipped"
        )
    if frames:
        result.add(
            "packets", pl.concat(frames)
        )  # in chunks: read it by selecting columns first (an eager group_by copies every column)
    _give_back_freed_memory()
    return result


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
