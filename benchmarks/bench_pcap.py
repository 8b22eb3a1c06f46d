"""How fast, and in how much memory, tracelens decodes a large RoCE capture, side by side with tshark.

The workload is `synth.pcap.write_bulk_roce`: about a million RoCEv2
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
import shutil
import subprocess

from _measure import OUT, Child, import_rss_mb, python, run

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


def row(tool: str, child: Child, packets: int) -> dict:
    return {"tool": tool, "seconds": child.seconds, "packets_per_s": packets / child.seconds, "peak_rss_mb": round(child.rss_mb)}


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
        generate = "import sys, pathlib; from synth.pcap import write_bulk_roce; write_bulk_roce(pathlib.Path(sys.argv[1]), int(sys.argv[2]))"
        subprocess.run(python("-c", generate, str(capture), str(args.packets)), check=True)
    size_mb = capture.stat().st_size / 1e6

    rows = []
    baseline = round(import_rss_mb("tracelens.ingest.pcap"))
    ours = run(python("-c", TRACELENS, str(capture)), quiet=True)
    assert int(ours.last_line) == args.packets, ours.last_line
    rows.append(row("tracelens", ours, args.packets))
    tshark = shutil.which("tshark")
    if tshark:
        fields = [arg for field in TSHARK_FIELDS for arg in ("-e", field)]
        argv = [tshark, "-n", "-r", str(capture), "-d", "udp.port==4791,infiniband", "-T", "fields", *fields]
        rows.append(row("tshark -T fields", run(argv, quiet=True), args.packets))

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
