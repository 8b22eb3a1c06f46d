"""The data contract between ingest and rules: one Arrow schema per kind of fact.

Every row carries provenance (`file`, `line` or `frame`, `host`) and a time
(`ts`, UTC, nullable) with `ts_quality` saying how the time was obtained:
"exact" (printed on the line), "inferred" (from neighbouring lines) or "none".
Counter and port dumps (ib_counters, ib_ports) are timed per dump: "exact" (a
timestamp line inside the file, e.g. `date` output, applies to the block after
it), "filename" (a time in the file name) or "mtime" (the file's modification
time, the weakest: copies and archive extraction change it).

`ts_text` is the time as the input printed it, verbatim: the slice of the line the parser read
the time from (`[2026-03-02 11:05:07.123456]`'s inside, `2019-08-07 02:13:45,967`, `Tue Jan 13
05:10:23 2026` ...), zone, separators and precision as printed, so nothing the time model does
(zone, clock offsets) loses what the log said. It is null where nothing printed the row's time
(`ts_quality` "inferred", "mtime" or "none"). Where the time was printed but not on the row's own
line (a dump's `date` line, nvidia-smi's table header), is no text (a capture's frame times) or
was read by a reader that does not keep the slice, `tracelens tables` writes the time as read,
formatted `%Y-%m-%d %H:%M:%S%.f` (UTC for captures and zoned dumps); PyTorch's yearless c10 time
is its `clock`.
Ingest modules build polars frames; `conform` casts them to these schemas so
every file's rows concatenate, and `RunTables` holds the concatenation.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TypeAlias

import polars as pl
import pyarrow as pa

TS = pa.timestamp("ns", tz="UTC")

PROVENANCE = [
    pa.field("file", pa.string()),
    pa.field("line", pa.int64()),
    pa.field("host", pa.string()),
    pa.field("ts", TS),
    pa.field("ts_quality", pa.string()),
    pa.field("ts_text", pa.string()),  # the time as printed, verbatim (null: none printed); see the module doc
]
PROVENANCE_COLUMNS = [f.name for f in PROVENANCE]  # where and when each row was read: every table starts with them


# The bracket of a row's time (tracelens.timeline): equal to `ts` for exact times, the
# neighbouring timestamped lines for inferred ones; null where a side is unknown.
TIME_BRACKET = [pa.field("ts_lo", TS), pa.field("ts_hi", TS)]


def _schema(*fields: pa.Field, provenance: list[pa.Field] = PROVENANCE) -> pa.Schema:
    return pa.schema([*provenance, *fields, *TIME_BRACKET])


SCHEMAS: dict[str, pa.Schema] = {
    # One row per NCCL or ProcessGroupNCCL line.
    "nccl_events": _schema(
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("cuda_dev", pa.int32()),
        pa.field("level", pa.string()),  # INFO, WARN, TRACE, CALL, ABORT, VERSION, ERROR (PyTorch)
        pa.field("kind", pa.string()),  # message kind from grammars/nccl.lark; "unknown" if none
        pa.field("prefix", pa.string()),  # launcher/wrapper text before the record
        pa.field("message", pa.string()),
        pa.field("clock", pa.string()),  # PyTorch c10 time without a year (`1206 18:41:33`); the timeline dates it
    ),
    # One row per communicator member (Init START/COMPLETE, Destroy/Abort).
    "nccl_comms": _schema(
        pa.field("pid", pa.int64()),
        pa.field("comm_id", pa.string()),  # the comm pointer, e.g. 0x7f6df005a260
        pa.field("comm_hash", pa.string()),  # commId 0x... (2.16+), shared by all members
        pa.field("rank", pa.int64()),
        pa.field("nranks", pa.int64()),
        pa.field("cuda_dev", pa.int32()),
        pa.field("nvml_dev", pa.int32()),
        pa.field("bus_id", pa.string()),
        pa.field("event", pa.string()),  # init_start, init_complete, destroy, abort, rank_info
        pa.field("nccl_version", pa.string()),
    ),
    # One row per channel connection line (`Channel 00/0 : 0[0] -> 1[1] via ...`).
    "nccl_channels": _schema(
        pa.field("pid", pa.int64()),
        pa.field("comm_id", pa.string()),
        pa.field("channel", pa.int32()),
        pa.field("conn", pa.int32()),
        pa.field("src_rank", pa.int64()),
        pa.field("dst_rank", pa.int64()),
        pa.field("src_dev", pa.string()),  # busId (2.5-2.17) or nvmlDev (2.18+) as printed
        pa.field("dst_dev", pa.string()),
        pa.field("direction", pa.string()),  # send, receive, or null for P2P/SHM
        pa.field("transport", pa.string()),  # P2P/IPC, P2P/CUMEM, P2P/direct, SHM, NET, COLLNET ...
        pa.field("net", pa.string()),  # NET plugin: IB, Socket, IBext, Libfabric ... (NET/COLLNET only)
        pa.field("nic", pa.int32()),
        pa.field("proxy_rank", pa.int64()),  # PXN proxy rank, NET/IB/0(3)
        pa.field("gdr", pa.bool_()),
        pa.field("via", pa.string()),  # the full `via ...` token
    ),
    # Network selection facts per process: one row per network, device or interface named.
    "nccl_net": _schema(
        pa.field("pid", pa.int64()),
        # network, ib_device, socket_if, bootstrap_if, oob_if, ib_missing, gdr_disabled, gdr_enabled, plugin
        pa.field("what", pa.string()),
        pa.field("name", pa.string()),  # network name (IB, Socket), device (mlx5_0) or interface (eth0)
        pa.field("port", pa.int32()),
        pa.field("link_layer", pa.string()),  # IB / RoCE for devices
        pa.field("address", pa.string()),  # IP address for interfaces
    ),
    # One row per echoed setting (`NCCL_IB_DISABLE set by environment to 1.`).
    "nccl_env": _schema(
        pa.field("pid", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("value", pa.string()),
    ),
    # One row per WARN or PyTorch watchdog/NCCL error.
    "nccl_errors": _schema(
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("kind", pa.string()),  # ib_completion, watchdog_timeout, socket, bootstrap, proxy, ...
        pa.field("status", pa.int32()),  # IB work-completion status (12 = retry exceeded)
        pa.field("status_name", pa.string()),
        pa.field("opcode", pa.int64()),
        pa.field("vendor_err", pa.int64()),
        pa.field("peer", pa.string()),  # peer ip<port> or host
        pa.field("rank", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("op_type", pa.string()),
        pa.field("timeout_ms", pa.int64()),
        pa.field("ran_ms", pa.int64()),
        pa.field("message", pa.string()),
        # IB async event: port error, CQ error, local access violation work queue error ...
        pa.field("async_event", pa.string()),
    ),
    # One row per training step report (DeepSpeed / Megatron).
    "steps": _schema(
        pa.field("rank", pa.int64()),
        pa.field("engine", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("skipped", pa.int64()),
        pa.field("lr", pa.float64()),
        pa.field("samples_per_sec", pa.float64()),
        pa.field("fwd_ms", pa.float64()),
        pa.field("bwd_ms", pa.float64()),
        pa.field("bwd_allreduce_ms", pa.float64()),
        pa.field("step_ms", pa.float64()),  # DeepSpeed's `step` timer: the optimizer step
        # ThroughputTimer's running average; samples_per_sec is the last step's
        pa.field("avg_samples_per_sec", pa.float64()),
        pa.field("epoch", pa.int64()),
        pa.field("micro_step", pa.int64()),
        pa.field("iter_ms", pa.float64()),  # wall time of the whole iteration (Megatron, pipeline engine)
        pa.field("bwd_inner_ms", pa.float64()),  # autograd only; bwd = bwd_inner + bwd_allreduce
        pa.field("optimizer_allgather_ms", pa.float64()),  # ZeRO-1/2 timers
        pa.field("optimizer_gradients_ms", pa.float64()),
        pa.field("optimizer_step_ms", pa.float64()),
        pa.field("message", pa.string()),  # text of the line the step's timing comes from
    ),
    # One row per comms-logger record.
    "comm_ops": _schema(
        pa.field("rank", pa.int64()),
        pa.field("op", pa.string()),
        pa.field("msg_bytes", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("total_ms", pa.float64()),
        pa.field("avg_ms", pa.float64()),
        pa.field("algbw_gbps", pa.float64()),
        pa.field("busbw_gbps", pa.float64()),
        pa.field("kind", pa.string()),  # op (one verbose line), summary or straggler (log_summary tables)
        pa.field("caller", pa.string()),  # `[Caller Func: ...]` with comms_logger debug
        pa.field("straggler_total_ms", pa.float64()),  # time waiting for the slowest rank (straggler table)
        pa.field("straggler_avg_ms", pa.float64()),
    ),
    # One row per setting a DeepSpeed job printed or read: ds_config.json keys, the engine's configuration
    # echo (per engine), its version, and the launcher's arguments and the settings it exported (NCCL_* ...).
    "deepspeed_settings": _schema(
        pa.field("engine", pa.string()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("source", pa.string()),
    ),
    # One row per counter in one dump.
    "ib_counters": _schema(
        pa.field("dump_ts", TS),
        pa.field("node", pa.string()),  # lid / guid / device name
        pa.field("port", pa.int32()),
        pa.field("counter", pa.string()),
        pa.field("value", pa.uint64()),
        # perfquery, perfquery_x, perfquery_detail, ethtool, hw_counters, sysfs_counters
        pa.field("source", pa.string()),
        pa.field("ca", pa.string()),  # RDMA device (mlx5_0) when known; ethtool dumps name a netdev in `node` instead
        pa.field("lid", pa.int32()),  # perfquery's `Lid N`: joins ib_ports.lid to find the CA
        pa.field("bits", pa.int8()),  # counter width in this dump: a value of 2**bits - 1 is saturated
    ),
    # One row per HCA port.
    "ib_ports": _schema(
        pa.field("ca", pa.string()),
        pa.field("port", pa.int32()),
        pa.field("state", pa.string()),
        pa.field("phys_state", pa.string()),
        pa.field("rate_gbps", pa.float64()),
        pa.field("width", pa.string()),
        pa.field("link_layer", pa.string()),
        pa.field("active_mtu", pa.int32()),
        pa.field("max_mtu", pa.int32()),
        pa.field("lid", pa.int32()),  # base lid (IB); 0 on RoCE
        pa.field("node_guid", pa.string()),
        pa.field("ca_type", pa.string()),  # MT4129, or ibv_devinfo's vendor_part_id
        pa.field("source", pa.string()),  # ibstat, ibstatus, ibv_devinfo, rdma_link
        pa.field("netdev", pa.string()),  # the port's network interface (rdma link show), RoCE
    ),
    # One row per captured frame.
    "packets": pa.schema(
        [
            pa.field("file", pa.string()),
            pa.field("frame", pa.int64()),
            pa.field("host", pa.string()),
            pa.field("ts", TS),
            pa.field("ts_quality", pa.string()),
            pa.field("src", pa.string()),
            pa.field("dst", pa.string()),
            pa.field("proto", pa.string()),
            pa.field("sport", pa.int32()),
            pa.field("dport", pa.int32()),
            pa.field("length", pa.int32()),
            pa.field("ecn", pa.int8()),
            pa.field("opcode", pa.int16()),
            pa.field("dest_qp", pa.int64()),
            pa.field("psn", pa.int64()),
            pa.field("ack_req", pa.bool_()),
            pa.field("syndrome", pa.int16()),
            pa.field("seq", pa.int64()),
            pa.field("ack", pa.int64()),
            pa.field("flags", pa.int16()),
            pa.field("payload", pa.int32()),
            # Appended for flow analysis (tracelens.derived.flows):
            pa.field("ip_id", pa.int32()),  # IPv4 identification: same id and bytes = a capture duplicate
            pa.field("window", pa.int32()),  # TCP window as sent (unscaled); 0 = zero window
            pa.field("sack_left", pa.int64()),  # first TCP SACK block (a D-SACK, if any, comes first)
            pa.field("sack_right", pa.int64()),
            pa.field("fecn", pa.bool_()),  # BTH forward / backward congestion notification
            pa.field("becn", pa.bool_()),
            pa.field("msn", pa.int64()),  # AETH message sequence number
            pa.field("digest", pa.int64()),  # hash of the first 32 transport bytes (header, checksum, payload start)
            pa.field("bucket", pa.int32()),  # which share of the capture's host pairs (read a share at a time)
        ]
    ),
    # One row per PyTorch Flight Recorder entry (tracelens.ingest.hangs.flight_recorder and fr_text):
    # a collective or p2p op a rank enqueued; `ts` is its time_created_ns.
    "fr_entries": _schema(
        pa.field("rank", pa.int64()),  # the dump's rank (its file name), or the rank column of analyzer text
        pa.field("record_id", pa.int64()),
        pa.field("pg_id", pa.int64()),
        pa.field("pg_name", pa.string()),
        pa.field("pg_desc", pa.string()),  # default_pg, undefined, or the group's description
        pa.field("collective_seq_id", pa.int64()),  # `seq_id` before format 2.0
        pa.field("p2p_seq_id", pa.int64()),
        pa.field("op_id", pa.int64()),
        pa.field("profiling_name", pa.string()),  # nccl:all_reduce, gloo:send 0->1 ...
        pa.field("backend", pa.string()),  # nccl, gloo ... (the profiling name's prefix)
        pa.field("op", pa.string()),  # all_reduce, send ...
        pa.field("is_p2p", pa.bool_()),
        pa.field("state", pa.string()),  # as written: scheduled, started, completed
        pa.field("status", pa.string()),  # what happened: state, corrected by `retired` and pg_status
        pa.field("retired", pa.bool_()),
        pa.field("input_sizes", pa.string()),  # JSON text, e.g. [[1024,8]]
        pa.field("output_sizes", pa.string()),
        pa.field("input_dtypes", pa.string()),
        pa.field("output_dtypes", pa.string()),
        pa.field("time_created_ns", pa.int64()),
        pa.field("time_discovered_started_ns", pa.int64()),
        pa.field("time_discovered_completed_ns", pa.int64()),
        pa.field("duration_ms", pa.float64()),
        pa.field("timeout_ms", pa.int64()),
        pa.field("thread_name", pa.string()),
        pa.field("thread_id", pa.string()),
        pa.field(
            "frames",
            pa.list_(
                pa.struct(
                    [pa.field("name", pa.string()), pa.field("filename", pa.string()), pa.field("line", pa.int64())]
                )
            ),
        ),  # innermost first
        pa.field("version", pa.string()),  # the dump's format version (2.10 ...)
        pa.field("encoding", pa.string()),  # pickle, json, dict text, analyzer text
    ),
    # One row per rank and process group in a Flight Recorder dump (pg_config, pg_status).
    "fr_groups": _schema(
        pa.field("rank", pa.int64()),
        pa.field("pg_id", pa.int64()),
        pa.field("pg_name", pa.string()),
        pa.field("pg_desc", pa.string()),
        pa.field("ranks", pa.list_(pa.int64())),  # the group's global ranks (pg_config), null when not written
        pa.field("last_enqueued", pa.int64()),  # pg_status: last collective seq id enqueued / started / completed
        pa.field("last_started", pa.int64()),
        pa.field("last_completed", pa.int64()),
        pa.field("version", pa.string()),
        pa.field("comm_lib_version", pa.string()),
    ),
    # One row per thread of a stack dump (py-spy dump, ray stack, faulthandler, traceback).
    "stacks": _schema(
        pa.field("rank", pa.int64()),  # from the file name or a rank tag, when known
        pa.field("pid", pa.int64()),
        pa.field("process", pa.string()),  # py-spy's `Process N: <command>` or ray's ps line
        pa.field("thread_id", pa.string()),  # as printed (decimal or 0x...)
        pa.field("thread_name", pa.string()),
        pa.field("thread_state", pa.string()),  # idle, active, active+gil (py-spy); null otherwise
        pa.field("tool", pa.string()),  # py-spy, ray stack, faulthandler, traceback, abort (C++ terminate)
        pa.field(
            "frames",
            pa.list_(
                pa.struct(
                    [
                        pa.field("name", pa.string()),
                        pa.field("filename", pa.string()),
                        pa.field("line", pa.int64()),
                        pa.field("native", pa.bool_()),
                    ]
                )
            ),
        ),  # innermost first
        pa.field("exception", pa.string()),  # the `Error: message` line after a traceback; an abort's type and what()
    ),
    # Host evidence (tracelens.ingest.host.nvsmi, kernel, iface, nccl_tests, perftest). `zoned` says
    # the printed time carried a zone (already UTC); otherwise it is local wall time, as in logs.
    # One row per GPU sample: nvidia-smi --query-gpu CSV, dmon, dcgmi dmon, the nvidia-smi table.
    "gpu_samples": _schema(
        pa.field("zoned", pa.bool_()),
        pa.field("gpu", pa.int32()),  # index as printed (dmon's Idx, the table's GPU column)
        pa.field("bus_id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("util_gpu", pa.float64()),  # % of time a kernel ran (GPU-Util, utilization.gpu, dmon sm)
        pa.field("util_mem", pa.float64()),  # % of time memory was read or written
        pa.field("power_w", pa.float64()),
        pa.field("power_cap_w", pa.float64()),
        pa.field("temp_c", pa.float64()),
        pa.field("mem_used_mib", pa.float64()),
        pa.field("mem_total_mib", pa.float64()),
        pa.field("sm_clock_mhz", pa.float64()),
        pa.field("mem_clock_mhz", pa.float64()),
        pa.field("pstate", pa.string()),
        pa.field("throttle", pa.string()),  # active clock-throttle reasons, comma-joined, when printed
        pa.field("xid", pa.int64()),  # the last Xid error, when printed
        pa.field("source", pa.string()),  # query_csv, dmon, dcgmi, table
    ),
    # One row per kernel log record: dmesg (raw, -T, --time-format iso, /dev/kmsg), journalctl -k, syslog.
    "kernel_events": _schema(
        pa.field("zoned", pa.bool_()),
        pa.field("uptime_s", pa.float64()),  # seconds since boot, when the record prints them
        # link_down, link_up, tx_timeout, pcie_aer, xid, oom_kill, soft_lockup, hung_task, nic_event, other
        pa.field("kind", pa.string()),
        pa.field("subsystem", pa.string()),  # driver or tag: mlx5_core, NVRM, pcieport, igb ...
        pa.field("device", pa.string()),  # PCI address or netdev the record names
        pa.field("netdev", pa.string()),
        pa.field("xid", pa.int64()),
        pa.field("detail", pa.string()),  # Xid meaning, AER severity/type, the OOM victim ...
        pa.field("message", pa.string()),
    ),
    # One row per network interface in one dump: ip link / ip -d link / ip -s link / ip addr, ifconfig.
    "interfaces": _schema(
        pa.field("ifname", pa.string()),
        pa.field("ifindex", pa.int32()),
        pa.field("mtu", pa.int32()),
        pa.field("min_mtu", pa.int32()),  # ip -d link
        pa.field("max_mtu", pa.int32()),
        pa.field("state", pa.string()),  # UP / DOWN / UNKNOWN (operstate), or RUNNING-derived for ifconfig
        pa.field("flags", pa.string()),
        pa.field("link_type", pa.string()),  # ether, infiniband, loopback ...
        pa.field("kind", pa.string()),  # ip -d: veth, bond, vlan, ipoib ...
        pa.field("master", pa.string()),
        pa.field("peer_ifindex", pa.int32()),  # `veth0@if7`: the other end's index ...
        pa.field("link_netns", pa.string()),  # ... in this network namespace (`link-netns ns2`)
        pa.field("mac", pa.string()),
        pa.field("ipv4", pa.string()),  # first address with prefix, e.g. 10.0.0.1/24
        pa.field("rx_bytes", pa.int64()),
        pa.field("rx_errors", pa.int64()),
        pa.field("rx_dropped", pa.int64()),
        pa.field("tx_bytes", pa.int64()),
        pa.field("tx_errors", pa.int64()),
        pa.field("tx_dropped", pa.int64()),
        pa.field("source", pa.string()),  # ip, ifconfig
    ),
    # One row per GID table entry: show_gids, ibv_devinfo -v `GID[ n]:` lines.
    "gids": _schema(
        pa.field("ca", pa.string()),
        pa.field("port", pa.int32()),
        pa.field("index", pa.int32()),
        pa.field("gid", pa.string()),
        pa.field("ipv4", pa.string()),
        pa.field("roce", pa.string()),  # v1 / v2 (null on InfiniBand)
        pa.field("netdev", pa.string()),
        pa.field("source", pa.string()),
    ),
    # One row per nccl-tests result row and placement (out-of-place / in-place), and per Avg line.
    "nccl_tests": _schema(
        pa.field("test", pa.string()),  # all_reduce_perf ... when the output says it
        pa.field("kind", pa.string()),  # row, average
        pa.field("size_bytes", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("dtype", pa.string()),
        pa.field("redop", pa.string()),
        pa.field("root", pa.int64()),
        pa.field("placement", pa.string()),  # out, in
        pa.field("time_us", pa.float64()),
        pa.field("algbw_gbs", pa.float64()),  # GB/s as printed
        pa.field("busbw_gbs", pa.float64()),
        pa.field("wrong", pa.int64()),  # #wrong (2.x) or null for N/A; old `error` column kept as `error`
        pa.field("error", pa.float64()),
        pa.field("nranks", pa.int64()),  # `Rank N ... on HOST` header lines of the run
        pa.field("rank_hosts", pa.string()),  # the hosts of those lines, comma-joined
        pa.field("ranks_per_host", pa.int64()),  # the most ranks those lines put on one host
        pa.field("gpu_name", pa.string()),  # the GPU those lines name (`NVIDIA A100-SXM4-40GB`)
        pa.field("run", pa.int64()),  # which run of the file (a header starts one)
        pa.field("prefix", pa.string()),
    ),
    # One row per line saying how the processes found each other (ingest/host/rendezvous.py).
    "rendezvous": _schema(
        pa.field("role", pa.string()),  # store_server, store_client, master
        pa.field("address", pa.string()),  # the store's or rank 0's host's address (null for store_server)
        pa.field("port", pa.int64()),
    ),
    # One row per perftest result row (ib_write_bw, ib_read_bw, ib_send_bw, *_lat).
    "perftest": _schema(
        pa.field("test", pa.string()),  # `RDMA_Write BW Test`
        pa.field("device", pa.string()),
        pa.field("link_type", pa.string()),
        pa.field("mtu", pa.int32()),
        pa.field("gid_index", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("iterations", pa.int64()),
        pa.field("bw_peak", pa.float64()),
        pa.field("bw_avg", pa.float64()),
        pa.field("bw_unit", pa.string()),  # MB/sec or Gb/sec (--report_gbits)
        pa.field("msg_rate_mpps", pa.float64()),
        pa.field("lat_min_us", pa.float64()),
        pa.field("lat_max_us", pa.float64()),
        pa.field("lat_typical_us", pa.float64()),
        pa.field("lat_avg_us", pa.float64()),
        pa.field("lat_stdev_us", pa.float64()),
        pa.field("lat_p99_us", pa.float64()),
        pa.field("lat_p999_us", pa.float64()),
        pa.field("run", pa.int64()),
    ),
    # One row per PyTorch profiler (Kineto) trace file: whose it is and what it holds.
    "trace_ranks": _schema(
        pa.field("rank", pa.int64()),  # null when neither the trace nor its path says
        pa.field("rank_source", pa.string()),  # distributedInfo, file name, folder, unknown
        pa.field("world_size", pa.int64()),
        pa.field("backend", pa.string()),  # nccl, gloo ...
        pa.field("nccl_version", pa.string()),
        pa.field("pg_count", pa.int64()),
        pa.field("pg_config", pa.string()),  # distributedInfo's process groups, as JSON text
        pa.field("device_name", pa.string()),  # the first GPU of deviceProperties
        pa.field("base_time_ns", pa.int64()),  # baseTimeNanoseconds: the trace's times count from it
        pa.field("schema_version", pa.int64()),
        pa.field("events", pa.int64()),  # trace events read
        pa.field("spans", pa.int64()),  # rows kept in trace_spans
        pa.field("kernels", pa.int64()),
        pa.field("steps", pa.int64()),  # ProfilerStep spans
        pa.field("first_step", pa.int64()),
        pa.field("last_step", pa.int64()),
        pa.field("host_name", pa.string()),  # the machine's name the trace wrote (`host` is the run's name for it)
    ),
    # One row per kept span of a profiler trace (tracelens.ingest.profiler.kineto); `ts` is its start in UTC
    # (null when the trace's clock is not wall-clock time), `start_us`/`end_us` the same in epoch
    # microseconds (the trace's own clock), exact to the trace's precision.
    "trace_spans": _schema(
        pa.field("rank", pa.int64()),
        # step (ProfilerStep#N), annotation, cpu_op, collective (a CPU collective call), kernel, memcpy, memset
        pa.field("kind", pa.string()),
        pa.field("category", pa.string()),  # GPU spans: computation, communication, memory, other (HTA's classes)
        pa.field("name", pa.string()),
        pa.field("pid", pa.string()),
        pa.field("tid", pa.string()),  # CPU spans' thread
        pa.field("device", pa.int64()),  # GPU spans' device and stream
        pa.field("stream", pa.int64()),
        pa.field("start_us", pa.float64()),
        pa.field("dur_us", pa.float64()),
        pa.field("end_us", pa.float64()),
        pa.field("launch_us", pa.float64()),  # GPU spans: when the CPU called the launch (correlation id)
        pa.field("step", pa.int64()),  # the ProfilerStep whose CPU span holds the span's start (or launch)
        pa.field("depth", pa.int32()),  # CPU spans: nesting depth on the thread, 0 = top level
        pa.field("correlation", pa.int64()),
        # collectives (record_param_comms and NCCL kernels' args)
        pa.field("backend", pa.string()),  # nccl, gloo ... (the op's prefix)
        pa.field("collective", pa.string()),  # allreduce, broadcast, all_gather ...
        pa.field("in_nelems", pa.int64()),
        pa.field("out_nelems", pa.int64()),
        pa.field("dtype", pa.string()),
        pa.field("group_size", pa.int64()),
        pa.field("pg_name", pa.string()),
        pa.field("pg_desc", pa.string()),
        pa.field("pg_ranks", pa.string()),  # as written: "[0, 1]"
        pa.field("seq", pa.int64()),  # the collective's sequence number in its group, when the trace has it
        pa.field("src_rank", pa.int64()),  # point-to-point ops
        pa.field("dst_rank", pa.int64()),
        pa.field("bytes", pa.int64()),  # memcpy / memset
    ),
    # One row per input file: what was read and how much of it was understood.
    "inputs": pa.schema(
        [
            pa.field("file", pa.string()),
            pa.field("format", pa.string()),
            pa.field("host", pa.string()),
            pa.field("size", pa.int64()),
            pa.field("lines", pa.int64()),  # lines or packets read
            pa.field("parsed", pa.int64()),
            pa.field("ignored", pa.int64()),
            pa.field("unrecognized", pa.int64()),
            pa.field("errors", pa.list_(pa.string())),
            pa.field("notes", pa.list_(pa.string())),  # what was read only in part
            pa.field(
                "samples",
                pa.list_(pa.struct([pa.field("line", pa.int64()), pa.field("text", pa.string())])),
            ),
        ]
    ),
}


# What input fills each table: how the report and `tracelens rules` say what would let a rule run.
INPUTS: dict[str, str] = {
    "nccl_events": "NCCL logs (NCCL_DEBUG=INFO or WARN)",
    "nccl_comms": "NCCL logs with communicator init lines (NCCL_DEBUG=INFO)",
    "nccl_channels": "NCCL logs with channel connection lines (NCCL_DEBUG=INFO)",
    "nccl_net": "NCCL logs with network selection lines (NCCL_DEBUG=INFO)",
    "nccl_env": "NCCL logs echoing settings (NCCL_DEBUG=INFO)",
    "nccl_errors": "NCCL WARN lines or PyTorch ProcessGroupNCCL errors",
    "steps": "training logs with step lines (DeepSpeed steps_per_print, wall_clock_breakdown, Megatron iterations)",
    "comm_ops": "DeepSpeed comms-logger output (comms_logger.enabled)",
    "deepspeed_settings": "a ds_config.json or a DeepSpeed log echoing its configuration",
    "ib_counters": "port counter dumps (perfquery -x, ethtool -S, hw_counters), taken before and after",
    "ib_ports": "port state dumps (ibstat, ibstatus, ibv_devinfo)",
    "packets": "a packet capture (tcpdump -w) on the RoCE, IPoIB or TCP interface",
    "fr_entries": "PyTorch Flight Recorder dumps (TORCH_FR_BUFFER_SIZE, dump on timeout)",
    "fr_groups": "PyTorch Flight Recorder dumps with process group status",
    "stacks": "stack dumps of the ranks (py-spy dump, faulthandler)",
    "gpu_samples": "GPU utilisation samples (nvidia-smi --query-gpu ... -l 1, nvidia-smi dmon, dcgmi dmon)",
    "kernel_events": "kernel logs of the hosts (dmesg -T, journalctl -k)",
    "interfaces": "interface listings of the hosts (ip -d addr, ifconfig)",
    "gids": "RoCE GID tables (show_gids)",
    "nccl_tests": "nccl-tests output (all_reduce_perf ...)",
    "perftest": "perftest output (ib_write_bw ...)",
    "rendezvous": "launcher or PyTorch store lines naming the master address (--master_addr, c10d TCPStore)",
    "trace_ranks": "PyTorch profiler traces (torch.profiler, Kineto JSON) of the ranks",
    "trace_spans": "PyTorch profiler traces (torch.profiler, Kineto JSON) of the ranks",
    "inputs": "any readable input",
}


def empty(name: str) -> pl.DataFrame:
    """An empty frame with the columns and types of table `name`."""
    return pl.DataFrame(schema=polars_schema(name))


@functools.cache
def polars_schema(name: str) -> pl.Schema:
    """The polars columns and types of table `name`, converted from its Arrow schema once (from null
    arrays: Schema.empty_table goes through pa.array, which imports pandas when it is installed)."""
    schema = SCHEMAS[name]
    return pl.from_arrow(pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)).schema


Frame: TypeAlias = pl.DataFrame | pl.LazyFrame  # a table's rows in memory, or a lazy scan of rows spilled to Parquet


def conform(name: str, frame: Frame) -> Frame:
    """Cast `frame` to the schema of `name`: missing columns become nulls, extra columns stay.

    Ingest modules only fill what they know; this keeps every file's rows
    concatenable and typed the same way.
    """
    target = polars_schema(name)
    schema = frame.collect_schema()
    present = schema.names()
    columns = []
    for col, dtype in target.items():
        if col in present and dtype == pl.String and schema[col] == pl.Categorical:
            columns.append(pl.col(col))  # text that repeats (a capture's addresses) stays 4 bytes a row, not 16
        elif col in present:
            columns.append(pl.col(col).cast(dtype, strict=False))
        else:
            columns.append(pl.lit(None, dtype=dtype).alias(col))
    extra = [c for c in present if c not in target]
    return frame.select(*columns, *extra)


class Spill:
    """A big file's table rows written as Parquet parts while it is read, so that memory follows one
    chunk, not the file. Parts go to a folder of their own under `root`, the run's private working
    folder (made 0700 by tempfile, removed with the run), never a shared temporary path."""

    def __init__(self, root: Path) -> None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(dir=root))
        self.parts: dict[str, list[Path]] = {}

    def write(self, name: str, frame: pl.DataFrame) -> Path | None:
        """Append rows to table `name`, cast to its schema (every part of a table alike); a name
        that is no table (a parser's own intermediate rows) is written as it is. The part's path
        (None when there was no row)."""
        if not frame.height:
            return None
        path = self._next_part(name)
        frame = conform(name, frame) if name in SCHEMAS else frame
        # lz4, with column statistics: the timeline reads a big file's rows a range of lines at a time
        # (tracelens.inferred), and the parts' line statistics let each range's scan skip the others
        frame.write_parquet(path, compression="lz4")
        self.parts[name].append(path)
        return path

    def sink(self, name: str, rows: pl.LazyFrame, row_group_size: int) -> Path:
        """Stream `rows` as they are (no schema applied) to a new part of `name`, in row groups of
        `row_group_size` rows with their statistics; the part's path."""
        path = self._next_part(name)
        rows.sink_parquet(path, compression="lz4", row_group_size=row_group_size)
        self.parts[name].append(path)
        return path

    def _next_part(self, name: str) -> Path:
        """The path of table `name`'s next part (listed in `parts` once written)."""
        return self.folder / f"{name}-{len(self.parts.setdefault(name, [])):06d}.parquet"

    def scans(self) -> dict[str, pl.LazyFrame]:
        """Each table written, as a lazy scan of its parts in the order they were written."""
        return {name: pl.scan_parquet(paths) for name, paths in self.parts.items()}


class RunTables:
    """All tables of one run, each the concatenation over input files. A part may be a lazy scan of
    rows spilled to Parquet (Spill): it is read when the table is first asked for, and `write_parquet`
    streams it to its file without holding the table in memory."""

    def __init__(self) -> None:
        self._parts: dict[str, list[Frame]] = {}
        self._frames: dict[str, pl.DataFrame] = {}

    def __getitem__(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            parts = self._parts.get(name)
            if parts is None:
                self._frames[name] = empty(name)
            elif len(parts) == 1 and isinstance(parts[0], pl.DataFrame):
                # as it is: a copy would stay beside the part (a big capture's table is gigabytes)
                self._frames[name] = parts[0]
            else:
                self._frames[name] = self._lazy(name).collect()
        return self._frames[name]

    def _lazy(self, name: str) -> pl.LazyFrame:
        return pl.concat([part.lazy() for part in self._parts[name]], how="diagonal_relaxed")

    def __contains__(self, name: str) -> bool:
        """Whether table `name` has rows (a lazy part is taken to have some, without reading it)."""
        return name in self._parts

    def frame(self, name: str) -> Frame:
        """Table `name` as it is held: in memory when it was read or never spilled, else a lazy scan of
        its parts (how the timeline aligns a spilled table without reading it)."""
        parts = self._parts.get(name)
        if name in self._frames or parts is None or all(isinstance(p, pl.DataFrame) for p in parts):
            return self[name]
        return self._lazy(name)

    def scan(self, name: str) -> pl.LazyFrame:
        """Table `name` as a lazy frame, read from its parts when collected: how a rule reads a table
        that may be bigger than memory (`nccl_events`: one row per NCCL line) for the columns, rows or
        aggregates it shows, without holding the table."""
        if name in self._frames or name not in self._parts:
            return self[name].lazy()
        return self._lazy(name)

    def settled(self, folder: Path, but: Collection[str] = ()) -> RunTables:
        """New tables where each table with spilled parts is written once, whole (aligned on the way),
        to `folder` as Parquet and read back as a scan of that file: the rules that read it again and
        again then read a plain file, and the time columns joined on the way are not held in memory.
        The tables in `but` stay as they are (a lazy scan stays one)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        new = RunTables()
        for name, parts in self._parts.items():
            if name in but:
                new._parts[name] = [self.frame(name)]
            elif name in self._frames or all(isinstance(p, pl.DataFrame) for p in parts):
                new._parts[name] = [self[name]]
            else:
                path = folder / f"{name}.parquet"
                self._lazy(name).sink_parquet(path, compression="lz4")
                new._parts[name] = [pl.scan_parquet(path)]
        return new

    def add(self, name: str, frame: Frame) -> None:
        """Append rows to table `name` (cast to its schema)."""
        if isinstance(frame, pl.LazyFrame) or frame.height:
            self._parts.setdefault(name, []).append(conform(name, frame))
            self._frames.pop(name, None)

    def with_frames(self, frames: Mapping[str, Frame]) -> RunTables:
        """New tables: these replaced (cast to their schemas), the others shared with these. How a
        later stage (the timeline) gives its version of the tables while the ones it read stay as they were;
        a lazy frame stays lazy (read when the table is first asked for, or streamed by `write_parquet`)."""
        new = RunTables()
        new._parts = {name: [self.frame(name)] for name in self._parts}
        new._parts.update((name, [conform(name, frame)]) for name, frame in frames.items())
        return new

    def load(self) -> None:
        """Read every spilled part into memory: before the folder that holds them goes away."""
        for name in list(self._parts):
            self[name]

    def height(self, name: str) -> int:
        """Rows of table `name`, counted without reading spilled parts into memory."""
        if name in self._frames or name not in self._parts:
            return self[name].height
        return sum(
            p.height if isinstance(p, pl.DataFrame) else p.select(pl.len()).collect().item() for p in self._parts[name]
        )

    def with_text(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Add the NCCL record text (`message`) to rows of any NCCL table, joined on file and line."""
        if "message" in rows.columns:
            return rows
        keys = rows.select("file", "line").unique().lazy()
        text = self.scan("nccl_events").select("file", "line", "message").join(keys, on=["file", "line"], how="semi")
        return rows.join(text.unique(["file", "line"]).collect(engine="streaming"), on=["file", "line"], how="left")

    def write_parquet(self, out_dir: Path) -> list[Path]:
        """Write every table (empty ones too, so the set is predictable) as Parquet, each timed one
        with `ts_text` beside its `ts`; a table with spilled parts not yet read is streamed from them."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in SCHEMAS:
            path = out_dir / f"{name}.parquet"
            if name not in self._frames and any(isinstance(p, pl.LazyFrame) for p in self._parts.get(name, [])):
                with_ts_text(self._lazy(name)).sink_parquet(path)
            else:
                with_ts_text(self[name]).write_parquet(path)
            written.append(path)
        return written


def with_ts_text(frame: Frame) -> Frame:
    """`frame` with `ts_text` the time each row was read with, before the timeline placed it in UTC
    (`ts_read`): the text the line printed, where its reader kept it; else, for a time the input
    printed elsewhere (a dump's `date` line, a capture's frame time, a file name), that time formatted
    (local wall time as read; UTC for captures and zoned dumps); PyTorch's yearless c10 clock where that
    is all the line had; null for a row whose time nothing printed (inferred, a file's mtime, none)."""
    columns = frame.collect_schema().names()
    if "ts" not in columns:
        return frame
    read = pl.col("ts_read") if "ts_read" in columns else pl.col("ts")
    # only the times shown are formatted (a null costs nothing): most rows of a big log have their
    # printed text, or an inferred time, which shows none
    shown = read
    if "ts_quality" in columns:  # a time printed somewhere in the input (or a capture's, or a file name's)
        shown = pl.when(pl.col("ts_quality").is_in(["exact", "filename"])).then(shown)
    if "ts_text" in columns:
        shown = pl.when(pl.col("ts_text").is_null()).then(shown)
    text = shown.dt.to_string("%Y-%m-%d %H:%M:%S%.f")
    if "ts_text" in columns:
        text = pl.coalesce(pl.when(read.is_not_null()).then(pl.col("ts_text")), text)
    if "clock" in columns:
        text = pl.coalesce(text, pl.col("clock"))
    return frame.with_columns(ts_text=text).drop("ts_read", strict=False)
