"""iperf-like TCP traffic for the lab's loss capture: `serve` drains connections, `send` opens
--streams connections to it and sends --megabytes on each at about --rate-mbit, in parallel.

Bounded in bytes and time, to an address inside the lab's own network namespaces only."""

from __future__ import annotations

import argparse
import socket
import threading
import time

CHUNK = 16 * 1024


def serve(host: str, port: int, streams: int) -> None:
    with socket.create_server((host, port)) as server:
        server.settimeout(120)
        threads = []
        for _ in range(streams):
            conn, _ = server.accept()
            thread = threading.Thread(target=drain, args=(conn,))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()


def drain(conn: socket.socket) -> None:
    conn.settimeout(120)
    with conn:
        while conn.recv(1 << 16):
            pass


def send(host: str, port: int, megabytes: float, rate_mbit: float) -> None:
    payload = b"\0" * CHUNK
    pause = CHUNK * 8 / (rate_mbit * 1e6)
    with socket.create_connection((host, port), timeout=120) as conn:
        for _ in range(int(megabytes * 1e6 / CHUNK)):
            conn.sendall(payload)
            time.sleep(pause)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["serve", "send"])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=5201)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--megabytes", type=float, default=2.5)
    parser.add_argument("--rate-mbit", type=float, default=1.0)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.host, args.port, args.streams)
        return
    threads = [
        threading.Thread(target=send, args=(args.host, args.port, args.megabytes, args.rate_mbit))
        for _ in range(args.streams)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
