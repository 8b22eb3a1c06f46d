"""Ingest: turn one input file into table rows plus an account of what was read.

A format registers its reader with `@input_format(name, priority=..., sniff=...)` on its
`ingest(source: InputFile) -> IngestResult`; every module of this package and its family
packages is imported to find them. Sniffers run in priority order (lower first) on the first
64 KiB of a file; text that no sniffer claims is read as a log by `textlog`, where the line
parsers (NCCL, DeepSpeed, ...) share one pass: a format found inside such logs registers its
parser class with `@line_format(name, candidates=...)`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Protocol, TypeVar

import polars as pl

from tracelens.ingest.text.lines import CHUNK_BYTES, MAX_LINE_BYTES, leading_zeros, long_lines
from tracelens.prose import count
from tracelens.tables import Spill

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


@dataclass
class Batch:
    """Several files of one format read at once (a folder of thousands of small dumps costs what its
    reader's set-up costs once, not once a file): their rows, one table each, every row naming its
    `file`, and each file's account by name."""

    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)


def with_host_hint(tables: dict, hint: str | None) -> dict:
    """The tables with the host a file's path suggests on the rows whose content named none."""
    if not hint:
        return tables
    return {
        name: frame.with_columns(pl.col("host").fill_null(hint)) if "host" in frame.collect_schema().names() else frame
        for name, frame in tables.items()
    }


# (source: InputFile) -> rows; a splitting reader also takes jobs=, workers=; a batching reader takes
# (sources: list[InputFile]) -> Batch
Reader = Callable[..., "IngestResult | Batch"]


@dataclass(frozen=True)
class Format:
    """A registered input format: its name (InputFile.format), its place in the sniffing order, how it
    recognises a file from the file's first bytes, and the function that reads a file of it."""

    name: str
    priority: int  # sniffers run lower first: binary and JSON formats before the text dumps they could look like
    sniff: Callable[[bytes], bool]
    ingest: Reader
    splits: bool = False  # ingest(source, jobs=N, workers=W) parses the chunks of one big file in several workers
    reads_lines: bool = True  # read through the line reader, which cuts a line to its first MAX_LINE_BYTES
    batches: bool = False  # ingest(sources) reads several small files at once into a Batch

    def read(self, source: InputFile, jobs: int = 1, workers: Executor | None = None) -> IngestResult:
        """The file's rows, its chunks parsed in `jobs` workers (or on `workers`) when the format splits."""
        if self.batches:
            batch = self.read_batch([source])
            return IngestResult(dict(batch.tables), batch.accounts[source.name])
        read = self.ingest(source, jobs=jobs, workers=workers) if self.splits and jobs > 1 else self.ingest(source)
        assert isinstance(read, IngestResult)
        return read

    def read_batch(self, sources: list[InputFile]) -> Batch:
        """Several small files of a batching format, read at once."""
        batch = self.ingest(sources)
        assert isinstance(batch, Batch)
        return batch


_FORMATS: dict[str, Format] = {}


def input_format(
    name: str,
    *,
    priority: int,
    sniff: Callable[[bytes], bool],
    splits: bool = False,
    reads_lines: bool = True,
    batches: bool = False,
) -> Callable[[Reader], Reader]:
    """Register the decorated `ingest(source)` as the reader of format `name`, claimed by `sniff`.
    `splits`: it takes `jobs` and `workers` and parses a big file's chunks in parallel; `reads_lines`:
    it reads through the line reader (the file's lines longer than MAX_LINE_BYTES are noted);
    `batches`: it is `ingest(sources)`, reading a list of files into a Batch (one file: a list of one)."""

    def register(func: Reader) -> Reader:
        if name in _FORMATS:
            raise ValueError(f"format {name!r} registered twice")
        if name in _UNREADABLE or name in ("config", "zeros"):
            raise ValueError(f"format name {name!r} is one discovery gives files no format reads")
        params = inspect.signature(func).parameters
        if splits and not {"jobs", "workers"} <= set(params):
            raise ValueError(f"format {name!r} splits, so its reader must take jobs= and workers=")
        if splits and batches:
            raise ValueError(f"format {name!r}: a reader splits a big file or batches small ones, not both")
        _FORMATS[name] = Format(name, priority, sniff, func, splits, reads_lines, batches)
        return func

    return register


@cache
def formats() -> tuple[Format, ...]:
    """Every registered format, in sniffing order. The format modules are found in this package and
    its family packages (each module is imported once): a new format needs no import list."""
    for info in pkgutil.walk_packages(__path__, f"{__name__}."):
        importlib.import_module(info.name)
    return tuple(sorted(_FORMATS.values(), key=lambda f: (f.priority, f.name)))


class LineParser(Protocol):
    """Reads one format's lines out of a text log it shares with others: one per file, `feed` each
    chunk in order, then `finish`."""

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        """Parse a chunk (columns line, text); return a UInt8 status per line (text.lines codes)."""

    def finish(self, result: IngestResult) -> None:
        """Add the parsed tables to `result`."""


@dataclass(frozen=True)
class LineFormat:
    """A format read line by line inside text logs (a launcher's stdout mixes NCCL, DeepSpeed, stack
    dumps ...): its parser class, whether the parser writes a big file's rows to a Spill as it reads
    (it then takes `spill` after the source), and `candidates`, regexes one of which every line it
    may claim matches; none: any line may be its (NCCL's records wrap onto lines of any text); and
    whether the parser reads something from a file's name (a rank: it then takes `files`).

    One parser reads one file, or a batch of small files at once (ingest/small_files.py): the batch's
    lines are fed keyed by file (lines.FILE_SHIFT), each file's after an empty row, so what a parser
    keeps from line to line stays in its file; a parser that reads names takes the batch's `files`."""

    name: str
    parser: Callable[..., LineParser]
    spills: bool
    candidates: tuple[str, ...]
    reads_names: bool = False

    def open(self, source: InputFile, spill: Spill | None = None, files: list[InputFile] | None = None) -> LineParser:
        """A parser for one file, or for a batch of small `files` (`source` then stands for the batch);
        `spill`: where a spilling parser writes its rows."""
        args: dict = {"spill": spill} if self.spills else {}
        if self.reads_names:
            args["files"] = files
        return self.parser(source, **args)


_LINE_FORMATS: dict[str, LineFormat] = {}
ParserClass = TypeVar("ParserClass", bound=type)


def line_format(
    name: str, *, candidates: tuple[str, ...] = (), spills: bool = False, reads_names: bool = False
) -> Callable[[ParserClass], ParserClass]:
    """Register the decorated class as the LineParser of line format `name` (see LineFormat)."""

    def register(cls: ParserClass) -> ParserClass:
        if name in _LINE_FORMATS:
            raise ValueError(f"line format {name!r} registered twice")
        missing = [m for m in ("feed", "finish") if not callable(getattr(cls, m, None))]
        if missing:
            raise ValueError(f"line format {name!r}: {cls.__name__} has no {' or '.join(missing)}")
        _LINE_FORMATS[name] = LineFormat(name, cls, spills, candidates, reads_names)
        return cls

    return register


def line_formats() -> tuple[LineFormat, ...]:
    """Every registered line format, by name (their modules imported as formats() imports them)."""
    formats()
    return tuple(_LINE_FORMATS[name] for name in sorted(_LINE_FORMATS))


def find_format(name: str) -> Format | None:
    """The registered format called `name`, if any."""
    return next((f for f in formats() if f.name == name), None)


def splits(source: InputFile, jobs: int) -> bool:
    """Whether ingest_file(source, jobs) parses the file's chunks in several workers."""
    found = find_format(source.format)
    return jobs > 1 and found is not None and found.splits and source.size > 2 * CHUNK_BYTES


def sniff_format(head: bytes) -> str:
    """The format of a file from its first bytes: the first sniffer that claims it."""
    for fmt in formats():
        if fmt.sniff(head):
            return fmt.name
    if looks_like_text(head):
        return "log"
    if head[:1] == b"\0":  # what follows the zeros says what the file is (ingest_file looks)
        return "zeros"
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


_SNIFFED_BYTES = 64 << 10  # of what follows a file's zeros: as much as discovery sniffs of a file's head


def past_zeros(source: InputFile) -> tuple[InputFile, str]:
    """A file that begins with zero bytes as the format that follows them, where that is a text format
    (the line reader starts after leading zeros), and the note that says so; else the file with the
    error that says why it is not read."""
    zeros = leading_zeros(source.path)
    with source.path.open("rb") as fh:
        fh.seek(zeros)
        fmt = sniff_format(fh.read(_SNIFFED_BYTES))
    found = find_format(fmt)
    what = f"{zeros:,} zero bytes (a hole: a log truncated while its writer kept its offset, or space never written)"
    if zeros >= source.size:
        return replace(source, error=f"holds only {what}: nothing to read"), ""
    if found is not None and found.reads_lines:
        return replace(source, format=fmt), f"begins with {what}; read from the text after them, as line 1"
    if fmt in _UNREADABLE:
        return replace(source, error=_UNREADABLE[fmt]), ""
    return replace(source, error=f"begins with {what} before a {fmt} file, read only from its first byte"), ""


def ingest_file(source: InputFile, jobs: int = 1, workers: Executor | None = None) -> IngestResult:
    """Ingest one file with its format's reader (in `jobs` processes, or on `workers`, where the
    format splits a file into chunks); failures become a one-line error, never a crash."""
    note = ""
    if source.format == "zeros" and not source.error:
        try:
            source, note = past_zeros(source)
        except OSError as exc:
            source = replace(source, error=f"cannot be read: {exc.strerror or exc}")
    fmt = find_format(source.format)
    if source.error:
        result = IngestResult()
        result.account.errors.append(f"{source.name}: {source.error}")
        return result
    if source.format == "config":  # the run's config file (tracelens.discover): no evidence, nothing wrong
        return IngestResult()
    if fmt is None:
        result = IngestResult()
        reason = _UNREADABLE.get(source.format, f"not a format tracelens reads ({source.format})")
        result.account.errors.append(f"{source.name}: {reason}")
        return result
    try:
        result = fmt.read(source, jobs, workers)
    except Exception as exc:  # one bad file must not stop the run
        result = IngestResult()
        result.account.errors.append(f"{source.name}: could not be read: {type(exc).__name__}: {exc}")
        return result
    if fmt.reads_lines and source.size > MAX_LINE_BYTES:
        result.account.notes += long_lines_note(source.path)
    result.account.notes += [note] if note else []
    return result


def long_lines_note(path: Path) -> list[str]:
    """The note on the lines the reader cut to their head, if any."""
    long = long_lines(path)
    if not long:
        return []
    shown = ", ".join(f"line {line:,} ({size:,} bytes)" for line, size in long[:3])
    more = f" and {len(long) - 3:,} more" if len(long) > 3 else ""
    return [f"{count(len(long), 'line')} longer than {MAX_LINE_BYTES >> 20} MiB, read as its first MiB: {shown}{more}"]
