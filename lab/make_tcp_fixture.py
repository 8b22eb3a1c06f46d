"""Write fixtures/lab-tcp-loss from tcp_loss.sh's work folder: the capture gzipped, tshark's
counts per connection in the README and expected.json (marked real)."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path


def tshark_rows(capture: Path) -> list[list[str]]:
    fields = ["tcp.stream", "tcp.len", "tcp.analysis.retransmission", "tcp.analysis.fast_retransmission"]
    out = subprocess.run(
        [
            "tshark",
            "-n",
            "-r",
            str(capture),
            "-Y",
            "tcp.len > 0",
            "-T",
            "fields",
            *sum((["-e", f] for f in fields), []),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("work", "fixture", "start", "stop", "loss-permille"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    work, fixture = Path(args.work), Path(args.fixture)
    rows = tshark_rows(work / "capture.pcap")
    segments = Counter(r[0] for r in rows)
    retx = Counter(r[0] for r in rows if r[2])
    fast = Counter(r[0] for r in rows if r[3])
    streams = sorted(segments, key=int)
    if fixture.exists():
        shutil.rmtree(fixture)
    fixture.mkdir(parents=True)
    with (
        open(work / "capture.pcap", "rb") as raw,
        gzip.open(fixture / "capture.pcap.gz", "wb", compresslevel=9) as packed,
    ):
        shutil.copyfileobj(raw, packed)
    total, lost = sum(segments.values()), sum(retx.values())
    pct = float(args.loss_permille) / 10
    expected = {
        "real": True,
        "synthetic": False,
        "scenario": "tcp-loss",
        "description": f"four TCP connections 10.99.0.1 -> 10.99.0.2 across a link dropping {pct}% of packets each way",
        "cause": "link",
        "rule": "TL304",
        "min_severity": "warning",
        "window": [args.start.replace("Z", "+00:00"), args.stop.replace("Z", "+00:00")],
        "hosts": ["10.99.0.1", "10.99.0.2"],
        "tshark": {
            "data_segments": total,
            "retransmissions": lost,
            "fast_retransmissions": sum(fast.values()),
            "per_connection": {s: {"data_segments": segments[s], "retransmissions": retx[s]} for s in streams},
        },
        "made": args.start[:10],
    }
    (fixture / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    (fixture / "README.md").write_text(
        "\n".join(
            [
                "# lab-tcp-loss: a real capture (not synthetic)",
                "",
                (
                    f"Made on {args.start[:10]} by `lab/run.sh tcp-loss` "
                    "(lab/tcp_loss.sh). Two network namespaces joined by a veth"
                ),
                (
                    "pair (10.99.0.1 and 10.99.0.2), offloads off on both ends "
                    "(`ethtool -K ... tso off gso off gro off`: the"
                ),
                (
                    "sender's veth cuts TCP's GSO packets into MSS-sized "
                    "segments, so each packet is one segment as on a physical"
                ),
                (
                    "NIC). nftables on the receiver 10.99.0.2 drops packets "
                    "at random both ways: chains on hooks input and output,"
                ),
                (
                    f"rule `numgen random mod 1000 < {args.loss_permille} drop` "
                    f"({pct}%). lab/tcp_streams.py opens four TCP connections"
                ),
                "from 10.99.0.1 to 10.99.0.2:5201 and sends 2.5 MB on each at about 1 Mbit/s (iperf-like, bounded).",
                "tcpdump -s 96 recorded the link at the sender, 10.99.0.1.",
                "",
                (
                    f"**Injected:** {pct}% packet loss for the whole capture, "
                    f"from {args.start} to {args.stop} (the senders' span)."
                ),
                "",
                "The machine (2 CPUs) was shared with other people's test runs while this ran.",
                "",
                "## tshark's counts (`tcp.len > 0`; `tcp.analysis.retransmission`, `tcp.analysis.fast_retransmission`)",
                "",
                "| connection (tcp.stream) | data segments | retransmissions | fast retransmissions |",
                "|---|---|---|---|",
                *(f"| {s} | {segments[s]} | {retx[s]} | {fast[s]} |" for s in streams),
                f"| all | {total} | {lost} ({100 * lost / total:.2f}%) | {sum(fast.values())} |",
                "",
            ]
        )
    )


if __name__ == "__main__":
    main()
