"""The shared line reader: a text file as chunks of (line, text) frames.

Files are read in blocks of a few MiB cut at a line end, so memory stays
bounded on logs of any size. Bytes that are not UTF-8 are replaced (and the
line still counts), CRLF and stray CR are folded, and the line numbers are
the ones an editor shows.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracelens.ingest.text.holes import skip_hole, skip_zeros
from tracelens.ingest.text.pasted import unpaste

if TYPE_CHECKING:
    from tracelens.ingest import InputFile

CHUNK_BYTES = 32 << 20
# A chunk holds at most this many lines too: what its parsing costs grows with its lines (a column
# of each kind per line), so a file of millions of tiny lines is cut by their count, not its bytes.
CHUNK_LINES = 1 << 20
MAX_LINE_BYTES = 1 << 20  # longer lines (no NCCL or DeepSpeed line comes near) keep their head only

# Many small files read as one frame (ingest/small_files.py) number their lines by key: the file's
# place in the batch above FILE_SHIFT, its line number below. A single file's keys are its line numbers.
FILE_SHIFT = 32
LINE_MASK = (1 << FILE_SHIFT) - 1  # a key's line number in its file


def file_of(line: pl.Expr) -> pl.Expr:
    """Which file of a batch a line key belongs to (0 for a file read alone)."""
    return line // (1 << FILE_SHIFT)


# Status codes a line parser gives each line; the highest claim wins.
NOT_MINE, IGNORED, UNRECOGNIZED, PARSED = 0, 1, 2, 3


def strongest_claim(claims: list[pl.Series]) -> pl.Series:
    """Each line's status: the highest of the line parsers' claims on it (NOT_MINE where none claims it)."""
    frame = pl.DataFrame([claim.alias(str(i)) for i, claim in enumerate(claims)])
    return frame.select(pl.max_horizontal(pl.all()).fill_null(NOT_MINE)).to_series()


def settled(status: pl.Expr, text: pl.Expr) -> pl.Expr:
    """A line's status as the account counts it: a line no parser claimed is unrecognised, unless it
    is blank (known to hold nothing). Known but irrelevant is only what a parser recognised as such."""
    unclaimed = status.fill_null(NOT_MINE) == NOT_MINE
    blank = text.str.strip_chars() == ""
    return (
        pl.when(unclaimed & blank)
        .then(pl.lit(IGNORED, pl.UInt8))
        .when(unclaimed)
        .then(pl.lit(UNRECOGNIZED, pl.UInt8))
        .otherwise(status.cast(pl.UInt8))
    )


def byte_slice(text: pl.Expr, start: pl.Expr | int, length: pl.Expr | int | None = None) -> pl.Expr:
    """Slice of `text` by byte offsets, as `str.find` returns them. `str.slice` and `str.head`
    count characters, which differ from bytes once non-ASCII text (a tqdm bar, an accented
    host name) comes first."""
    # a negative start or length would count from the end and could cut a character in two
    start = start.clip(lower_bound=0) if isinstance(start, (pl.Expr, pl.Series)) else max(start, 0)
    if length is not None:
        length = length.clip(lower_bound=0) if isinstance(length, (pl.Expr, pl.Series)) else max(length, 0)
    return text.cast(pl.Binary).bin.slice(start, length).cast(pl.String)


def any_of(literals: list[str]) -> str:
    """A regex that matches where any of `literals` occurs: the regex engine searches them all at once
    (SIMD), several times faster than polars' `str.contains_any` (Aho-Corasick) over long lines."""
    return "|".join(map(re.escape, literals))


# Years a nanosecond timestamp can hold (1677-09-21 .. 2262-04-11): outside them polars wraps around
# (a log year 9999 became 1815), so such times are no time at all.
NS_YEARS = (1678, 2261)


def within_datetime_range(text: pl.Expr) -> pl.Expr:
    """`text` (a time starting with a 4-digit year) where its year fits a nanosecond timestamp, else null."""
    year = text.str.slice(0, 4).cast(pl.Int32, strict=False)
    return pl.when(year.is_between(*NS_YEARS)).then(text)


# Past this magnitude a number read from text is a bad value of its line, not a measurement: `1e309`
# reads as infinity, and no time (ms), rate or size a run prints comes near it, while a larger one
# overflows the time arithmetic downstream (milliseconds to nanoseconds in 64 bits).
NUMBER_LIMIT = 1e12


def number(text: pl.Expr) -> pl.Expr:
    """`text` as a float, null where it is no number, not finite (nan, inf, 1e309) or past NUMBER_LIMIT."""
    value = text.cast(pl.Float64, strict=False)
    return pl.when(value.abs() <= NUMBER_LIMIT).then(value)


def checked_float(text: str) -> float:
    """`number` for one value in Python: a float, or ValueError for one that is no measurement."""
    value = float(text)
    if not abs(value) <= NUMBER_LIMIT:  # also false for nan
        raise ValueError(f"number out of range: {text}")
    return value


def _split_lines(block: bytes) -> pl.Series:
    """Lines of a block by a plain split: exact for any byte (NUL, lone CR), slower than _csv_lines on
    a big block, faster on a small one (the CSV reader's set-up costs a few ms)."""
    text = pl.Series("text", [block.decode("utf-8", errors="replace")])
    lines = text.str.split("\n").explode()
    if b"\r" in block:
        lines = lines.str.strip_suffix("\r").str.replace_all("\r", " ", literal=True)
    return lines


def _csv_lines(block: bytes) -> pl.Series | None:
    """Lines through polars' multi-threaded CSV reader (the faster way), when it splits exactly as `\n` does."""
    if b"\x00" in block or b"\r" in block:
        return None
    frame = pl.read_csv(
        io.BytesIO(block),
        has_header=False,
        separator="\x00",
        quote_char=None,
        schema={"text": pl.String},
        encoding="utf8-lossy",
    )
    lines = frame["text"].fill_null("")
    return lines if lines.len() == block.count(b"\n") + 1 else None


def _cut_long(lines: pl.Series) -> pl.Series:
    """Lines longer than MAX_LINE_BYTES as their head (`long_lines` finds them for the account)."""
    long = (lines.str.len_bytes() > MAX_LINE_BYTES).arg_true()
    if not long.len():
        return lines
    heads = [text.encode()[:MAX_LINE_BYTES].decode("utf-8", errors="ignore") for text in lines.gather(long)]
    return lines.scatter(long, heads)


CSV_LINES_BYTES = 4 << 20  # blocks from this size are split by the CSV reader (a folder of small files is not)


def _frame(block: bytes, first_line: int) -> pl.DataFrame:
    lines = _csv_lines(block) if len(block) >= CSV_LINES_BYTES else None
    if lines is None:
        lines = _split_lines(block)
    lines = _cut_long(lines)
    lines = unpaste(lines)  # a log pasted from a tracker or chat, put back as printed
    return pl.DataFrame(
        {"line": pl.int_range(first_line, first_line + lines.len(), dtype=pl.Int64, eager=True), "text": lines}
    )


def _line_end(block: bytes, lines: int) -> int:
    """Where the `lines`-th newline of `block` is (it has that many)."""
    pos, window = 0, 1 << 16
    while (found := block.count(b"\n", pos, pos + window)) < lines:
        lines, pos = lines - found, pos + window
    for _ in range(lines):
        pos = block.index(b"\n", pos) + 1
    return pos - 1


def _blocks(
    path: Path, chunk_bytes: int, max_line: int = MAX_LINE_BYTES, keep: bool = True, max_lines: int = CHUNK_LINES
) -> Iterator[tuple[int, int, int, bytes | None]]:
    """(byte offset, length, first line, bytes if `keep`) of each chunk: blocks of `chunk_bytes`, or of
    `max_lines` lines where that is fewer bytes, cut after a line end.

    A line longer than `max_line` with no newline in a whole block (a 200 MB line) is a block of
    its own holding its first `max_line` bytes, counted as one line; the rest of it, up to its
    newline, is skipped. Memory stays bounded by the block size, and every block is still the
    file's bytes at its offset (read_span reads the same). The bytes after a block's last newline
    (`carry`) hold no newline, so a block is cut and its lines counted in what was just read: a
    chunk is copied once, when kept (chunk_spans copies nothing). Zero bytes the file begins with
    (leading_zeros) are not read: line 1 is the text after them."""
    next_line, carry, skipping = 1, b"", False  # `carry` holds the file's bytes from `start`
    with path.open("rb") as fh:
        start = skip_zeros(fh)
        while True:
            read_at = fh.tell()
            block = fh.read(chunk_bytes)
            if not block:
                break
            if skipping:
                end = block.find(b"\n")
                if end < 0:
                    if not skip_hole(fh):  # the rest of a long line may be a sparse file's hole
                        break
                    continue
                skipping, block, start, carry = False, block[end + 1 :], read_at + end + 1, b""
            cut = block.rfind(b"\n")
            if cut < 0:
                carry += block
                if len(carry) > max_line:
                    yield start, max_line, next_line, carry[:max_line] if keep else None
                    next_line, carry, skipping = next_line + 1, b"", True
                continue
            lines = block.count(b"\n", 0, cut) + 1
            recut = lines > max_lines
            if recut:  # the rest of the block is read again, as the next chunk's start
                cut, lines = _line_end(block, max_lines), max_lines
                fh.seek(fh.tell() - len(block) + cut + 1)
            length = len(carry) + cut
            # joined over a view: one copy (a slice and then `carry +` would be two, each into fresh
            # memory the kernel must clear)
            yield start, length, next_line, b"".join((carry, memoryview(block)[:cut])) if keep else None
            next_line += lines
            start += length + 1
            carry = b"" if recut else block[cut + 1 :]
    if carry:
        yield start, len(carry), next_line, carry


def read_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pl.DataFrame]:
    """Yield frames with columns `line` (1-based) and `text`, in file order."""
    for _, _, first_line, block in _blocks(path, chunk_bytes):
        assert block is not None
        yield _frame(block, first_line)


def read_lines(source: InputFile) -> pl.DataFrame:
    """The whole file as columns `line` (1-based) and `text` (for a file small enough to read at once)."""
    chunks = list(read_chunks(source.path))
    return pl.concat(chunks) if chunks else pl.DataFrame(schema={"line": pl.Int64, "text": pl.String})


def read_keyed(paths: dict[int, Path]) -> tuple[pl.DataFrame, list[int]]:
    """Several small files' lines as one frame, each file's as read_lines gives them: columns idx (the
    file's place, the key of `paths`), line (its key: idx above FILE_SHIFT, the line number below) and
    text, each file's lines after an empty row of line number 0, so that nothing a parser looks at on
    the line above reaches into another file. Also the places of the files that could not be read."""
    parts, read, counts, unread = [], [], [], []
    for i, path in paths.items():
        try:
            data = path.read_bytes()
        except OSError:
            unread.append(i)
            continue
        data = data.lstrip(b"\0")  # as _blocks: line 1 starts after the zero bytes a file begins with
        data = data[:-1] if data.endswith(b"\n") else data  # a last newline ends a line, opens none
        parts.append(b"\n" + data)
        read.append(i)
        counts.append(data.count(b"\n") + 2)
    if not parts:
        return pl.DataFrame(schema={"idx": pl.Int64, "line": pl.Int64, "text": pl.String}), unread
    # one decode and one split for all: a newline ends any broken UTF-8 sequence, so this is each file's decode
    text = _split_lines(b"\n".join(parts))
    idx = np.repeat(np.array(read, dtype=np.int64), counts)
    first = np.repeat(np.cumsum([0, *counts[:-1]], dtype=np.int64), counts)
    key = (idx << FILE_SHIFT) + np.arange(len(idx), dtype=np.int64) - first
    return pl.DataFrame({"idx": idx, "line": key, "text": unpaste(text)}), unread


def read_files(paths: list[Path]) -> pl.DataFrame:
    """read_keyed of files that must all be read (a format's batch: where one cannot be, each file is
    read alone, to say which)."""
    lines, unread = read_keyed(dict(enumerate(paths)))
    if unread:
        raise OSError(f"cannot read {paths[unread[0]]}")
    return lines


def chunk_spans(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, int, int]]:
    """(byte offset, length, first line) of the chunks read_chunks yields, for workers that read them themselves."""
    for offset, length, first_line, _ in _blocks(path, chunk_bytes, keep=False):
        yield offset, length, first_line


def read_span(path: Path, offset: int, length: int, first_line: int) -> pl.DataFrame:
    """The chunk at a span chunk_spans gave: the same frame read_chunks yields there."""
    with path.open("rb") as fh:
        fh.seek(offset)
        return _frame(fh.read(length), first_line)


def leading_zeros(path: Path) -> int:
    """The zero bytes a text file begins with, which the reader skips: a hole that a log truncated
    under its writer (logrotate's copytruncate, `> file` on a running job) gets from the writer's
    next line at its old offset, or a file preallocated and written from a later point."""
    with path.open("rb") as fh:
        return skip_zeros(fh)


def _any_long(path: Path, max_line: int, block_bytes: int) -> bool:
    """Whether the file has a line longer than `max_line`: the search long_lines makes, without
    counting lines (the costly part), so that a file with none is passed over at reading speed."""
    block = bytearray(min(block_bytes, max(path.stat().st_size, 1)))
    since = 0  # bytes of the current line read before this block
    with path.open("rb") as fh:
        skip_zeros(fh)  # as long_lines: the zeros a file begins with are no line
        while got := fh.readinto(block):
            i = block.find(b"\n", 0, got)
            if i < 0:
                since += got
                if since > max_line:
                    return True
                continue
            if since + i > max_line:
                return True
            i += 1
            while got - i > max_line:  # a line starting at i ends within max_line bytes
                last = block.rfind(b"\n", i, i + max_line + 1)
                if last < 0:
                    return True
                i = last + 1
            since = got - 1 - block.rfind(b"\n", i - 1, got)  # after the block's last newline
    return since > max_line


def long_lines(path: Path, max_line: int = MAX_LINE_BYTES, block_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """(line number, length in bytes) of each line of the file longer than `max_line`: the lines the
    reader keeps only the head of. One pass, in steps of about `max_line` bytes: the last newline
    within `max_line` bytes of a line's start ends every line before it short enough, and no
    newline there makes the line a long one."""
    if not _any_long(path, max_line, block_bytes):
        return []
    found: list[tuple[int, int]] = []
    line, long_from = 1, None  # the current line, and since when it is known long
    # one buffer read into again and again: fresh memory for each block costs more than the search
    block = bytearray(min(block_bytes, max(path.stat().st_size, 1)))
    with path.open("rb") as fh:
        start = skip_zeros(fh)  # where the current line starts
        while got := fh.readinto(block):
            base, i = fh.tell() - got, 0
            while i < got:
                if long_from is not None:
                    end = block.find(b"\n", i, got)
                    if end < 0:
                        if not skip_hole(fh):  # a hole up to the end of the file: no newline left
                            fh.seek(0, io.SEEK_END)
                        break
                    found.append((line, base + end - start))
                    line, start, long_from, i = line + 1, base + end + 1, None, end + 1
                    continue
                window_end = start + max_line + 1 - base  # a newline before it ends the line short enough
                last = block.rfind(b"\n", i, min(window_end, got))
                if last >= 0:
                    line += block.count(b"\n", i, last + 1)
                    start, i = base + last + 1, last + 1
                elif window_end <= got:
                    long_from, i = start, window_end
                else:
                    break
    size = path.stat().st_size
    if long_from is not None or size - start > max_line:
        found.append((line, size - start))
    return found
