"""Files read whole (a config, a dump parsed in one piece) are small: the size is checked before a
byte is read, so a small file's head before a sparse hole of gigabytes costs no memory to refuse."""

from __future__ import annotations

import os
from pathlib import Path


class TooBig(ValueError):
    """The file is larger than what it is read as can be (the message says both sizes)."""


def read_small(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the file at `path` (`what` it is read as), if it holds at most `limit` of them."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise TooBig(f"{what} of {size:,} bytes is larger than the {limit >> 20} MiB read")
        return fh.read(limit)  # a file that grew since holds no more than that
