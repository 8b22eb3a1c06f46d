"""Whole-process speed and peak RSS on run folders of many small per-rank logs.

Workloads (benchmarks/workloads.py `folder`, written under --data, by default the system's temporary
folder, deleted at the end unless --keep):
  ranks-4096   4,096 per-rank NCCL_DEBUG_FILE logs of a 512-node job, one folder per node, ~52 KB each
  small-5000   5,000 per-rank logs of init lines only, ~2.5 KB each

Each is measured as a user runs it, in a fresh process from launch to exit: `tracelens tables DIR -o
OUT` (discover, sniff, ingest, every table written as Parquet); peak RSS is the child's ru_maxrss.
`--src` runs another checkout's tracelens (its `src` folder first on PYTHONPATH) beside this one,
for a before/after in one sitting:

    git worktree add ../tl-before <commit>
    python benchmarks/bench_folder.py --src ../tl-before/src [--only small-5000] [--repeat 3] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _measure import load, python, repeated, run

HERE = Path(__file__).resolve().parent
WORKLOADS = {"ranks-4096": (4096, 211), "small-5000": (5000, 10)}  # name -> (files, MB)
# The command as its entry point runs it, process settings included; a checkout given with --src that
# has no entry point module is run through its cli.
CLI = """import sys
try:
    from tracelens.__main__ import main
except ImportError:
    from tracelens.cli import app as main
sys.argv[0] = 'tracelens'
main()"""


BASE_PATH = os.environ.get("PYTHONPATH", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tracelens-bench-folders")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--src", help="another checkout's src folder, measured as 'before'")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    print(f"tracelens tables on folders of small logs, fresh processes, {load()}, --jobs {args.jobs}")
    print(
        f"{'workload':<12}{'files':>7}{'MB':>6}{'tool':>9}{'s (min-max)':>16}{'CPU s':>8}{'files/s':>10}"
        f"{'peak RSS MB':>13}"
    )
    tools = {"before": args.src, "after": None} if args.src else {"this": None}
    for name in args.only.split(","):
        files, mb = WORKLOADS[name]
        data = args.data / name
        if not data.exists():
            run(python(str(HERE / "workloads.py"), "folder", str(data), "--files", str(files), "--mb", str(mb)))
        size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) / 2**20
        out = args.data / "out"
        for tool, src in tools.items():
            argv = python("-c", CLI, "tables", str(data), "-o", str(out), "--jobs", str(args.jobs))
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, BASE_PATH]))  # run() passes it on
            runs = repeated(argv, args.repeat, out)
            secs, rss = runs.seconds, runs.rss_mb
            print(
                f"{name:<12}{files:>7}{size:>6.0f}{tool:>9}{f'{secs[0]:.1f}-{secs[-1]:.1f}':>16}{runs.cpu_seconds[0]:>8.1f}"
                f"{files / secs[-1]:>10.0f}{f'{rss[0]:.0f}-{rss[-1]:.0f}':>13}   (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        shutil.rmtree(out, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(data)


if __name__ == "__main__":
    sys.exit(main())
