"""Where `tracelens analyze` peaks: the process's RSS sampled per stage, rule and report section.

    python benchmarks/rss_stages.py RUN [-o report.html] [--json findings.json] [--every-ms 20]

Runs the whole analysis and the HTML report in this process while a thread reads /proc/self/statm
every few milliseconds (tracemalloc does not see polars' allocations). Each sample is charged to the
innermost stage running: ingest and a big DeepSpeed log's step assembly (`assemble._assembled` ...),
align and its steps (`inferred._place_group`, `timeline._zone` ...),
settle, a derived result of the RunContext (`ctx.slow_windows` ...), a table read into memory
(`table.nccl_comms`), a rule (`TL401`), a report section (`report.steps`) and the render. A spike
shorter than a sample is seen only in the closing ru_maxrss. Prints, per stage, the RSS when it first
began and its peak, in the order the stages first ran, and the CPU seconds spent inside it (stages it
ran included: a table read by a rule counts in both), then the process's CPU seconds and peak RSS
(ru_maxrss).
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
_stack: list[str] = ["(outside a stage)"]
_peaks: dict[str, list[float]] = {}  # stage -> [RSS at its start, peak]
_cpu: dict[str, float] = {}  # stage -> CPU seconds inside it (all threads, stages inside it included)


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE / 2**20


def _sample(every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        now, stage = rss_mb(), _stack[-1]
        got = _peaks.setdefault(stage, [now, now])
        got[1] = max(got[1], now)


def _staged(name: str, func):
    @functools.wraps(func)
    def inner(*args, **kwargs):
        label = name(args) if callable(name) else name
        now = rss_mb()
        _peaks.setdefault(label, [now, now])
        _stack.append(label)
        began = time.process_time()
        try:
            return func(*args, **kwargs)
        finally:
            _cpu[label] = _cpu.get(label, 0.0) + time.process_time() - began
            _stack.pop()

    return inner


def _instrument() -> None:
    import tracelens.analyze as pipeline
    from tracelens import derived, rules
    from tracelens.report import html
    from tracelens.report import sections as report_sections
    from tracelens.tables import RunTables

    pipeline.ingest_run = _staged("ingest", pipeline.ingest_run)
    pipeline.align = _staged("align", pipeline.align)
    from tracelens import inferred, timeline
    from tracelens.ingest.deepspeed import assemble

    for module, names in (
        (timeline, ["inferred_log_times", "_zone", "_log_span", "_clock_offsets"]),
        (inferred, ["_files", "_lines", "_run_median", "_forward", "_placed", "_place_file", "_place_group"]),
        (inferred, ["_times_for", "_joined_by_range"]),
        (assemble, ["spilled_steps", "_stream_facts", "_pieces", "_assembled", "_with_text", "_rejoined"]),
    ):
        for name in names:
            setattr(module, name, _staged(f"{module.__name__.split('.')[-1]}.{name}", getattr(module, name)))
    RunTables.settled = _staged("settle", RunTables.settled)
    RunTables.__getitem__ = _staged(lambda args: f"table.{args[1]}", RunTables.__getitem__)
    rules.Rule.run = _staged(lambda args: args[0].id, rules.Rule.run)
    for name, value in list(vars(derived.RunContext).items()):
        if isinstance(value, functools.cached_property):
            value.func = _staged(f"ctx.{name}", value.func)
    html.render = _staged("render", html.render)
    build = report_sections.build_sections

    def sections(analysis):
        import importlib
        import pkgutil

        for info in pkgutil.iter_modules(report_sections.__path__):
            module = importlib.import_module(f"{report_sections.__name__}.{info.name}")
            if not getattr(module.context, "_staged", False):
                module.context = _staged(f"report.{info.name}", module.context)
                module.context._staged = True
        return build(analysis)

    report_sections.build_sections = sections
    html.build_sections = sections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=Path("/dev/null"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--every-ms", type=float, default=20.0)
    args = parser.parse_args()
    _instrument()
    import json

    from tracelens.analyze import analyze
    from tracelens.report.html import write
    from tracelens.report.summary import to_json

    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(args.every_ms / 1000, stop), daemon=True)
    sampler.start()
    began = time.perf_counter()
    analysis = _staged("analyze", analyze)(args.run)
    _staged("report", write)(analysis, args.output)
    if args.json:
        args.json.write_text(json.dumps(to_json(analysis), indent=2, default=str), encoding="utf-8")
    stop.set()
    sampler.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{'stage':<28} {'RSS at start MB':>16} {'peak MB':>10} {'CPU s':>8}")
    for stage, (first, peak) in _peaks.items():
        print(f"{stage:<28} {first:>16,.0f} {peak:>10,.0f} {_cpu.get(stage, 0.0):>8.1f}")
    print(
        f"wall {time.perf_counter() - began:.1f} s, CPU {usage.ru_utime + usage.ru_stime:.1f} s, "
        f"peak RSS (ru_maxrss) {usage.ru_maxrss / 1024:,.0f} MB"
    )


if __name__ == "__main__":
    main()
