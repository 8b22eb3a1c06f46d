"""How fast tracelens reads the long host outputs: a day of `nvidia-smi --query-gpu ... -l 1`
on 8 GPUs (691,200 CSV rows, about 60 MB) and a kernel log of a million `dmesg -T` records
(mlx5, NVRM, PCIe AER and unrelated driver lines, about 100 MB).

Each file is written in a child process to benchmarks/out/ (git-ignored; deleted unless
--keep) and ingested by its format module in a fresh process, so the peak RSS is that of the
ingest alone (the last row is the import floor).

    python benchmarks/bench_host_ingest.py [--hours 24] [--records 1000000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _measure import OUT, import_rss_mb, python, run

KERNEL_BODIES = [
    "mlx5_core 0000:5e:00.1 ens1f1np1: Link down",
    "mlx5_core 0000:5e:00.1 ens1f1np1: Link up",
    "NETDEV WATCHDOG: ens1f1np1 (mlx5_core): transmit queue 3 timed out 5120 ms",
    "pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0",
    "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali{n:x}: link becomes ready",
    "perf: interrupt took too long ({n} > 2500), lowering kernel.perf_event_max_sample_rate to 79500",
    "nvidia-nvswitch{k}: open (major=510)",
    'audit: type=1400 audit({n}.123:{k}): apparmor="DENIED" operation="open" profile="snap"',
]


def generate(kind: str, path: Path, size: int) -> None:
    """Runs in a child: write the workload."""
    from datetime import datetime, timedelta

    start = datetime(2024, 12, 6, 0, 0, 0)
    with path.open("w") as out:
        if kind == "query_csv":
            out.write(
                "timestamp, index, utilization.gpu [%], utilization.memory [%],"
                " power.draw [W], temperature.gpu, clocks.current.sm [MHz]\n"
            )
            for s in range(size):
                stamp = (start + timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
                for gpu in range(8):
                    out.write(
                        f"{stamp}, {gpu}, {(s * 7 + gpu) % 100} %, {(s + gpu) % 40}"
                        f" %, {200 + (s % 300)}.{gpu}0 W, {55 + gpu}, 1980 MHz\n"
                    )
        else:
            for n in range(size):
                stamp = (start + timedelta(seconds=n // 10)).strftime("%a %b %e %H:%M:%S %Y")
                body = KERNEL_BODIES[n % len(KERNEL_BODIES)].format(n=n, k=n % 16)
                out.write(f"[{stamp}] {body}\n")


def measure(fmt: str, path: Path) -> None:
    """Runs in a fresh process: ingest `path` as `fmt` and print what was read."""
    import time

    from tracelens.ingest import InputFile, ingest_file

    t0 = time.perf_counter()
    result = ingest_file(InputFile(path=path, name=path.name, format=fmt, size=path.stat().st_size))
    seconds = time.perf_counter() - t0
    rows = sum(f.height for f in result.tables.values())
    print(
        json.dumps(
            {
                "lines": result.account.lines,
                "rows": rows,
                "unrecognized": result.account.unrecognized,
                "seconds": seconds,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate(args.generate[0], Path(args.generate[1]), int(args.generate[2]))
    if args.measure:
        return measure(args.measure[0], Path(args.measure[1]))
    OUT.mkdir(exist_ok=True)
    work = [
        ("query_csv", "nvidia_smi", OUT / "nvidia-smi-query-1day.csv", int(args.hours * 3600)),
        ("dmesg", "kernel_log", OUT / "dmesg-T-1M.txt", args.records),
    ]
    print("| workload | MB | lines | rows | unrecognized | ingest s | MB/s | process s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, fmt, path, size in work:
        if not path.exists():
            run(python(__file__, "--generate", kind, str(path), str(size)))
        child = run(python(__file__, "--measure", fmt, str(path)))
        rep = child.report()
        mb = path.stat().st_size / 1e6
        print(
            f"| {path.name} | {mb:.0f} | {rep['lines']:,} | {rep['rows']:,} | {rep['unrecognized']} | "
            f"{rep['seconds']:.2f} | {mb / rep['seconds']:.0f} | {child.seconds:.2f} | {child.rss_mb:.0f} |"
        )
        if not args.keep:
            path.unlink()
    print(f"| import tracelens only | | | | | | | | {import_rss_mb('tracelens.ingest'):.0f} |")


if __name__ == "__main__":
    sys.exit(main())
