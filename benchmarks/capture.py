"""A large multi-flow capture for bench_pcap.py: thousands of healthy RoCE QPs and TCP connections,
and a slice of trouble (synth's faulty RoCE and TCP conversations) in front of them.

    python benchmarks/capture.py big.pcap --packets 10000000 [--qps 2000] [--tcp 2000]
    python benchmarks/capture.py slice.pcap --packets 0        # the trouble slice alone

The slice is built with scapy by `synth.pcap` (lost RoCE packets answered by NAKs and resent, an RNR
NAK, ECN-CE marks with CNPs; a TCP stream with lost segments and fast retransmissions). Behind it,
written a million records at a time with numpy from one scapy-built frame per shape (RoCE SEND and
ACK, TCP data and ACK) whose addresses, ports, QPs, IP ids, PSNs and sequence numbers are patched per record:
`--qps` RC QPs (each requester its own host, SENDs with consecutive PSNs, every 8th ACKed) and
`--tcp` connections (1000-byte segments, every 2nd ACKed), round-robin, one record per microsecond,
snaplen 96 as a NIC sniffer writes them. A 10M-record capture is about 1.1 GB. Healthy flows find
nothing, so a capture of any size finds what its slice finds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from synth.pcap import write_multiflow  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--packets", type=int, default=10_000_000, help="records in all (the slice's included); 0: the slice alone"
    )
    parser.add_argument("--qps", type=int, default=2000)
    parser.add_argument("--tcp", type=int, default=2000)
    args = parser.parse_args()
    print(write_multiflow(args.out, args.packets, args.qps, args.tcp))


if __name__ == "__main__":
    main()
