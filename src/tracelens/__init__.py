"""tracelens: find out why a distributed training run was slow or hung, offline."""

import os

# polars' allocator (jemalloc): as polars sets it up, freed pages go back to the kernel soon and a big
# log's next chunk faults them in again (1.0-1.5M page faults, a quarter of the CPU time of `tracelens
# tables` on a 250 MB log). One arena that keeps freed pages 5 s reuses them instead: 13.6 -> 10.8-11.7
# CPU s for +50-120 MB of peak RSS (more arenas or longer decays cost up to +800 MB; benchmarks/README.md).
# Read by polars when it loads, so set before any import of it; a setting of the user's own wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0")

__version__ = "0.1.0"
