"""A cache folder only the current user can write, checked before every use.

The NCCL grammar takes far longer to build than to load from lark's cache, but lark's
own default cache is a pickle at a predictable name in the shared temporary folder: another
user of a login node could plant one there and have it executed. The cache lives here
instead, in a folder owned by this user that no one else can write, and a cache file is
used only while it is a regular file owned by this user that no one else can write.
Anything else (another owner, loose permissions, a link) means: no cache, build afresh.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_LOOSE = stat.S_IWGRP | stat.S_IWOTH


def _owned_and_private(info: os.stat_result, kind: int) -> bool:
    return stat.S_IFMT(info.st_mode) == kind and info.st_uid == os.getuid() and not info.st_mode & _LOOSE


def cache_dir() -> Path | None:
    """`$XDG_CACHE_HOME/tracelens` (default ~/.cache/tracelens), created 0700; None when it is not
    safe (owned by someone else, writable by others, a link) or cannot be made."""
    if not hasattr(os, "getuid"):
        return None  # no owner checks to make on this platform: do without a cache
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(base) / "tracelens"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    return folder if _owned_and_private(info, stat.S_IFDIR) else None


def cache_file(name: str) -> str | None:
    """The path for cache entry `name` in the private folder, or None when no cache may be used:
    the folder is unsafe, or an entry already there is not a private regular file of this user."""
    folder = cache_dir()
    if folder is None:
        return None
    path = folder / name
    try:
        info = path.lstat()
    except FileNotFoundError:
        return str(path)
    except OSError:
        return None
    return str(path) if _owned_and_private(info, stat.S_IFREG) else None
