"""The hosts: GPU utilisation per host (its lane over time is on the timeline), each host's
interfaces and MTUs (and its RDMA ports' active MTU), the kernel events that matter on each
host, and the benchmarks (nccl-tests, perftest) against the links' line rate."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.hostsignals import KIND_TEXT, incidents, largest_size, port_rates
from tracelens.tables import RunTables

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 45
TITLE = "Hosts: GPUs, interfaces, kernel events, benchmarks"
TEMPLATE = "sections/host.html.j2"

MAX_EVENTS = 40


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """None when the run has no host evidence at all."""
    tables = ctx.tables
    parts = {
        "gpus": _gpu_summary(tables["gpu_samples"]),
        "interfaces": _interfaces(tables),
        "events": _events(tables),
        "benchmarks": _benchmarks(tables),
    }
    return parts if any(parts.values()) else None


def _gpu_summary(samples: pl.DataFrame) -> list[dict]:
    if samples.height == 0:
        return []
    per = (
        samples.group_by("host")
        .agg(
            gpus=pl.col("gpu").n_unique(),
            samples=pl.len(),
            mean=pl.col("util_gpu").mean(),
            low=pl.col("util_gpu").min(),
            power=pl.col("power_w").mean(),
            throttle=pl.col("throttle").drop_nulls().unique().str.join(", "),
            source=pl.col("source").unique().sort().str.join(", "),
        )
        .sort("host", nulls_last=True)
    )
    return [
        {
            **r,
            "host": r["host"] or "?",
            "mean": "" if r["mean"] is None else f"{r['mean']:.0f}%",
            "low": "" if r["low"] is None else f"{r['low']:.0f}%",
            "power": "" if r["power"] is None else f"{r['power']:.0f} W",
        }
        for r in per.iter_rows(named=True)
    ]


def _interfaces(tables: RunTables) -> list[dict]:
    rows = (
        tables["interfaces"]
        .filter(pl.col("ifname") != "lo")
        .sort("ts", nulls_last=False, maintain_order=True)
        .group_by("host", "ifname", maintain_order=True)
        .agg(pl.all().last())
    )
    ports = (
        tables["ib_ports"]
        .filter(pl.col("active_mtu").is_not_null())
        .select("host", pl.format("{}:{}", "ca", "port").alias("rdma"), "active_mtu", "max_mtu", "link_layer")
    )
    mtus = sorted(set(rows["mtu"].drop_nulls().to_list()))
    out = [
        {
            "host": r["host"] or "?",
            "name": r["ifname"],
            "mtu": r["mtu"],
            "state": r["state"] or "",
            "kind": r["kind"] or r["link_type"] or "",
            "address": r["ipv4"] or "",
            "odd": len(mtus) > 1 and r["mtu"] == min(mtus),
        }
        for r in rows.sort("host", "ifname", nulls_last=True).iter_rows(named=True)
    ]
    out += [
        {
            "host": r["host"] or "?",
            "name": r["rdma"],
            "mtu": f"{r['active_mtu']} of {r['max_mtu']}",
            "state": "",
            "kind": r["link_layer"] or "RDMA",
            "address": "",
            "odd": r["max_mtu"] is not None and r["active_mtu"] < r["max_mtu"],
        }
        for r in ports.iter_rows(named=True)
    ]
    return out


def _events(tables: RunTables) -> list[dict]:
    rows = incidents(tables).sort("host", "ts", "line", nulls_last=True).head(MAX_EVENTS)
    return [
        {
            "host": r["host"] or "?",
            "time": f"{r['ts']:%Y-%m-%d %H:%M:%S}"
            if r["ts"]
            else (f"{r['uptime_s']:.1f} s after boot" if r["uptime_s"] else ""),
            "what": KIND_TEXT[r["kind"]],
            "where": r["netdev"] or r["device"] or "",
            "detail": r["detail"] or "",
            "text": r["message"],
            "file": f"{r['file']}:{r['line']}",
        }
        for r in rows.iter_rows(named=True)
    ]


def _benchmarks(tables: RunTables) -> list[dict]:
    rates = (
        port_rates(tables).group_by("host").agg(pl.col("rate_gbps").sum(), pl.col("rate_gbps").max().alias("port_gbps"))
    )
    out = []
    tests = tables["nccl_tests"].filter(pl.col("kind") == "row")
    averages = tables["nccl_tests"].filter(pl.col("kind") == "average")
    for (file, run_id), run in tests.group_by("file", "run", maintain_order=True):
        largest = largest_size(run)
        average = averages.filter(pl.col("file") == file, pl.col("run") == run_id)["busbw_gbs"]
        hosts = [h for h in (run["rank_hosts"].drop_nulls().first() or "").split(",") if h]
        link = rates.filter(pl.col("host").is_in(hosts))["rate_gbps"].min() if len(hosts) > 1 else None
        busbw = largest["busbw_gbs"].max()
        out.append(
            {
                "what": run["test"].drop_nulls().first() or "nccl-tests",
                "file": file,
                "size": f"{largest['size_bytes'][0]:,} B",
                "result": (
                    f"busbw {busbw:g} GB/s ({largest['placement'][0]}-of-place)"
                    if busbw is not None
                    else "no busbw read"
                )
                + (f"; Avg bus bandwidth {average[0]:g} GB/s" if average.len() else ""),
                "line": f"{link / 8:g} GB/s" if link else "",
                "share": f"{busbw / (link / 8):.0%}" if link and busbw is not None else "",
                "where": ", ".join(hosts),
            }
        )
    perf = tables["perftest"].filter(pl.col("bw_avg").is_not_null())
    for (file, _run), run in perf.group_by("file", "run", maintain_order=True):
        r = run.filter(pl.col("bytes") == run["bytes"].max()).row(0, named=True)
        gbps = r["bw_avg"] * (8 / 1000 if (r["bw_unit"] or "MB").startswith("MB") else 1.0)
        line = rates.filter(pl.col("host").eq_missing(r["host"]))["port_gbps"].max()
        out.append(
            {
                "what": r["test"],
                "file": file,
                "size": f"{r['bytes']:,} B",
                "result": f"{gbps:.1f} Gb/s",
                "line": f"{line:g} Gb/s" if line else "",
                "share": f"{gbps / line:.0%}" if line else "",
                "where": " ".join(v for v in (r["host"], r["device"]) if v),
            }
        )
    return out
