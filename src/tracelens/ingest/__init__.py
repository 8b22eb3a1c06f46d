"""Ingest: turn one input file into table rows plus an account of what was read.

Each format module in this package that defines `FORMAT`, `PRIORITY`,
`sniff(head: bytes) -> bool` and `ingest(source: InputFile) -> IngestResult`
is found automatically. Sniffers run in PRIORITY order (lower first) on the
first 64 KiB of a file; text that no sniffer claims is read as a log by
`textlog`, where the line parsers (NCCL, DeepSpeed, ...) share one pass.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

import polars as pl

from tracelens.ingest.text.lines import CHUNK_BYTES, MAX_LINE_BYTES, long_lines
from tracelens.prose import count

SAMPLE_LIMIT = 20


@dataclass(frozen=True)
class InputFile:
    """A file to ingest: where it is on disk, how to name it, what it is."""

    path: Path  # on disk (maybe inside a temporary extraction folder)
    name: str  # as shown to the user: relative to the run, archive members as archive!member
    format: str
    host_hint: str | None = None  # from the path (a node folder, a host in the file name)
    size: int = 0
    error: str | None = None  # why discovery could not read it (a FIFO, a broken link, a damaged member ...)
    spill: Path | None = None  # the run's private folder where a big file's rows may go as Parquet while it is read


@dataclass
class Account:
    """How much of a file was understood. Nothing is dropped without being counted."""

    lines: int = 0  # lines (or packets) read
    parsed: int = 0  # classified into a specific kind
    ignored: int = 0  # known but irrelevant: blank, or recognised by a parser as noise
    unrecognized: int = 0  # read but not understood: no kind of a known format matched, or no parser claimed it
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was read in part (lines cut to their head)
    samples: list[tuple[int, str]] = field(default_factory=list)  # (line, text) of unrecognized

    def add_samples(self, rows: list[tuple[int, str]]) -> None:
        room = SAMPLE_LIMIT - len(self.samples)
        if room > 0:
            self.samples.extend((line, clip(text)) for line, text in rows[:room])


SAMPLE_CHARS = 500


def clip(text: str, limit: int = SAMPLE_CHARS) -> str:
    """A line as the report shows it: its head, and how much was left out of a long one."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


@dataclass
class IngestResult:
    """Rows per table name, and the file's account."""

    tables: dict[str, pl.DataFrame | pl.LazyFrame] = field(default_factory=dict)  # lazy: a scan of spilled rows
    account: Account = field(default_factory=Account)

    def add(self, name: str, frame: pl.DataFrame | pl.LazyFrame) -> None:
        if isinstance(frame, pl.LazyFrame) or frame.height:
            prev = self.tables.get(name)
            if prev is None:
                self.tables[name] = frame
            elif isinstance(prev, pl.LazyFrame) or isinstance(frame, pl.LazyFrame):
                self.tables[name] = pl.concat([prev.lazy(), frame.lazy()], how="diagonal_relaxed")
            else:
                self.tables[name] = pl.concat([prev, frame], how="diagonal_relaxed")


def with_host_hint(tables: dict, hint: str | None) -> dict:
    """The tables with the host a file's path suggests on the rows whose content named none."""
    if not hint:
        return tables
    return {
        name: frame.with_columns(pl.col("host").fill_null(hint)) if "host" in frame.collect_schema().names() else frame
        for name, frame in tables.items()
    }


def splits(source: InputFile, jobs: int) -> bool:
    """Whether ingest_file(source, jobs) parses the file's chunks in several workers."""
    module = {m.FORMAT: m for m in format_modules()}.get(source.format)
    return jobs > 1 and getattr(module, "SPLITS", False) and source.size > 2 * CHUNK_BYTES


@cache
def format_modules() -> list[ModuleType]:
    """All format modules, in sniffing order."""
    found = []
    for info in pkgutil.walk_packages(__path__, f"{__name__}."):
        module = importlib.import_module(info.name)
        if hasattr(module, "FORMAT") and hasattr(module, "sniff") and hasattr(module, "ingest"):
            found.append(module)
    return sorted(found, key=lambda m: (m.PRIORITY, m.FORMAT))


def sniff_format(head: bytes) -> str:
    """The format of a file from its first bytes: the first sniffer that claims it."""
    for module in format_modules():
        if module.sniff(head):
            return module.FORMAT
    if looks_like_text(head):
        return "log"
    return "utf16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") or _utf16_ascii(head[:4096]) else "binary"


class LineStart:
    """A sniffer's regex whose alternatives all start a line (`^` under re.M), written without the `^`.

    Python's re tries such an alternation at every byte of a 64 KiB head (and thousands of small files
    are sniffed by a dozen formats); led by a newline it jumps from newline to newline.
    """

    def __init__(self, pattern: bytes, flags: int = 0) -> None:
        self.pattern, self.flags = pattern, flags
        self.regex = re.compile(rb"\n(?:" + pattern + rb")", flags | re.M)

    def search(self, head: bytes) -> bool:
        return self.regex.search(b"\n" + head) is not None

    def count(self, head: bytes) -> int:
        return len(self.regex.findall(b"\n" + head))


def _utf16_ascii(sample: bytes) -> bool:
    """ASCII text in UTF-16 without a byte-order mark: every other byte NUL, the rest not."""
    for zeros, chars in ((sample[1::2], sample[0::2]), (sample[0::2], sample[1::2])):
        if zeros.count(0) * 10 >= len(zeros) * 9 and chars.count(0) * 10 < len(chars):
            return True
    return False


def looks_like_text(head: bytes) -> bool:
    """Text unless NUL bytes are more than 1% of the first 4 KiB: a stray NUL (a crash mid-write, a
    pasted control character) does not make a log binary."""
    sample = head[:4096]
    return sample.count(0) * 100 <= len(sample)


_UNREADABLE = {
    "empty": "empty file, nothing to read",
    "binary": "binary content of no format tracelens reads (not a pcap/pcapng capture or a text log)",
    "utf16": "UTF-16 text (as Windows tools write it); convert it with `iconv -f UTF-16 -t UTF-8 FILE > FILE.txt`",
}


def ingest_file(source: InputFile, jobs: int = 1, workers: Executor | None = None) -> IngestResult:
    """Ingest one file with its format's module (in `jobs` processes, or on `workers`, where the
    module `SPLITS` a file into chunks); failures become a one-line error, never a crash."""
    modules = {m.FORMAT: m for m in format_modules()}
    module = modules.get(source.format)
    if source.error:
        result = IngestResult()
        result.account.errors.append(f"{source.name}: {source.error}")
        return result
    if source.format == "config":  # the run's config file (tracelens.discover): no evidence, nothing wrong
        return IngestResult()
    if module is None:
        result = IngestResult()
        reason = _UNREADABLE.get(source.format, f"not a format tracelens reads ({source.format})")
        result.account.errors.append(f"{source.name}: {reason}")
        return result
    try:
        if getattr(module, "SPLITS", False) and jobs > 1:
            result = module.ingest(source, jobs=jobs, workers=workers)
        else:
            result = module.ingest(source)
    except Exception as exc:  # one bad file must not stop the run
        result = IngestResult()
        result.account.errors.append(f"{source.name}: could not be read: {type(exc).__name__}: {exc}")
        return result
    if getattr(module, "READS_LINES", True) and source.size > MAX_LINE_BYTES:
        result.account.notes += long_lines_note(source.path)
    return result


def long_lines_note(path: Path) -> list[str]:
    """The note on the lines the reader cut to their head, if any."""
    long = long_lines(path)
    if not long:
        return []
    shown = ", ".join(f"line {line:,} ({size:,} bytes)" for line, size in long[:3])
    more = f" and {len(long) - 3:,} more" if len(long) > 3 else ""
    return [f"{count(len(long), 'line')} longer than {MAX_LINE_BYTES >> 20} MiB, read as its first MiB: {shown}{more}"]
