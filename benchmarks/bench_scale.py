"""Whole-process speed and peak RSS on logs whose bodies vary per line, beside a plain polars line read.

Workloads (benchmarks/workloads.py, written under --data, deleted at the end unless --keep):
  nccl-250mb / nccl-1gb / nccl-5gb   a 1,024-rank job's launcher stdout: per-rank init lines, COLL lines, training lines
  deepspeed             a DeepSpeed/Megatron-heavy log of the same job (every rank's timers each step)
  deepspeed-one-stream  the same lines all on one host and rank: one stream of 3.2M step records
  folder-4096           4,096 per-rank NCCL_DEBUG_FILE logs, one folder per node
  glued-250mb           the nccl log with every 20th line glued onto an unfinished WARN, or free text

Each is measured as a user runs it, in a fresh process from launch to exit (interpreter start and
imports included): `tracelens tables INPUT -o OUT` (discover, ingest, every table written as
Parquet), and as the references the same input read as lines by polars alone (`pl.read_csv` with
no separator: 1 line = 1 row), and read so with one regex with capture groups run over every line
(the envelope, ENVELOPE): about the least a reader that takes something out of every line pays. Peak RSS is
each child's ru_maxrss (os.wait4).

    python benchmarks/bench_scale.py [--data DIR] [--only nccl-1gb,deepspeed] [--repeat 3] [--keep]
    python benchmarks/bench_scale.py --src OTHER/src ...   # another checkout beside this one

MB/CPU s is the size over the best run's CPU seconds (user + system of the child and its threads): on a
shared machine the steadier number; `load` is the 1-minute load average when the tool's runs started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _measure import load, python, run

HERE = Path(__file__).resolve().parent
WORKLOADS = {  # name -> (workloads.py arguments, size in MB)
    "nccl-250mb": ("nccl", 250),  # quick with `--slice-rounds` (analyze runs twice: the log and its slice)
    "nccl-1gb": ("nccl", 1000),
    "nccl-5gb": ("nccl", 5000),
    "deepspeed": ("deepspeed", 1000),
    "deepspeed-one-stream": ("deepspeed-one-stream", 1000),
    "folder-4096": ("folder", 400),
    "glued-250mb": ("glued", 250),
}
POLARS_LINES = (
    "import sys, pathlib, polars as pl\n"
    "paths = [p for p in pathlib.Path(sys.argv[1]).rglob('*') if p.is_file()] if pathlib.Path(sys.argv[1]).is_dir()"
    " else [pathlib.Path(sys.argv[1])]\n"
    "lines = (pl.read_csv(p, has_header=False, separator='\\x00', quote_char=None, schema={'text': pl.String}) "
    "for p in paths)\n"
)
# The envelope every line of these logs has, NCCL's head or DeepSpeed's logger stamp, as one regex with groups
ENVELOPE = (
    r"^(?:(?P<tag>[^ :]+): )?(?:(?P<host>[^ :]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>[A-Z]+) "
    r"|\[(?P<stamp>[^\]]+)\] \[(?P<ds_level>[A-Z]+)\] )"
)
POLARS_READS = {  # the references: what polars alone costs to read the lines, and to run one extract over them
    "polars line read": POLARS_LINES + "print(sum(frame.height for frame in lines))",
    "polars + one extract": POLARS_LINES
    + f"print(sum(frame.select(pl.col('text').str.extract_groups({ENVELOPE!r}).struct.field('level')"
    ".is_not_null().sum()).item() for frame in lines))",
}


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def same_findings(tracelens: str, log: Path, folder: Path, rounds: int) -> str:
    """`tracelens analyze` on the whole log and on a slice of its first `rounds` rounds (every round
    holds the same events: a communicator's init on all ranks, collectives, training steps): the
    findings (rule and severity) must be the same. Whole-process time and peak RSS of both."""
    from workloads import ROUND_LINES  # the slice must end at a round's end

    piece = folder / f"slice-{rounds}.log"
    with log.open("rb") as src, piece.open("wb") as out:
        for _ in range(rounds * ROUND_LINES):
            out.write(src.readline())
    found, lines = {}, []
    for path in (log, piece):
        report = folder / f"{path.stem}.json"
        child = run(
            [tracelens, "analyze", str(path), "-o", str(folder / f"{path.stem}.html"), "--json", str(report)],
            quiet=True,
        )
        findings = json.loads(report.read_text())["findings"]
        found[path] = sorted((f["rule_id"], f["severity"]) for f in findings)
        lines.append(
            f"  analyze {path.name}: {size_of(path) / 2**20:.0f} MB, {child.seconds:.1f} s, {child.cpu_s:.1f} CPU s, "
            f"peak RSS {child.rss_mb:.0f} MB, findings {[f[0] for f in found[path]]}"
        )
    piece.unlink()
    verdict = "same findings" if found[log] == found[piece] else f"DIFFERENT findings: {found[log]} vs {found[piece]}"
    return "\n".join([*lines, f"  {verdict} on the whole log and its first {rounds} rounds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tracelens-bench")
    parser.add_argument("--only", default="nccl-1gb,nccl-5gb,deepspeed,deepspeed-one-stream,folder-4096")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--src", help="another checkout's src folder, measured as 'tables (before)' beside this one")
    parser.add_argument(
        "--slice-rounds",
        type=int,
        default=0,
        help="also analyse the log and its first N rounds, and compare the findings",
    )
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    tracelens = str(Path(sys.executable).with_name("tracelens"))
    print(f"tracelens tables vs a polars line read, fresh processes, {load()}, --jobs {args.jobs}")
    print(
        f"{'workload':<22}{'MB':>8}{'tool':>22}{'s (min-max)':>18}{'MB/s':>14}{'CPU s':>14}{'MB/CPU s':>10}"
        f"{'peak RSS MB':>16}{'load':>7}"
    )
    base_path = os.environ.get("PYTHONPATH", "")
    for name in args.only.split(","):
        what, mb = WORKLOADS[name]
        data = args.data / (name if what == "folder" else f"{name}.log")
        if not data.exists():
            run(python(str(HERE / "workloads.py"), what, str(data), "--mb", str(mb)))
        size = size_of(data) / 2**20
        out = args.data / "out"
        tables = [tracelens, "tables", str(data), "-o", str(out), "--jobs", str(args.jobs)]
        tools = {"tables (before)": (tables, args.src)} if args.src else {}
        tools |= {"tracelens tables": (tables, None)}
        tools |= {tool: (python("-c", code, str(data)), None) for tool, code in POLARS_READS.items()}
        for tool, (argv, src) in tools.items():
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, base_path]))  # run() passes it on
            at_start = os.getloadavg()[0]
            children = []
            for _ in range(args.repeat):
                shutil.rmtree(out, ignore_errors=True)
                children.append(run(argv, quiet=True))
            secs = sorted(c.seconds for c in children)
            cpu = sorted(c.cpu_s for c in children)
            rss = sorted(c.rss_mb for c in children)
            print(
                f"{name:<22}{size:>8.0f}{tool:>22}{f'{secs[0]:.1f}-{secs[-1]:.1f}':>18}"
                f"{f'{size / secs[-1]:.0f}-{size / secs[0]:.0f}':>14}{f'{cpu[0]:.1f}-{cpu[-1]:.1f}':>14}"
                f"{size / cpu[0]:>10.0f}{f'{rss[0]:.0f}-{rss[-1]:.0f}':>16}{at_start:>7.1f}",
                flush=True,
            )
        if args.slice_rounds and what == "nccl":
            print(same_findings(tracelens, data, args.data, args.slice_rounds), flush=True)
        shutil.rmtree(args.data / "out", ignore_errors=True)
        if not args.keep:
            shutil.rmtree(data) if data.is_dir() else data.unlink()


if __name__ == "__main__":
    main()
