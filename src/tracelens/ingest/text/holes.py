"""Reading past runs of zero bytes without reading them one by one: the holes of a sparse file
(gigabytes a `truncate` or a crashed write leaves, taking no disk) and the zero padding a gzip
file may carry between and after its members.

Python's gzip reader consumes padding a byte per call (a gigabyte of it takes minutes) and any
reader scans a hole's zeros at memory speed; here a hole is jumped over with SEEK_DATA and
padding is stripped a block at a time, so the cost follows the bytes that hold data.
"""

from __future__ import annotations

import errno
import gzip
import os
import zlib
from pathlib import Path
from typing import BinaryIO

_BLOCK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZEROS = bytes(64 << 10)  # compressed data never holds this many zero bytes in a row


def skip_hole(fh: BinaryIO) -> bool:
    """Move `fh` to the next byte of data at or after its position (past a hole, whose bytes are
    all zero); False when only a hole is left, up to the end of the file."""
    try:
        fh.seek(fh.tell(), os.SEEK_DATA)  # through the buffered file, which drops what it read ahead
    except OSError as exc:
        return exc.errno != errno.ENXIO  # another error: a file system that cannot tell, read on
    return True


def skip_zeros(fh: BinaryIO) -> int:
    """Move `fh` past the zero bytes at its position (holes jumped over, written zeros read a block at
    a time) to the next byte that is not zero, or to the end; return where it is."""
    while True:
        if not skip_hole(fh):
            return fh.seek(0, os.SEEK_END)
        at = fh.tell()
        block = fh.read(_BLOCK)
        if not block:
            return at
        rest = block.lstrip(b"\0")
        if rest:
            return fh.seek(at + len(block) - len(rest))


class GzipMembers:
    """The decompressed bytes of a gzip file's members, one after the other, as `gzip.open` gives
    them (CRC and length checked, damage raised as zlib.error, EOFError or gzip.BadGzipFile), with
    the zero padding between and after members skipped in blocks."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("rb")
        self._inflate: zlib._Decompress | None = None
        self._pending = b""  # compressed bytes read and not yet given to the decompressor
        self._zero_run = b""  # the block's bytes from a run of zeros on, while a member is read before it

    def __enter__(self) -> GzipMembers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def _compressed(self) -> bytes:
        """The next compressed bytes, b"" at the end of the file; between members, padding skipped."""
        while True:
            data, self._pending = self._pending or self._fh.read(_BLOCK), b""
            if not data or self._inflate is not None:
                return data
            data = data.lstrip(b"\0")
            if data:
                if len(data) < 2:
                    data += self._fh.read(1)
                if not data.startswith(_GZIP_MAGIC):
                    raise gzip.BadGzipFile("Not a gzipped file (bytes after the last member)")
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                return data
            if not skip_hole(self._fh):
                return b""

    def read(self, size: int = _BLOCK) -> bytes:
        """Up to `size` decompressed bytes (at least one unless the file has ended)."""
        while True:
            if self._inflate is not None and self._inflate.unconsumed_tail:
                data = self._inflate.unconsumed_tail
            elif self._inflate is not None and self._zero_run:
                if not self._trailer_in_run():
                    raise EOFError("Compressed data runs into a run of zero bytes before its end")
                continue
            else:
                data = self._compressed()
                if not data:
                    if self._inflate is not None:
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                    return b""
                # zeros after a member cut short (a crashed write, a hole) are no more of it: deflate would
                # read them as data, possibly for a hole's every byte
                run = data.find(_ZEROS)
                if run >= 0:
                    data, self._zero_run = data[:run], data[run:]
            assert self._inflate is not None
            out = self._inflate.decompress(data, size)
            self._member_done()
            if out:
                return out

    def _trailer_in_run(self) -> bool:
        """Whether the member's trailer ends in the zero run (its length mod 2^32 may end in zero
        bytes): then the member ends there and the run is what follows it."""
        assert self._inflate is not None
        trial = self._inflate.copy()
        if trial.decompress(self._zero_run[:8]) or not trial.eof:
            return False
        self._inflate, self._zero_run = trial, self._zero_run[8:]  # unused_data holds the run's first bytes past it
        self._member_done()
        return True

    def _member_done(self) -> None:
        """At a member's end, what follows it in the block is read for the next member."""
        if self._inflate is not None and self._inflate.eof:
            self._pending, self._inflate, self._zero_run = self._inflate.unused_data + self._zero_run, None, b""
