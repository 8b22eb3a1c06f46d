"""The `tracelens` command's entry point (also `python -m tracelens`): what the process needs
before polars loads, then the command line. Importing tracelens as a library changes nothing
process-wide; only running the command does."""

from __future__ import annotations

import os

# polars' allocator (jemalloc), read once when polars loads: as polars sets it up, freed pages go back
# to the kernel soon and a big log's next chunk faults them in again, a large share of the CPU time of a
# big log. One arena that keeps freed pages a few seconds reuses them instead, for a little more peak
# memory. A setting of the user's own wins; worker processes inherit it from the environment.
ALLOCATOR = ("_RJEM_MALLOC_CONF", "narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0")


def main() -> None:
    os.environ.setdefault(*ALLOCATOR)
    from tracelens.cli import app

    app(prog_name="tracelens")


if __name__ == "__main__":
    main()
