"""Where the CPU of `tracelens tables` goes: CPU seconds per stage and function, inclusive and self.

The whole pipeline of `tracelens tables INPUT -o OUT` (discover, ingest, alignment, every table written)
runs in this process with one polars thread and the line parsers called one after the other, so that
each function's CPU time (time.process_time around its calls) is its own, not another thread's:

    POLARS_MAX_THREADS=1 python benchmarks/stage_cpu.py INPUT OUT
    POLARS_MAX_THREADS=1 python benchmarks/stage_cpu.py --analyze INPUT OUT   # `tracelens analyze`: rules, report

With `--analyze` it runs what `tracelens analyze INPUT -o OUT/report.html --json OUT/findings.json`
runs instead (the tables written to the run's working folder, the derived results, every rule, the
HTML and JSON), with each rule's CPU (`rule TLnnn`: with the derived results it was the first to ask for).

The sum is about the CPU seconds of the threaded command (`bench_scale.py`), give or take the threads'
own overhead; `incl` counts a function's callees, `self` does not (among the functions listed).
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path

STARTED = time.process_time()

from tracelens import analyze  # noqa: E402  (the import is measured)
from tracelens.ingest import textlog  # noqa: E402

IMPORTS = time.process_time() - STARTED

# module -> functions, and module:class -> methods, timed
FUNCTIONS = {
    "tracelens.ingest.text.lines": ["read_span", "_frame", "long_lines"],
    "tracelens.ingest.textlog": ["_account"],
    "tracelens.ingest.nccl.log": ["split_records", "_nccl_records", "_with_head", "match_vector"],
    "tracelens.ingest.text.glued": ["line_starts"],
    "tracelens.ingest.deepspeed.log": ["split_envelope", "candidate_lines", "extract_hot", "_hot_ok"],
    "tracelens.ingest.deepspeed.assemble": ["spilled_steps"],
    "tracelens.timeline": ["align", "_clock_offsets", "_zone"],
    "tracelens.analyze": ["ingest_run", "run_rules"],
    "tracelens.report.html": ["render"],
    "tracelens.inferred": ["inferred_log_times", "_place_file", "_joined_by_range"],
    "tracelens.ingest.profiler.kineto": [
        "_event_arrays",
        "_parsed",
        "span_rows",
        "_steps",
        "_cpu_spans",
        "_with_depth",
        "_collectives",
        "_gpu_spans",
        "_in_steps",
    ],
    "tracelens.derived.traces": ["breakdown", "arrivals", "host_waits", "step_levels"],
}
METHODS = {
    "tracelens.ingest.nccl.log:NcclParser": ["parse", "absorb", "_classify_rest", "_join_continuations", "_tables"],
    "tracelens.ingest.deepspeed.log:DeepSpeedParser": ["feed", "finish"],
    "tracelens.ingest.hangs.stacks:StackParser": ["feed"],
    "tracelens.ingest.host.nccl_tests:NcclTestsParser": ["feed"],
    "tracelens.tables:Spill": ["write"],
    "tracelens.tables:RunTables": ["write_parquet", "settled"],
    "tracelens.ingest.profiler.kineto:Trace": ["keep"],
}
INCLUSIVE: collections.Counter = collections.Counter()
SELF: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()
_open: list[float] = []  # the CPU time of the timed callees of each timed call under way


def timed(owner: object, name: str, label: str | Callable[[object], str]) -> None:
    """Replace `owner.name` with a wrapper that adds its CPU time to `label` (or to the label of its
    first argument: a method's object)."""
    function = getattr(owner, name)

    def call(called: str, step: Callable, *args, **kwargs):
        start = time.process_time()
        _open.append(0.0)
        try:
            return step(*args, **kwargs)
        finally:
            spent, callees = time.process_time() - start, _open.pop()
            INCLUSIVE[called] += spent
            SELF[called] += spent - callees
            CALLS[called] += 1
            if _open:
                _open[-1] += spent

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return call(label if isinstance(label, str) else label(args[0]), function, *args, **kwargs)

    @functools.wraps(function)
    def generator(*args, **kwargs):  # each item's CPU time, as it is asked for
        items = function(*args, **kwargs)
        while (item := call(label, next, items, None)) is not None:  # type: ignore[arg-type]
            yield item

    setattr(owner, name, generator if inspect.isgeneratorfunction(function) else wrapper)


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
    whole = sys.argv[1] == "--analyze"
    source, out = (Path(a) for a in sys.argv[1 + whole : 3 + whole])
    textlog.ThreadPoolExecutor = InOrder  # type: ignore[misc,assignment]
    kineto = importlib.import_module("tracelens.ingest.profiler.kineto")
    kineto.ThreadPoolExecutor = InOrder  # the trace's chunks parsed one after the other
    for module, names in FUNCTIONS.items():
        loaded = importlib.import_module(module)
        for name in names:
            timed(loaded, name, f"{module.rsplit('.', 1)[-1]}.{name}")
    for where, names in METHODS.items():
        module, cls = where.split(":")
        owner = getattr(importlib.import_module(module), cls)
        for name in names:
            timed(owner, name, f"{cls}.{name}")
    timed(importlib.import_module("tracelens.rules").Rule, "run", lambda rule: f"rule {rule.id}")
    # the names other modules imported before the wrappers were made
    analyze.align = importlib.import_module("tracelens.timeline").align
    importlib.import_module("tracelens.timeline").inferred_log_times = importlib.import_module(
        "tracelens.inferred"
    ).inferred_log_times
    start = time.process_time()
    if whole:
        from tracelens.report import html

        out.mkdir(parents=True, exist_ok=True)
        with analyze.analyze(source, jobs=1) as analysis:
            analysed = time.process_time()
            html.write(analysis, out / "report.html")
            (out / "findings.json").write_text(json.dumps([f.to_json() for f in analysis.findings]))
        end = time.process_time()
        print(f"imports {IMPORTS:.2f} CPU s, analyze {analysed - start:.2f}, report {end - analysed:.2f}")
    else:
        with analyze.aligned_run(source, jobs=1) as (tables, _, _):
            aligned = time.process_time()
            tables.write_parquet(out)
        end = time.process_time()
        print(f"imports {IMPORTS:.2f} CPU s, ingest and alignment {aligned - start:.2f}, written {end - aligned:.2f}")
    print(f"total {IMPORTS + end - start:.2f} CPU s")
    print(f"{'incl':>7} {'self':>7} {'calls':>6}  function")
    for label, spent in INCLUSIVE.most_common():
        print(f"{spent:7.2f} {SELF[label]:7.2f} {CALLS[label]:6d}  {label}")


if __name__ == "__main__":
    main()
