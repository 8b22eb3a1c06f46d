"""How fast, and in how much memory, tracelens ingests a large DeepSpeed training log.

The workload is the DeepSpeed launcher stdout of a 64-node x 8-GPU ZeRO-2 job as
`synth` writes it (pdsh `host: ` prefixes, all hosts interleaved): every
rank's NCCL init, the DeepSpeedEngine configuration echo, then `--steps` optimizer
steps with wall_clock_breakdown on, where every rank logs its micro and global timers
(`[Rank N] time (ms) | fwd_microstep: ...`) and rank 0 its optimizer timers, `step=`
and ThroughputTimer lines; steps 40% to 50% of the way run 3x slower in the gradient
all-reduce. 400 steps are about 80 MB, nearly all of it DeepSpeed lines. It is
generated in a child process, kept in benchmarks/out/ (git-ignored) and reused by the
next run with the same --steps only with --keep.

The file is ingested by `tracelens.ingest.textlog.ingest` (NCCL and DeepSpeed line
parsers in one pass) in a fresh process, so its peak RSS is that of the ingest alone
(plus the imports, shown as the baseline).

    python benchmarks/bench_deepspeed_ingest.py [--steps 400] [--keep]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _measure import OUT, import_rss_mb, load, python, run

NODES, GPUS = 64, 8


def generate(path: Path, steps: int) -> None:
    """Runs in a child process: write the launcher log of a `steps`-step job to `path`."""
    from synth.deepspeed import DeepSpeedTraining
    from synth.nccl import Host
    from synth.runs import Run, Scenario

    hosts = tuple(
        Host(f"node{i:02d}", f"10.0.{i // 200}.{i % 200 + 1}", gpus=GPUS, hcas=tuple(f"mlx5_{k}" for k in range(4)))
        for i in range(1, NODES + 1)
    )
    training = DeepSpeedTraining(steps=steps, every_rank=True, slow=(steps * 4 // 10, steps // 2, 3.0))
    scenario = Scenario(
        name=f"bench-ds-{NODES}x{GPUS}", description="", rules=(), hosts=hosts, layout="launcher", story=(training,)
    )
    log = Run(scenario).play()["node01/train.log"]
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(log, encoding="utf-8")


def ingest_child(path: Path) -> None:
    """Runs in the fresh process: ingest the log and report as JSON."""
    from tracelens.ingest import InputFile
    from tracelens.ingest.textlog import ingest

    start = time.perf_counter()
    result = ingest(InputFile(path, path.name, "log", size=path.stat().st_size))
    seconds = time.perf_counter() - start
    account = result.account
    tables = {name: frame.height for name, frame in sorted(result.tables.items())}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "lines": account.lines,
                "parsed": account.parsed,
                "unrecognized": account.unrecognized,
                "tables": tables,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps in the log (default 400, about 80 MB)")
    parser.add_argument("--keep", action="store_true", help="keep the log in benchmarks/out/ for the next run")
    parser.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args.generate, args.steps)
        return
    if args.child:
        ingest_child(args.child)
        return

    log = OUT / f"deepspeed-{NODES}x{GPUS}-{args.steps}steps.log"
    if not log.exists():
        generated = run(python(__file__, "--generate", str(log), "--steps", str(args.steps)))
        print(f"generated {log.name} in {generated.seconds:.1f} s", file=sys.stderr)

    title = f"DeepSpeed log ingest (tracelens.ingest.textlog.ingest) in a fresh process; {load()}"
    baseline = import_rss_mb("tracelens.ingest.textlog")
    child = run(python(__file__, "--child", str(log)))
    r = child.report()
    mb = log.stat().st_size / 2**20
    row = {
        "workload": log.name,
        "mb": mb,
        "lines": r["lines"],
        "parsed": r["parsed"],
        "seconds": r["seconds"],
        "mb_per_s": mb / r["seconds"],
        "lines_per_s": r["lines"] / r["seconds"],
        "peak_rss_mb": child.rss_mb,
        "import_rss_mb": baseline,
        "tables": r["tables"],
    }

    print(f"\n{title}")
    print(f"{'workload':<34}{'MB':>8}{'lines':>12}{'parsed':>12}{'s':>8}{'MB/s':>8}{'lines/s':>12}{'peak RSS MB':>13}")
    print(
        f"{log.name:<34}{mb:>8.1f}{r['lines']:>12,}{r['parsed']:>12,}{r['seconds']:>8.2f}"
        f"{row['mb_per_s']:>8.1f}{row['lines_per_s']:>12,.0f}{child.rss_mb:>13.0f}"
    )
    print(f"{'(python + imports only)':<34}{'':>60}{baseline:>13.0f}")
    print("rows: " + ", ".join(f"{name} {height:,}" for name, height in r["tables"].items()))
    print(json.dumps(row))
    if not args.keep:
        log.unlink()


if __name__ == "__main__":
    main()
