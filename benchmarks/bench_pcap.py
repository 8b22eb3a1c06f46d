"""How fast, and in how much memory, tracelens reads a large capture, side by side with tshark.

Workloads, written into --data (the system's temporary folder by default; deleted afterwards unless --keep):
- `--workload multiflow` (default): `synth.pcap.write_multiflow` (benchmarks/capture.py): a slice of
  trouble (lost RoCE packets, NAKs, an RNR NAK, CNPs, lost TCP segments), then `--qps` healthy RC QPs
  and `--tcp` TCP connections round-robin, snaplen 96; 10M records are about 1.1 GB;
- `--workload mix`: `synth.pcap.write_mix`, full frames as tcpdump writes them on a training node (snaplen
  262144): eight RoCEv2 QPs writing 4 KiB packets, with their ACKs, a NAK and go-back-N resend now and
  then, CNPs; two bulk TCP connections (merged segments of 1 to 4 x 8948 bytes, an ACK every second,
  fast retransmissions) and two of small messages; about 4.6 KB a frame, 1.4 GB for 300k frames;
- `--workload bulk`: `synth.pcap.write_bulk_roce`, RoCEv2 over 8 QPs, snaplen 128.

Each tool runs in a fresh process, so its peak RSS (`ru_maxrss` from `os.wait4`: the largest of the
process and the children it waited for, such as the ingest's record walker) is its own:
tracelens decodes with `tracelens.ingest.packets.pcap.ingest` (the `packets` table, every column, written to
Parquet bucket by bucket in a temporary folder, as in a run); `tracelens tables CAPTURE -o OUT` is the
whole command (ingest, alignment, every table written as Parquet, the packets with `ts_text`); tshark
runs `-T fields` extracting the same fields (`-d udp.port==4791,infiniband` so every frame is
dissected to the BTH and AETH), its output discarded (skipped when tshark is not installed, or with
--no-tshark); `tracelens analyze` is the whole run: ingest, timeline, the per-connection analysis,
every rule, the HTML and JSON report.

    python benchmarks/bench_pcap.py [--workload multiflow|mix|bulk] [--packets 10000000] [--qps 2000 --tcp 2000]
                                    [--no-tshark] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _measure import Child, import_rss_mb, load, python, run

TSHARK_FIELDS = (
    "frame.number",
    "frame.time_epoch",
    "frame.len",
    "ip.src",
    "ip.dst",
    "ip.dsfield.ecn",
    "ip.id",
    "udp.srcport",
    "udp.dstport",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.aeth.syndrome",  # tshark 4.0 has no FECN/BECN fields
    "infiniband.aeth.msn",
    "tcp.seq_raw",
    "tcp.ack_raw",
    "tcp.flags",
    "tcp.window_size_value",
    "tcp.len",
)

TRACELENS = """
import sys, tempfile
from pathlib import Path
import polars as pl
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
path = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as spill:  # as in a run: the rows go to Parquet as they are decoded
    result = pcap.ingest(InputFile(path, path.name, "pcap", size=path.stat().st_size, spill=Path(spill)))
    assert not result.account.errors, result.account.errors
    print(result.tables["packets"].select(pl.len()).collect().item())
"""


def tracelens_package() -> str:
    """The __init__.py of the tracelens the children run (found without importing it here)."""
    return run(python("-c", "import importlib.util; print(importlib.util.find_spec('tracelens').origin)")).last_line


def row(tool: str, child: Child, packets: int) -> dict:
    return {
        "tool": tool,
        "seconds": child.seconds,
        "cpu_seconds": child.cpu_s,
        "packets_per_s": packets / child.seconds,
        "packets_per_cpu_s": packets / max(child.cpu_s, 1e-9),
        "peak_rss_mb": round(child.rss_mb),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=10_000_000)
    parser.add_argument("--workload", choices=["multiflow", "mix", "bulk"], default="multiflow")
    parser.add_argument("--qps", type=int, default=2000)
    parser.add_argument("--tcp", type=int, default=2000)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tracelens-bench-pcap")
    parser.add_argument("--no-tshark", action="store_true")
    parser.add_argument("--no-analyze", action="store_true")
    parser.add_argument("--no-tables", action="store_true")
    parser.add_argument(
        "--keep", action="store_true", help="keep the capture (reused by the next run of the same size)"
    )
    args = parser.parse_args()

    folder = args.data / f"{args.workload}-{args.packets}"
    capture = folder / "capture.pcap"
    if not capture.exists():
        folder.mkdir(parents=True, exist_ok=True)
        # In a child process: Linux carries a process's peak RSS across fork+exec into the
        # children it measures, so this process must stay small (no scapy, no capture in memory).
        if args.workload == "multiflow":
            generate = (
                "import sys, pathlib; from synth.pcap import write_multiflow; "
                "write_multiflow(pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:]))"
            )
            subprocess.run(
                python("-c", generate, str(capture), str(args.packets), str(args.qps), str(args.tcp)), check=True
            )
        elif args.workload == "mix":
            generate = (
                "import sys, pathlib; from synth.pcap import write_mix; "
                "print(write_mix(pathlib.Path(sys.argv[1]), int(sys.argv[2])))"
            )
            subprocess.run(python("-c", generate, str(capture), str(args.packets)), check=True)
        else:
            generate = (
                "import sys, pathlib; from synth.pcap import write_bulk_roce; "
                "write_bulk_roce(pathlib.Path(sys.argv[1]), int(sys.argv[2]))"
            )
            subprocess.run(python("-c", generate, str(capture), str(args.packets)), check=True)
    size_mb = capture.stat().st_size / 1e6
    print(f"capture: {args.workload}, {args.packets:,} frames, {size_mb:.0f} MB; {load()}", flush=True)

    # the package's bytecode written first, as `pip install` leaves it: with PYTHONDONTWRITEBYTECODE set (or
    # a read-only checkout) every child would compile each module again, a start-up cost no install pays
    subprocess.run(python("-m", "compileall", "-q", str(Path(tracelens_package()).parent)), check=True)
    rows = []
    baseline = round(import_rss_mb("tracelens.ingest.packets.pcap"))
    ours = run(python("-c", TRACELENS, str(capture)), quiet=True)
    assert int(ours.last_line) == args.packets, ours.last_line
    rows.append(row("tracelens ingest", ours, args.packets))
    tracelens = str(Path(sys.executable).with_name("tracelens"))
    if not args.no_tables:
        out = folder.parent / f"{folder.name}-tables"
        shutil.rmtree(out, ignore_errors=True)
        rows.append(
            row("tracelens tables", run([tracelens, "tables", str(capture), "-o", str(out)], quiet=True), args.packets)
        )
        shutil.rmtree(out)
    tshark = shutil.which("tshark")
    if tshark and not args.no_tshark:
        fields = [arg for field in TSHARK_FIELDS for arg in ("-e", field)]
        argv = [tshark, "-n", "-r", str(capture), "-d", "udp.port==4791,infiniband", "-T", "fields", *fields]
        rows.append(row("tshark -T fields", run(argv, quiet=True), args.packets))
    if not args.no_analyze:
        out = folder.parent / f"{folder.name}-report"
        argv = [tracelens, "analyze", str(folder), "-o", f"{out}.html", "--json", f"{out}.json"]
        analyzed = run(argv, quiet=True)
        rows.append(row("tracelens analyze", analyzed, args.packets))
        found = sorted({f["rule_id"] for f in json.loads(Path(f"{out}.json").read_text())["findings"]})
        print(f"tracelens analyze found: {', '.join(found) or 'nothing'}")

    print(f"{'tool':<20}{'seconds':>9}{'CPU s':>8}{'packets/s':>13}{'per CPU s':>13}{'peak RSS MB':>13}")
    for r in rows:
        print(
            f"{r['tool']:<20}{r['seconds']:>9.2f}{r['cpu_seconds']:>8.1f}{r['packets_per_s']:>13,.0f}{r['packets_per_cpu_s']:>13,.0f}{r['peak_rss_mb']:>13}"
        )
    print(f"(a process that only imports tracelens.ingest.packets.pcap peaks at {baseline} MB; {load()})")
    shark = [r for r in rows if r["tool"].startswith("tshark")]
    for ours in (r for r in rows if shark and r["tool"] in ("tracelens ingest", "tracelens tables")):
        print(
            f"{ours['tool']} / tshark: {ours['packets_per_s'] / shark[0]['packets_per_s']:.1f}x wall, "
            f"{ours['packets_per_cpu_s'] / shark[0]['packets_per_cpu_s']:.1f}x per CPU second"
        )
    print(json.dumps({"packets": args.packets, "size_mb": size_mb, "import_rss_mb": baseline, "runs": rows}))
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
