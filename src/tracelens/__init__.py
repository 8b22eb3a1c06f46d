"""tracelens: find out why a distributed training run was slow or hung, offline."""

import os

# polars' allocator (jemalloc): as polars sets it up, freed pages go back to the kernel soon and a big
# log's next chunk faults them in again, which costs a large share of the CPU time of a big log. One
# arena that keeps freed pages a few seconds reuses them instead, for a little more peak memory (more
# arenas or longer decays cost much more memory for no more speed).
# Read by polars when it loads, so set before any import of it; a setting of the user's own wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0")

__version__ = "0.1.0"
