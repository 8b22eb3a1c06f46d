"""How fast, and in how much memory, tracelens analyses a folder of many fabric counter dumps.

The workload is what the collection script of `synth.runs.CounterDumps` leaves
on a 64-node cluster with 8 RoCE HCAs per node (`synth.fabric`, the sysfs
writer the scenario fixtures use): per node an `ibstat.txt`, and the PMA `counters/` and
mlx5 `hw_counters/` of every port (`grep "" .../counters/* .../hw_counters/*`) dumped
before the job, once a minute during it (`--minutes`, default 30) and after it. A few
ports misbehave in the middle third of the job so the rules have something to find: one
link takes symbol errors, drops and out-of-sequence NAKs, two ports see congestion
(ECN marks, CNPs, PortXmitWait). 64 nodes x 30 minutes are 2,112 files, 37 MB.
The folder is generated in a child process, kept in benchmarks/out/ (git-ignored) and
reused by the next run of the same shape only with --keep.

It goes through `tracelens.analyze.analyze` (discover, ingest every file, counter deltas,
timeline, every rule) in a fresh process, so its peak RSS is that of the analysis alone
(plus the imports, shown as the baseline).

    python benchmarks/bench_fabric.py [--nodes 64] [--hcas 8] [--minutes 30] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from _measure import OUT, import_rss_mb, load, python, run

FLAKY = {"SymbolErrorCounter": 45.0, "LinkErrorRecoveryCounter": 0.03, "PortRcvErrors": 8.0, "out_of_sequence": 8.0}
CONGESTED = {"np_ecn_marked_roce_packets": 4000.0, "np_cnp_sent": 900.0, "PortXmitWait": 2.0e6}


def generate(folder: Path, nodes: int, hcas: int, minutes: int) -> None:
    """Runs in a child process: write the dumps a `minutes`-long job leaves on `nodes` hosts."""
    from synth.fabric import FabricPort
    from synth.nccl import Host
    from synth.runs import CounterDumps, Run, Scenario

    names = [f"node{i:03d}" for i in range(1, nodes + 1)]
    faults = {(names[1], "mlx5_1"): FLAKY, (names[-1], "mlx5_3"): CONGESTED, (names[-2], "mlx5_3"): CONGESTED}
    ports = tuple(
        (
            name,
            tuple(
                FabricPort(f"mlx5_{k}", lid=0, link_layer="Ethernet", per_second=faults.get((name, f"mlx5_{k}"), {}))
                for k in range(hcas)
            ),
        )
        for name in names
    )
    job_s = minutes * 60.0
    run = Run(Scenario(name="bench-fabric", description="", rules=(), hosts=(Host(names[0], "10.0.0.1"),)))
    run.now = job_s
    run.spans["slow"] = (job_s / 3, 2 * job_s / 3)
    CounterDumps(ports, every_s=60.0, during="slow", tool="sysfs").play(run)
    for rel, text in run.files().items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def analyze_child(folder: Path) -> None:
    """Runs in the fresh process: analyse the folder and report as JSON."""
    from tracelens.analyze import analyze

    start = time.perf_counter()
    analysis = analyze(folder)
    seconds = time.perf_counter() - start
    inputs = analysis.tables["inputs"]
    print(json.dumps({
        "seconds": seconds, "files": inputs.height,
        "lines": int(inputs["lines"].sum()), "parsed": int(inputs["parsed"].sum()),
        "findings": sorted({f.rule_id for f in analysis.findings}),
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hcas", type=int, default=8, help="HCA ports per node (default 8)")
    parser.add_argument(
        "--minutes", type=int, default=30, help="job length: one dump per minute, plus before and after"
    )
    parser.add_argument("--keep", action="store_true", help="keep the folder in benchmarks/out/ for the next run")
    parser.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args.generate, args.nodes, args.hcas, args.minutes)
        return
    if args.child:
        analyze_child(args.child)
        return

    folder = OUT / f"fabric-{args.nodes}x{args.hcas}-{args.minutes}min"
    if not folder.exists():
        shape = ["--nodes", str(args.nodes), "--hcas", str(args.hcas), "--minutes", str(args.minutes)]
        generated = run(python(__file__, "--generate", str(folder), *shape))
        print(f"generated {folder.name}/ in {generated.seconds:.1f} s", file=sys.stderr)
    mb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20

    title = f"Counter dumps through tracelens.analyze.analyze in a fresh process; {load()}"
    baseline = import_rss_mb("tracelens.analyze")
    child = run(python(__file__, "--child", str(folder)))
    r = child.report()
    row = {
        "workload": folder.name,
        "files": r["files"],
        "mb": mb,
        "lines": r["lines"],
        "seconds": r["seconds"],
        "files_per_s": r["files"] / r["seconds"],
        "mb_per_s": mb / r["seconds"],
        "peak_rss_mb": child.rss_mb,
        "import_rss_mb": baseline,
        "findings": r["findings"],
    }

    print(f"\n{title}")
    print(f"{'workload':<26}{'files':>8}{'MB':>8}{'lines':>12}{'s':>8}{'files/s':>9}{'MB/s':>8}{'peak RSS MB':>13}")
    print(
        f"{folder.name:<26}{r['files']:>8,}{mb:>8.1f}{r['lines']:>12,}{r['seconds']:>8.2f}"
        f"{row['files_per_s']:>9.0f}{row['mb_per_s']:>8.1f}{child.rss_mb:>13.0f}"
    )
    print(f"{'(python + imports only)':<26}{'':>53}{baseline:>13.0f}")
    print(f"findings: {', '.join(r['findings']) or 'none'}")
    print(json.dumps(row))
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
