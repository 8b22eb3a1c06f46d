"""How long tracelens takes on each whole-run fixture, end to end.

The workloads are the committed fixtures fixtures/scenario-* (written by `python -m
synth`): two RoCE nodes' NCCL and DeepSpeed logs, sysfs counter dumps and
captures, a few hundred KB each. Every fixture is measured in fresh processes, `--runs`
times (default 3), and the table gives the medians:

- analyze: `tracelens.analyze.analyze(folder)` (discover, ingest, timeline, rules), timed
  inside the process, then render: `tracelens.report.html.render` of that analysis; the
  peak RSS is that process's;
- CLI: the whole `tracelens analyze FOLDER -o report.html` command, wall clock from launch
  to exit (interpreter start and imports included), and its peak RSS.

    python benchmarks/bench_scenarios.py [--runs 3] [--fixtures fixtures]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _measure import import_rss_mb, load, python, run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def analyze_child(folder: Path) -> None:
    """Runs in the fresh process: analyse, then render the report, each timed; report as JSON."""
    from tracelens.analyze import analyze
    from tracelens.report.html import render

    start = time.perf_counter()
    analysis = analyze(folder)
    analyzed = time.perf_counter()
    html = render(analysis)
    rendered = time.perf_counter()
    print(
        json.dumps(
            {
                "analyze_s": analyzed - start,
                "render_s": rendered - analyzed,
                "html_bytes": len(html),
                "findings": [f.rule_id for f in analysis.findings],
            }
        )
    )


def measure(folder: Path, runs: int, cli: str, scratch: Path) -> dict:
    """Medians over `runs` fresh processes of analyze + render, and of the CLI."""
    inside = [run(python(__file__, "--child", str(folder))) for _ in range(runs)]
    reports = [child.report() for child in inside]
    command = [
        run([cli, "analyze", str(folder), "-o", str(scratch / f"{folder.name}.html")], quiet=True) for _ in range(runs)
    ]
    return {
        "fixture": folder.name,
        "size_kb": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1024,
        "analyze_s": statistics.median(r["analyze_s"] for r in reports),
        "render_s": statistics.median(r["render_s"] for r in reports),
        "rss_mb": statistics.median(child.rss_mb for child in inside),
        "cli_s": statistics.median(child.seconds for child in command),
        "cli_rss_mb": statistics.median(child.rss_mb for child in command),
        "findings": reports[0]["findings"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per measurement; the table gives medians")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="folder holding the scenario-* run folders")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        analyze_child(args.child)
        return

    cli = shutil.which("tracelens")
    if cli is None:
        raise SystemExit("no `tracelens` command on PATH: install tracelens (pip install -e .) in this environment")
    folders = sorted(p for p in args.fixtures.glob("scenario-*") if p.is_dir())
    title = f"Whole-run fixtures, median of {args.runs} fresh processes each; {load()}"
    baseline = import_rss_mb("tracelens.report.html")
    with tempfile.TemporaryDirectory(prefix="bench-scenarios-") as scratch:
        rows = [measure(folder, args.runs, cli, Path(scratch)) for folder in folders]

    print(f"\n{title}")
    print(
        f"{'fixture':<26}{'KB':>6}{'analyze s':>11}{'render s':>10}{'RSS MB':>8}{'CLI s':>8}{'CLI RSS MB':>12}  "
        "top finding"
    )
    for r in rows:
        print(
            f"{r['fixture']:<26}{r['size_kb']:>6.0f}{r['analyze_s']:>11.3f}{r['render_s']:>10.3f}{r['rss_mb']:>8.0f}"
            f"{r['cli_s']:>8.2f}{r['cli_rss_mb']:>12.0f}  {(r['findings'] or ['none'])[0]}"
        )
    print(f"{'(python + imports only)':<26}{'':>27}{baseline:>8.0f}")
    print(json.dumps({"runs": args.runs, "import_rss_mb": baseline, "fixtures": rows}))


if __name__ == "__main__":
    main()
