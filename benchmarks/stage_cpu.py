"""Where the CPU of `tracelens tables` goes: CPU seconds per stage and function, inclusive and self.

The whole pipeline of `tracelens tables INPUT -o OUT` (discover, ingest, alignment, every table written)
runs in this process with one polars thread and the line parsers called one after the other, so that
each function's CPU time (time.process_time around its calls) is its own, not another thread's:

    POLARS_MAX_THREADS=1 python benchmarks/stage_cpu.py INPUT OUT

The sum is about the CPU seconds of the threaded command (`bench_scale.py`), give or take the threads'
own overhead; `incl` counts a function's callees, `self` does not (among the functions listed).
"""

from __future__ import annotations

import collections
import functools
import importlib
import sys
import time
from concurrent.futures import Executor, Future
from pathlib import Path

STARTED = time.process_time()

from tracelens import analyze  # noqa: E402  (the import is measured)
from tracelens.ingest import textlog  # noqa: E402

IMPORTS = time.process_time() - STARTED

# module -> functions, and module:class -> methods, timed
FUNCTIONS = {
    "tracelens.analyze": ["ingest_run"],
    "tracelens.ingest.text.lines": ["read_span", "long_lines"],
    "tracelens.ingest.textlog": ["_account"],
    "tracelens.ingest.nccl.log": ["split_records", "match_vector"],
    "tracelens.ingest.deepspeed.log": ["split_envelope", "candidate_lines", "extract_hot", "_hot_ok"],
    "tracelens.ingest.deepspeed.assemble": ["spilled_steps"],
    "tracelens.timeline": ["align", "_clock_offsets"],
    "tracelens.inferred": ["inferred_log_times", "_place_file", "_joined_by_range"],
}
METHODS = {
    "tracelens.ingest.nccl.log:NcclParser": ["parse", "absorb", "_classify_rest", "_tables"],
    "tracelens.ingest.deepspeed.log:DeepSpeedParser": ["feed", "finish"],
    "tracelens.ingest.hangs.stacks:StackParser": ["feed"],
    "tracelens.ingest.host.nccl_tests:NcclTestsParser": ["feed"],
    "tracelens.tables:Spill": ["write"],
    "tracelens.tables:RunTables": ["write_parquet"],
}
INCLUSIVE: collections.Counter = collections.Counter()
SELF: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()
_open: list[float] = []  # the CPU time of the timed callees of each timed call under way


def timed(owner: object, name: str, label: str) -> None:
    """Replace `owner.name` with a wrapper that adds its CPU time to `label`."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.process_time()
        _open.append(0.0)
        try:
            return function(*args, **kwargs)
        finally:
            spent, callees = time.process_time() - start, _open.pop()
            INCLUSIVE[label] += spent
            SELF[label] += spent - callees
            CALLS[label] += 1
            if _open:
                _open[-1] += spent

    setattr(owner, name, wrapper)


class InOrder(Executor):
    """Runs each task at once, in the caller's thread: the parsers one after the other."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def main() -> None:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    textlog.ThreadPoolExecutor = InOrder  # type: ignore[misc,assignment]
    for module, names in FUNCTIONS.items():
        loaded = importlib.import_module(module)
        for name in names:
            timed(loaded, name, f"{module.rsplit('.', 1)[-1]}.{name}")
    for where, names in METHODS.items():
        module, cls = where.split(":")
        owner = getattr(importlib.import_module(module), cls)
        for name in names:
            timed(owner, name, f"{cls}.{name}")
    # the names other modules imported before the wrappers were made
    analyze.align = importlib.import_module("tracelens.timeline").align
    importlib.import_module("tracelens.timeline").inferred_log_times = importlib.import_module(
        "tracelens.inferred"
    ).inferred_log_times
    start = time.process_time()
    with analyze.aligned_run(source, jobs=1) as (tables, _, _):
        aligned = time.process_time()
        tables.write_parquet(out)
    end = time.process_time()
    print(
        f"imports {IMPORTS:.2f} CPU s, ingest and alignment {aligned - start:.2f}, tables written {end - aligned:.2f}"
    )
    print(f"{'incl':>7} {'self':>7} {'calls':>6}  function")
    for label, spent in INCLUSIVE.most_common():
        print(f"{spent:7.2f} {SELF[label]:7.2f} {CALLS[label]:6d}  {label}")


if __name__ == "__main__":
    main()
