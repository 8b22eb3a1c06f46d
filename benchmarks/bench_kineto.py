"""How fast tracelens reads a large PyTorch profiler trace, and its peak memory, beside Holistic Trace
Analysis's own load of the same trace.

    python benchmarks/bench_kineto.py                       # a 1 GB trace, one of 100 MB and one of 10 MB
    python benchmarks/bench_kineto.py --size-mb 300 --keep
    python benchmarks/bench_kineto.py --hta-mb 0            # without HTA
    python benchmarks/bench_kineto.py --steps 100 --hta-mb 1000   # 100 long steps a trace; HTA on each

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
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _measure import OUT, python, run

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--hta-mb", type=float, default=20, help="run HTA on the traces up to this size (0: never)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--steps", type=int, default=0, help="steps per trace (default: 40 operators a step)")
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
    for size in (args.size_mb / 100, args.size_mb / 10, args.size_mb):
        folder = OUT / (f"kineto-{size:g}mb" + (f"-{args.steps}steps" if args.steps else ""))
        trace = folder / "rank-0.pt.trace.json"
        if not trace.exists():
            folder.mkdir(parents=True, exist_ok=True)
            run(python(__file__, "--generate", str(trace), str(size), str(args.steps)))
        mb = trace.stat().st_size / 1e6
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
