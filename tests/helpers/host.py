"""Hand-built host rows (GPU samples, interfaces, ports, kernel events, nccl-tests and perftest
results) for the TL6xx rules and the host report."""

from __future__ import annotations

from tests.helpers.steps import at, slow_span


def gpu(host: str, util_in: float, util_out: float = 93.0, gpus: int = 2) -> list[dict]:
    """A dmon loop every 5 s over the run: `util_in` inside the slow window, `util_out` outside."""
    begin, end = slow_span()
    rows = []
    for i in range(0, 480, 5):
        ts = at(i)
        for g in range(gpus):
            rows.append(
                {
                    "file": f"{host}/dmon.txt",
                    "line": i + g,
                    "host": host,
                    "ts": ts,
                    "ts_quality": "exact",
                    "zoned": True,
                    "gpu": g,
                    "util_gpu": util_in if begin <= ts <= end else util_out,
                    "source": "dmon",
                }
            )
    return rows


def iface(host: str, name: str, mtu: int, ip: str) -> dict:
    return {
        "file": f"{host}/ip-addr.txt",
        "line": 2,
        "host": host,
        "ifname": name,
        "mtu": mtu,
        "ipv4": ip,
        "source": "ip",
    }


def port(host: str, active: int, maximum: int = 4096, **extra) -> dict:
    return {
        "file": f"{host}/ibv_devinfo.txt",
        "line": 9,
        "host": host,
        "ca": "mlx5_0",
        "port": 1,
        "state": "Active",
        "active_mtu": active,
        "max_mtu": maximum,
        "link_layer": "Ethernet",
        "rate_gbps": 100.0,
        **extra,
    }


def kev(host: str, kind: str, seconds: float, **extra) -> dict:
    return {
        "file": f"{host}/dmesg.txt",
        "line": int(seconds),
        "host": host,
        "ts": at(seconds),
        "ts_quality": "exact",
        "zoned": True,
        "kind": kind,
        "message": f"{kind} message",
        **extra,
    }


def nccl_row(busbw: float, wrong: int = 0, size: int = 8589934592, hosts: str = "node01,node02") -> list[dict]:
    return [
        {
            "file": "nccl-tests.log",
            "line": 30 + i,
            "test": "all_reduce_perf",
            "kind": "row",
            "size_bytes": size,
            "placement": p,
            "busbw_gbs": busbw,
            "wrong": wrong,
            "nranks": 16,
            "rank_hosts": hosts,
            "run": 1,
        }
        for i, p in enumerate(("out", "in"))
    ]


def rates(gbps: float = 200.0, count: int = 8) -> list[dict]:
    return [
        {
            "file": f"{h}/ibstat.txt",
            "line": 1 + i,
            "host": h,
            "ca": f"mlx5_{i}",
            "port": 1,
            "state": "Active",
            "rate_gbps": gbps,
            "link_layer": "InfiniBand",
        }
        for h in ("node01", "node02")
        for i in range(count)
    ]


def perf(bw: float) -> list[dict]:
    return [
        {
            "file": "node01/ib_write_bw.txt",
            "line": 20,
            "host": "node01",
            "test": "RDMA_Write BW Test",
            "device": "mlx5_0",
            "bytes": 8388608,
            "bw_avg": bw,
            "bw_unit": "MB/sec",
            "run": 1,
        }
    ]
