"""The `tracelens` command's entry point (also `python -m tracelens`): what the process needs
before polars loads, then the command line. Importing tracelens as a library changes nothing
process-wide; only running the command does."""

from __future__ import annotations

import os

# polars' allocator (jemalloc), read once when polars loads: one arena that keeps freed pages a few
# seconds, so that a big log's next chunk reuses them instead of faulting fresh ones in (the CPU and
# memory this trades are in benchmarks/README.md). A setting of the user's own wins. Worker processes
# inherit it from the environment.
ALLOCATOR = ("_RJEM_MALLOC_CONF", "narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0")


def main() -> None:
    os.environ.setdefault(*ALLOCATOR)
    from tracelens.cli import app

    app(prog_name="tracelens")


if __name__ == "__main__":
    main()
