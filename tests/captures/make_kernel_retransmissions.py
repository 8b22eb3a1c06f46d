#!/usr/bin/env python3
"""Capture real Linux TCP retransmissions between two network namespaces on this machine.

    sudo python3 tests/captures/make_kernel_retransmissions.py [OUT_DIR]

Two namespaces joined by a veth pair (10.231.7.1 <-> 10.231.7.2, nothing leaves
the machine); nftables drops, duplicates or reorders a few TCP segments on the
way; several parallel connections (as NCCL's socket transport opens) push data
both ways in bursts while tcpdump records the veth of namespace B. Each
scenario writes one capture, `<scenario>.pcap`, headers only (snaplen 96):

- loss-seen: 2% of segments dropped at the receiving end, after the capture point,
  so every lost original is in the capture before its retransmission. One
  connection's reader stalls (zero window, window probes), one idles into
  kernel keep-alives.
- loss-unseen-reorder: 2% dropped before the capture point (the capture has
  holes, "previous segment not captured"), 5% sent through a slow queue
  (reordering), 1% dropped at the receiving end.
- duplicates: 1% of segments duplicated on the wire, 2% dropped at the receiving end.

netem would be the usual tool but is often not built into the kernel, so the
impairments use nftables (numgen random) and an htb queue only. The script checks
for root, ip, nft, tc, ethtool and tcpdump first and says what is missing (exit 2). It
always removes its namespaces.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PORT = 5001
ADDR_A, ADDR_B = "10.231.7.1", "10.231.7.2"
CONNECTIONS = 4
ROUNDS = 4
UPLOAD, DOWNLOAD = 96 * 1024, 64 * 1024  # bytes per round, client -> server and back
SNAPLEN = 96  # Ethernet + IPv4 + the largest TCP header
TOOLS = ("ip", "nft", "tc", "ethtool", "tcpdump")

# per scenario: nft rules in namespace A (output, egress of veth A) and B (ingress of veth B),
# each "<numgen modulus> <action>"; ingress of A drops segments flowing B -> A after the capture.
SCENARIOS = {
    "loss-seen": {"a_ingress": "50 drop", "b_ingress": "50 drop"},
    "loss-unseen-reorder": {"a_output": "50 drop", "a_reorder": "20", "b_ingress": "100 drop"},
    "duplicates": {"a_egress": "100 dup", "b_ingress": "50 drop"},
}


def missing_tools() -> list[str]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (network namespaces need CAP_NET_ADMIN)")
    return missing


def run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


class Namespaces:
    """Two namespaces a and b joined by veth va <-> vb; removed on exit."""

    def __init__(self) -> None:
        tag = f"tlrx{os.getpid()}"
        self.a, self.b = f"{tag}a", f"{tag}b"
        self.va, self.vb = f"{tag}va", f"{tag}vb"

    def __enter__(self) -> Namespaces:
        run("ip", "netns", "add", self.a)
        run("ip", "netns", "add", self.b)
        run("ip", "link", "add", self.va, "netns", self.a, "type", "veth", "peer", "name", self.vb, "netns", self.b)
        for ns, dev, addr in ((self.a, self.va, ADDR_A), (self.b, self.vb, ADDR_B)):
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            # wire-sized segments
            run("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off")
        return self

    def __exit__(self, *_: object) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def nft(self, ns: str, script: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True)

    def impair(self, scenario: dict[str, str]) -> None:
        segments = "meta l4proto tcp numgen random mod"
        if "a_reorder" in scenario:  # a share of segments waits in a slow htb class while the rest overtake it
            for cmd in (
                "qdisc add dev {d} root handle 1: htb default 10",
                "class add dev {d} parent 1: classid 1:10 htb rate 10gbit",
                "class add dev {d} parent 1: classid 1:20 htb rate 50mbit ceil 50mbit",
            ):
                run("ip", "netns", "exec", self.a, "tc", *cmd.format(d=self.va).split())
            rule = f"{segments} {scenario['a_reorder']} 0 meta priority set 1:20"
            self.nft(self.a, _table("tl_reorder", "inet", "output", rule))
        hooks = {  # scenario key -> namespace, nft family and hook, the device a `dup` sends out of
            "a_output": (self.a, "inet", "output", self.va),
            "a_ingress": (self.a, "netdev", f"ingress device {self.va}", self.va),
            "a_egress": (self.a, "netdev", f"egress device {self.va}", self.va),
            "b_ingress": (self.b, "netdev", f"ingress device {self.vb}", self.vb),
        }
        for key, (ns, family, hook, dev) in hooks.items():
            if key in scenario:
                self.nft(ns, _table(f"tl_{key}", family, hook, f"{segments} {_action(scenario[key], dev)}"))


def _table(name: str, family: str, hook: str, rule: str) -> str:
    """An nftables script: table `name` holding one chain on `hook` with one rule."""
    return f"table {family} {name} {{\n chain c {{\n  type filter hook {hook} priority 0\n  {rule}\n }}\n}}\n"


def _action(spec: str, dev: str) -> str:
    """'50 drop' -> '50 0 drop' (one segment in 50); '100 dup' duplicates one in 100 out of the same device."""
    modulus, action = spec.split()
    return f"{modulus} 0 " + ("drop" if action == "drop" else f"dup to {dev}")


# -- the traffic: run inside the namespaces as `python3 THIS serve|send` ----------------------------


def serve() -> None:
    """Answer CONNECTIONS data connections (per round: read UPLOAD bytes, send DOWNLOAD bytes) and
    hold one idle connection on PORT + 1 until the client closes it."""
    data = socket.create_server((ADDR_B, PORT), backlog=CONNECTIONS)
    idle = socket.create_server((ADDR_B, PORT + 1))
    print("listening", flush=True)
    threads = [threading.Thread(target=_answer, args=(data.accept()[0], i == 0)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    with idle.accept()[0] as conn:
        conn.recv(1)
    for thread in threads:
        thread.join()


def _answer(conn: socket.socket, stalls: bool) -> None:
    if stalls:  # a stalled reader: its small buffer fills, the window closes, the sender probes it
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with conn:
        for _ in range(ROUNDS):
            got = 0
            while got < UPLOAD:
                if stalls and got == 0:
                    time.sleep(0.4)
                got += len(conn.recv(65536))
            conn.sendall(bytes(DOWNLOAD))


def send() -> None:
    """Run ROUNDS upload/download rounds on CONNECTIONS parallel connections, beside an idle
    connection whose kernel sends keep-alives."""
    start = time.monotonic()
    threads = [threading.Thread(target=_rounds) for _ in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    idle = socket.create_connection((ADDR_B, PORT + 1))
    idle.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
    idle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    for thread in threads:
        thread.join()
    time.sleep(max(0.0, start + 3.5 - time.monotonic()))  # long enough for a few keep-alives
    idle.close()


def _rounds() -> None:
    with socket.create_connection((ADDR_B, PORT)) as conn:
        for _ in range(ROUNDS):
            conn.sendall(bytes(UPLOAD))
            got = 0
            while got < DOWNLOAD:
                got += len(conn.recv(65536))
            time.sleep(0.05)  # the "compute" between collectives


def capture(ns: Namespaces, name: str, scenario: dict[str, str], out: Path) -> Path:
    ns.impair(scenario)
    path = out / f"{name}.pcap"
    netns = ("ip", "netns", "exec")
    dump = subprocess.Popen(
        [*netns, ns.b, "tcpdump", "-i", ns.vb, "-s", str(SNAPLEN), "-U", "-w", str(path), "tcp"], stderr=subprocess.PIPE
    )
    server = subprocess.Popen([*netns, ns.b, sys.executable, __file__, "serve"], stdout=subprocess.PIPE)
    try:
        server.stdout.readline()  # "listening"
        time.sleep(1.0)  # tcpdump is up by now
        subprocess.run([*netns, ns.a, sys.executable, __file__, "send"], check=True, timeout=120)
        server.wait(timeout=30)
        time.sleep(0.5)
    finally:
        for proc in (server, dump):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
    return path


def main(argv: list[str]) -> int:
    if argv[1:2] == ["serve"]:
        serve()
        return 0
    if argv[1:2] == ["send"]:
        send()
        return 0
    missing = missing_tools()
    if missing:
        print("cannot capture, missing: " + ", ".join(missing), file=sys.stderr)
        return 2
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / "kernel_retransmissions"
    out.mkdir(parents=True, exist_ok=True)
    for name, scenario in SCENARIOS.items():
        with Namespaces() as ns:
            path = capture(ns, name, scenario, out)
        print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
