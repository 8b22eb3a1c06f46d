"""How fast, and in how much memory, tracelens ingests a large NCCL log.

The workload is a synthetic DeepSpeed launcher stdout of a 64-node x 8-GPU job
(pdsh prefixes, hosts interleaved): every rank's NCCL init, then collective
traffic as NCCL_DEBUG_SUBSYS=COLL prints it (one line per rank and call) with a
rare IB completion-error burst. A large file (default 300 MB) and a tenth-size
one for quick runs are written in one pass and kept in benchmarks/out/ only with
--keep. Each measurement runs `tracelens.ingest.textlog.ingest` in a fresh
process, so its peak RSS is that of the ingest alone (plus the imports, shown
as the baseline).

    python benchmarks/bench_nccl_ingest.py [--size-mb 300] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from _measure import OUT, import_rss_mb, python, run

from synth import nccl
from synth.nccl import Host, IbError
from synth.runs import Run, Scenario

NODES, GPUS = 64, 8
# Collectives of a data-parallel step: operation, NCCL datatype (9 = bfloat16), element counts.
OPS = (("AllReduce", 9, (4_194_304, 33_554_432)), ("AllGather", 9, (1_048_576,)), ("ReduceScatter", 9, (8_388_608,)))
ERROR_EVERY = 500  # collective calls between two IB error bursts (each call is one line per rank: 512 lines)


def job() -> Run:
    hosts = tuple(
        Host(f"node{i:02d}", f"10.0.{i // 200}.{i % 200 + 1}", gpus=GPUS, hcas=tuple(f"mlx5_{k}" for k in range(4)))
        for i in range(1, NODES + 1)
    )
    return Run(Scenario(name="bench-64x8", description="", rules=(), hosts=hosts, layout="launcher"))


def traffic(run: Run) -> Iterator[str]:
    """Endless steady-state lines: each collective call logged by every rank, in shuffled order."""
    members = run.world.members
    rand = run.rand
    buffs = [f"0x7f{rand.hex(7)}000" for _ in members]
    streams = [f"0x{rand.hex(12)}" for _ in members]
    order = list(range(len(members)))
    calls = 0
    while True:
        op, dtype, counts = OPS[calls % len(OPS)]
        count = counts[calls % len(counts)]
        for i in range(len(order) - 1, 0, -1):
            j = rand.int(0, i)
            order[i], order[j] = order[j], order[i]
        for r in order:
            proc = members[r].proc
            line = nccl.collective(op, calls, buffs[r], count, dtype, members[r], len(members), streams[r])
            yield f"{proc.host.name}: {proc.info(line)}"
        calls += 1
        if calls % ERROR_EVERY == 0:
            yield from _error_burst(run, members[rand.int(0, len(members) - 1)].proc)


def _error_burst(run: Run, proc: nccl.Process) -> Iterator[str]:
    hca = proc.host.hcas[0]
    err = IbError(
        f"10.0.0.1<{run.rand.int(40_000, 60_000)}>",
        12,
        129,
        "Recv",
        run.gid(proc.host.name, hca),
        run.gid("node01", hca),
        hca,
    )
    for line in nccl.ib_completion_error(proc, err, run.time(0)):
        yield f"{proc.host.name}: {line}"


def write_workloads(big: Path, small: Path, big_bytes: int) -> None:
    """Write both files in one pass: the small one is the first tenth of the big one."""
    run = job()
    head = run.play()["node01/train.log"].encode()
    lines = traffic(run)
    written = 0
    OUT.mkdir(parents=True, exist_ok=True)
    with big.open("wb") as out_big, small.open("wb") as out_small:
        outputs = [out_big, out_small]
        block = head
        while written < big_bytes:
            if written >= big_bytes // 10 and len(outputs) == 2:
                outputs.pop().close()
            for out in outputs:
                out.write(block)
            written += len(block)
            block = ("\n".join(next(lines) for _ in range(5_000)) + "\n").encode()


def ingest_child(path: str) -> None:
    """Runs in the fresh process: ingest the file and report as JSON."""
    from tracelens.ingest import InputFile
    from tracelens.ingest.textlog import ingest

    file = Path(path)
    start = time.perf_counter()
    account = ingest(InputFile(file, file.name, "log", size=file.stat().st_size)).account
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {"seconds": seconds, "lines": account.lines, "parsed": account.parsed, "unrecognized": account.unrecognized}
        )
    )


def measure(path: Path) -> dict:
    """Ingest in a fresh process: its report plus its peak RSS."""
    child = run(python(__file__, "--child", str(path)))
    return {**child.report(), "rss_mb": child.rss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=300, help="size of the large workload (default 300)")
    parser.add_argument("--quick", action="store_true", help="measure only the tenth-size workload")
    parser.add_argument("--keep", action="store_true", help="keep the workloads in benchmarks/out/ for the next run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        ingest_child(args.child)
        return

    big = OUT / f"nccl-{NODES}x{GPUS}-{args.size_mb}mb.log"
    small = OUT / f"nccl-{NODES}x{GPUS}-{args.size_mb // 10}mb-of-{args.size_mb}.log"
    if not (big.exists() and small.exists()):
        start = time.perf_counter()
        write_workloads(big, small, args.size_mb << 20)
        print(f"generated {big.name} and {small.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)

    baseline = import_rss_mb("tracelens.ingest.textlog")
    print(f"\nNCCL log ingest (tracelens.ingest.textlog.ingest), one fresh process per file; {os.cpu_count()} CPUs")
    print(f"{'workload':<34}{'MB':>8}{'lines':>12}{'parsed':>12}{'s':>8}{'MB/s':>8}{'lines/s':>12}{'peak RSS MB':>13}")
    for path in [small] if args.quick else [small, big]:
        r = measure(path)
        mb = path.stat().st_size / 2**20
        print(
            f"{path.name:<34}{mb:>8.1f}{r['lines']:>12,}{r['parsed']:>12,}{r['seconds']:>8.2f}"
            f"{mb / r['seconds']:>8.1f}{r['lines'] / r['seconds']:>12,.0f}{r['rss_mb']:>13.0f}"
        )
    print(f"{'(python + imports only)':<34}{'':>60}{baseline:>13.0f}")
    if not args.keep:
        big.unlink()
        small.unlink()


if __name__ == "__main__":
    main()
