"""The shared line reader: a text file as chunks of (line, text) frames.

Files are read in blocks of a few MiB cut at a line end, so memory stays
bounded on logs of any size. Bytes that are not UTF-8 are replaced (and the
line still counts), CRLF and stray CR are folded, and the line numbers are
the ones an editor shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

CHUNK_BYTES = 32 << 20

# Status codes a line parser gives each line; the highest claim wins.
NOT_MINE, IGNORED, UNRECOGNIZED, PARSED = 0, 1, 2, 3


def _frame(block: bytes, first_line: int) -> pl.DataFrame:
    text = pl.Series("text", [block.decode("utf-8", errors="replace")])
    lines = text.str.split("\n").explode().str.strip_suffix("\r").str.replace_all("\r", " ", literal=True)
    return pl.DataFrame(
        {"line": pl.int_range(first_line, first_line + lines.len(), dtype=pl.Int64, eager=True), "text": lines}
    )


def read_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pl.DataFrame]:
    """Yield frames with columns `line` (1-based) and `text`, in file order."""
    next_line = 1
    carry = b""
    with path.open("rb") as fh:
        while True:
            block = fh.read(chunk_bytes)
            if not block:
                break
            block = carry + block
            cut = block.rfind(b"\n")
            if cut < 0:
                carry = block
                continue
            carry = block[cut + 1 :]
            frame = _frame(block[:cut], next_line)
            next_line += frame.height
            yield frame
    if carry:
        yield _frame(carry, next_line)
