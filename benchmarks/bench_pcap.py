"""How fast, and in how much memory, tracelens decodes a large RoCE capture, side by side with tshark.

The workload is `tracelens.synth.pcap.write_bulk_roce`: about a million RoCEv2
frames over 8 QPs (SENDs snaplen-truncated to 128 bytes as a NIC sniffer
captures them, an ACK with AETH every 5th frame, a CNP now and then), written
to benchmarks/out/ (git-ignored) and deleted afterwards unless --keep.

Both tools run in a fresh process each, so their peak RSS (`ru_maxrss` from
`os.wait4`) is their own: tracelens runs `tracelens.ingest.pcap.ingest` (the
`packets` table, all columns); tshark runs `-T fields` extracting the same
fields (`-d udp.port==4791,infiniband` so every frame is dissected to the BTH
and AETH), its output discarded. tshark is skipped when not installed.

    python benchmarks/bench_pcap.py [--packets 1000000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"

TSHARK_FIELDS = (
    "frame.number", "frame.time_epoch", "frame.len", "ip.src", "ip.dst", "ip.dsfield.ecn", "ip.id",
    "udp.srcport", "udp.dstport", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
    "infiniband.bth.a", "infiniband.aeth.syndrome",  # tshark 4.0 has no FECN/BECN fields
    "infiniband.aeth.msn", "tcp.seq_raw", "tcp.ack_raw", "tcp.flags", "tcp.window_size_value", "tcp.len",
)

TRACELENS = """
import sys
from pathlib import Path
from tracelens.ingest import InputFile, pcap
path = Path(sys.argv[1])
result = pcap.ingest(InputFile(path, path.name, "pcap"))
assert not result.account.errors, result.account.errors
print(result.tables["packets"].height)
"""


def measure(argv: list[str]) -> tuple[float, int, str]:
    """Run `argv`; return wall seconds, the child's peak RSS in MiB, and its stdout's first line."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = child.stdout.readline().strip()
    for _ in child.stdout:  # drain (tshark prints a line per frame)
        pass
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if status:
        raise SystemExit(f"{argv[0]} failed with status {status}")
    return seconds, usage.ru_maxrss // 1024, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the capture in benchmarks/out/")
    args = parser.parse_args()

    OUT.mkdir(exist_ok=True)
    capture = OUT / f"roce-{args.packets}.pcap"
    if not capture.exists():
        # In a child process: Linux carries a process's peak RSS across fork+exec into the
        # children it measures, so this process must stay small (no scapy, no capture in memory).
        generate = "import sys, pathlib; from tracelens.synth.pcap import write_bulk_roce; write_bulk_roce(pathlib.Path(sys.argv[1]), int(sys.argv[2]))"
        subprocess.run([sys.executable, "-c", generate, str(capture), str(args.packets)], check=True)
    size_mb = capture.stat().st_size / 1e6

    rows = []
    seconds, rss, _ = measure([sys.executable, "-c", "import tracelens.ingest.pcap"])
    baseline = rss
    seconds, rss, decoded = measure([sys.executable, "-c", TRACELENS, str(capture)])
    assert int(decoded) == args.packets, decoded
    rows.append({"tool": "tracelens", "seconds": seconds, "packets_per_s": args.packets / seconds, "peak_rss_mb": rss})
    tshark = shutil.which("tshark")
    if tshark:
        fields = [arg for field in TSHARK_FIELDS for arg in ("-e", field)]
        argv = [tshark, "-n", "-r", str(capture), "-d", "udp.port==4791,infiniband", "-T", "fields", *fields]
        seconds, rss, _ = measure(argv)
        rows.append({"tool": "tshark -T fields", "seconds": seconds, "packets_per_s": args.packets / seconds,
                     "peak_rss_mb": rss})

    print(f"capture: {capture.name}, {args.packets} frames, {size_mb:.1f} MB")
    print(f"{'tool':<18}{'seconds':>9}{'packets/s':>13}{'peak RSS MB':>13}")
    for r in rows:
        print(f"{r['tool']:<18}{r['seconds']:>9.2f}{r['packets_per_s']:>13,.0f}{r['peak_rss_mb']:>13}")
    print(f"(a process that only imports tracelens.ingest.pcap peaks at {baseline} MB)")
    if len(rows) == 2:
        print(f"tracelens / tshark: {rows[0]['packets_per_s'] / rows[1]['packets_per_s']:.1f}x")
    print(json.dumps({"packets": args.packets, "size_mb": size_mb, "import_rss_mb": baseline, "runs": rows}))
    if not args.keep:
        capture.unlink()


if __name__ == "__main__":
    main()
