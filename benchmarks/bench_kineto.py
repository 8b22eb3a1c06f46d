"""How fast tracelens reads a large PyTorch profiler trace, and its peak memory, beside Holistic Trace
Analysis's own load of the same trace.

    python benchmarks/bench_kineto.py                       # a 1 GB trace, one of 100 MB and one of 10 MB
    python benchmarks/bench_kineto.py --size-mb 300 --keep
    python benchmarks/bench_kineto.py --hta-mb 0            # without HTA
    python benchmarks/bench_kineto.py --steps 100 --hta-mb 1000   # 100 long steps a trace; HTA on each
    python benchmarks/bench_kineto.py --whole 5 --src OTHER/src    # the 1 GB trace's whole commands, 5 times

The workload is one rank's trace of a data-parallel job written by `synth/kineto.py` (Kineto's layout,
one event a line; 40 small operators a step, three and four deep, with their kernel launches, so that
most events are ones tracelens does not keep; or, with `--steps`, that many steps of as many operators
as the size takes, as a profiler schedule that records a few long steps writes them), `--size-mb`
large, and traces of the same job a tenth
and a hundredth of the size, in `benchmarks/out/` (git-ignored; deleted after the run unless `--keep`). Each
measurement runs in a fresh process: `kineto.ingest` alone, then `tracelens tables` on a folder with
the trace (the whole command: discover, ingest, timeline, Parquet out), and HTA's
`TraceAnalysis(trace_dir=...)` on the traces no larger than `--hta-mb`. Peak RSS is the child's
`ru_maxrss`.

With `--whole N`, only the `--size-mb` trace: the whole `tracelens tables` and `tracelens analyze`
(HTML and JSON) on its folder, N times each, one after the other (and beside them another checkout's,
`--src`), with the best and the median of each measure: on a shared machine the best wall time is the
one least slowed by others' work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _measure import OUT, Child, load, python, run

DETAIL = 40  # small operators per step


def generate(path: Path, size_mb: float, steps: int = 0) -> None:
    """A trace of about `size_mb`: DETAIL small operators a step and as many steps as that takes, or
    `steps` steps and as many operators in each as that takes."""
    from synth.kineto import Job, traces, write

    def step_bytes(detail: int) -> float:
        sample = Job(world=2, steps=20, detail=detail)
        return len(traces(sample)[0]) / sample.steps

    if steps:
        fixed, per_op = step_bytes(0), (step_bytes(DETAIL) - step_bytes(0)) / DETAIL
        job = Job(world=2, steps=steps, detail=max(1, int((size_mb * 1e6 / steps - fixed) / per_op)))
    else:
        job = Job(world=2, steps=max(2, int(size_mb * 1e6 / step_bytes(DETAIL))), detail=DETAIL)
    with path.open("w") as out:
        write(job, 0, out)
    print(json.dumps({"steps": job.steps}))


def ingest(path: Path) -> None:
    from tracelens.ingest import InputFile
    from tracelens.ingest.profiler import kineto

    result = kineto.ingest(InputFile(path, path.name, "kineto"))
    spans = result.tables["trace_spans"]
    print(json.dumps({"events": result.account.lines, "spans": spans.height, "errors": result.account.errors}))


def hta(folder: Path) -> None:
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    start = time.perf_counter()
    TraceAnalysis(trace_dir=str(folder))
    print(json.dumps({"load_s": time.perf_counter() - start}))


def imports() -> None:
    import tracelens.ingest.profiler.kineto  # noqa: F401

    print("{}")


def whole_commands(folder: Path, mb: float, times: int, src: str | None) -> None:
    """`tracelens tables` and `analyze` on `folder`, `times` times each, this checkout's and `src`'s in
    turn: a table of the best and the median wall time, CPU time and peak RSS of each."""
    commands = {
        "`tracelens tables`": lambda out: ["tables", str(folder), "-o", str(out)],
        "`tracelens analyze`": lambda out: ["analyze", str(folder), "-o", f"{out}/a.html", "--json", f"{out}/a.json"],
    }
    checkouts = {"this checkout": None, **({"--src": src} if src else {})}
    base_path = os.environ.get("PYTHONPATH", "")
    runs: dict[tuple[str, str], list[Child]] = {}
    print(f"# {load()}")
    for _ in range(times):
        for command, argv in commands.items():
            for checkout, path in checkouts.items():
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, base_path]))  # run() passes it on
                out = Path(tempfile.mkdtemp(prefix="tracelens-bench-"))
                try:
                    child = run([sys.executable, "-m", "tracelens.cli", *argv(out)], quiet=True)
                finally:
                    shutil.rmtree(out)
                runs.setdefault((command, checkout), []).append(child)
    print(f"# {load()}")
    header = ["command", "checkout", "runs", "wall s (best, median)", "MB/s (best, median)"]
    header += ["CPU s (best, median)", "MB per CPU s (median)", "peak RSS MiB (lowest, highest)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (command, checkout), children in runs.items():
        wall, cpu, rss = (sorted(getattr(c, k) for c in children) for k in ("seconds", "cpu_s", "rss_mb"))
        cells = [command, checkout, str(len(children)), f"{wall[0]:.2f}, {statistics.median(wall):.2f}"]
        middle = statistics.median(wall), statistics.median(cpu)
        cells += [f"{mb / wall[0]:.0f}, {mb / middle[0]:.0f}", f"{cpu[0]:.2f}, {middle[1]:.2f}"]
        cells += [f"{mb / middle[1]:.0f}", f"{rss[0]:,.0f}, {rss[-1]:,.0f}"]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--hta-mb", type=float, default=20, help="run HTA on the traces up to this size (0: never)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--steps", type=int, default=0, help="steps per trace (default: 40 operators a step)")
    parser.add_argument("--whole", type=int, default=0, metavar="N", help="the whole commands, N times each")
    parser.add_argument("--src", help="with --whole: another checkout's src folder, measured beside this one")
    parser.add_argument("--generate", nargs=3, metavar=("PATH", "MB", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--ingest", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--hta", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--imports", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate(Path(args.generate[0]), float(args.generate[1]), int(args.generate[2]))
    if args.ingest:
        return ingest(Path(args.ingest))
    if args.hta:
        return hta(Path(args.hta))
    if args.imports:
        return imports()

    rows = []
    for size in (args.size_mb,) if args.whole else (args.size_mb / 100, args.size_mb / 10, args.size_mb):
        folder = OUT / (f"kineto-{size:g}mb" + (f"-{args.steps}steps" if args.steps else ""))
        trace = folder / "rank-0.pt.trace.json"
        if not trace.exists():
            folder.mkdir(parents=True, exist_ok=True)
            run(python(__file__, "--generate", str(trace), str(size), str(args.steps)))
        mb = trace.stat().st_size / 1e6
        if args.whole:
            whole_commands(folder, mb, args.whole, args.src)
            if not args.keep:
                shutil.rmtree(folder)
            return
        alone = run(python(__file__, "--ingest", str(trace)))
        report = alone.report()
        out = Path(tempfile.mkdtemp())
        whole = run([sys.executable, "-m", "tracelens.cli", "tables", str(folder), "-o", str(out)], quiet=True)
        shutil.rmtree(out)
        peer = run(python(__file__, "--hta", str(folder)), quiet=True) if 0 < mb <= args.hta_mb else None
        rows.append((trace.name, mb, report, alone, whole, peer))
        if not args.keep:
            shutil.rmtree(folder)
    base = run(python(__file__, "--imports"))
    header = ["workload", "MB", "events", "spans kept", "ingest s", "CPU s", "MB/s", "MB per CPU s", "peak RSS MB"]
    header += ["`tables` s", "CPU s", "MB per CPU s", "peak RSS MB"]
    header += ["HTA load s", "HTA CPU s", "HTA MB per CPU s", "HTA peak RSS MB"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, mb, report, alone, whole, peer in rows:
        cells = [f"{name} ({mb:.0f} MB)", f"{mb:.1f}", f"{report['events']:,}", f"{report['spans']:,}"]
        cells += [f"{alone.seconds:.1f}", f"{alone.cpu_s:.1f}", f"{mb / alone.seconds:.0f}", f"{mb / alone.cpu_s:.0f}"]
        cells += [f"{alone.rss_mb:.0f}", f"{whole.seconds:.1f}", f"{whole.cpu_s:.1f}", f"{mb / whole.cpu_s:.0f}"]
        cells += [f"{whole.rss_mb:.0f}"]
        load = peer.report()["load_s"] if peer else None
        cells += (
            [f"{load:.1f}", f"{peer.cpu_s:.1f}", f"{mb / peer.cpu_s:.1f}", f"{peer.rss_mb:.0f}"]
            if peer and load
            else ["", "", "", ""]
        )
        print("| " + " | ".join(cells) + " |")
    print(f"| python + imports only | | | | {base.seconds:.1f} | {base.cpu_s:.1f} | | | {base.rss_mb:.0f} |" + " |" * 8)


if __name__ == "__main__":
    main()
