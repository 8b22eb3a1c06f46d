"""NCCL/PyTorch log variants the real corpus lacks or has only once, built from the formats
documented in docs/formats/nccl.md and docs/formats/pytorch.md.

Real logs beyond the corpus show wordings, eras and launchers it does not; each case
here is one such documented variant, checked for its kind and the table values that matter.
The whole-log cases at the end are small realistic jobs (two nodes, launcher prefixes, one
incident each) that must give the socket (TL101), completion (TL107) and timeout (TL108)
findings, and none of the TL1xx warnings when healthy.
"""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import chain, zip_longest
from pathlib import Path

import polars as pl
import pytest

from synth import pytorch
from synth.nccl import (
    Comm,
    Host,
    IbError,
    Member,
    Process,
    Version,
    comm_init,
    ib_completion_error,
    net_init,
    process_start,
)
from tests.helpers.nccl import ingest, ingest_text
from tracelens.analyze import analyze
from tracelens.findings import Severity
from tracelens.ingest.text.lines import IGNORED, NOT_MINE, PARSED

ENVELOPE = "gpu-node-3:4052:4122 [2] "
UTC = timezone.utc


def info(body: str) -> str:
    return f"{ENVELOPE}NCCL INFO {body}"


def warn(body: str, where: str = "transport/net_ib.cc:2543") -> str:
    return f"{ENVELOPE}{where} NCCL WARN {body}"


def one_record(tmp_path: Path, line: str) -> tuple[dict, dict[str, pl.DataFrame]]:
    """The event of a single line (which must be parsed) and all tables."""
    status, tables = ingest_text(tmp_path, line)
    assert status == [PARSED], line
    return tables["nccl_events"].row(0, named=True), tables


# ------------------------------------------------------------------ message bodies of every era

# (line, kind, table, {column: value} of that table's first row); table None = only the kind.
BODIES = [
    # 2.30.7: the WARN names the function; completion errors, every wording
    (warn("NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) vendor_err=129 localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1 hca mlx5_0", "transport/net_ib/p2p.cc:688 (ncclIbTest)"),
     "ib_completion", "nccl_errors", {"kind": "ib_completion", "status": 12, "status_name": "IBV_WC_RETRY_EXC_ERR", "opcode": 0, "vendor_err": 129, "peer": "10.0.0.1<50000>"}),
    (warn("NET/IB/GIN: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_REM_ACCESS_ERR(10) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=136 localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1 hca mlx5_0", "transport/net_ib/gin.cc:412 (ncclGinIbTest)"),
     "ib_completion", "nccl_errors", {"status": 10, "status_name": "IBV_WC_REM_ACCESS_ERR", "opcode": 1, "vendor_err": 136}),
    (warn("NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=65536 vendor_err=129 req_type=Send localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1 hca mlx5_0"),
     "ib_completion", "nccl_errors", {"status": 12, "opcode": 0, "vendor_err": 129, "peer": "10.0.0.1<50000>"}),
    (warn("NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_WR_FLUSH_ERR(5) opcode=IBV_WC_RECV(128) reqSize=0 vendor_err=249 req_type=Recv hca mlx5_0"),  # no GIDs
     "ib_completion", "nccl_errors", {"status": 5, "status_name": "IBV_WC_WR_FLUSH_ERR", "opcode": 128, "vendor_err": 249}),
    (warn("NET/IB: Got completion from peer 10.3.0.7<41022> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.3.0.6 remoteGids::ffff:10.3.0.7 hca mlx5_3", "transport/net_ib.cc:2121"),  # 2.22-2.28.3
     "ib_completion", "nccl_errors", {"status": 12, "opcode": 0, "vendor_err": 129, "peer": "10.3.0.7<41022>"}),
    (warn("NET/IB : Got completion from peer 10.3.0.7<41022> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.3.0.6 remoteGids::ffff:10.3.0.7", "transport/net_ib.cc:1909"),  # 2.20-2.21
     "ib_completion", "nccl_errors", {"status": 12, "vendor_err": 129}),
    (warn("NET/IB : Got completion from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv) localGid fe80::ba59:9f03:f:1a2b remoteGidsfe80::ba59:9f03:f:1a2c", "transport/net_ib.cc:1295"),  # 2.18
     "ib_completion", "nccl_errors", {"status": 12, "peer": "10.2.0.5<33092>"}),
    (warn("NET/IB : Got completion from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129", "transport/net_ib.cc:1198"),  # 2.10-2.17
     "ib_completion", "nccl_errors", {"status": 12, "peer": "10.2.0.5<33092>"}),
    (warn("NET/IB : Got completion with error 12, opcode 1, len 32768, vendor err 129", "transport/net_ib.cc:789"),  # <=2.9, no peer
     "ib_completion", "nccl_errors", {"status": 12, "opcode": 1, "peer": None}),
    # async events of every era, verbs calls
    (warn("NET/IB : Got async event : port error"), "ib_async_event", "nccl_errors", {"kind": "ib_async_event"}),
    (warn("NET/IB : mlx5_0:1 Got async event : port error"), "ib_async_event", "nccl_errors", {"kind": "ib_async_event"}),
    (warn("NET/IB : mlx5_1:1 Got async event : client reregistration"), "ib_async_event", "nccl_errors", {"kind": "ib_sm_event"}),
    (warn("NET/IB : mlx5_0:1 async fatal event: port error(10)"), "ib_async_event", "nccl_errors", {"kind": "ib_async_event"}),
    (warn("NET/IB : mlx5_0:1 Got async error event: local catastrophic error"), "ib_async_event", "nccl_errors", {"kind": "ib_async_event"}),
    (warn("Call to ibv_modify_qp failed with error Connection timed out errno 110", "misc/ibvwrap.cc:187"), "verbs_call", "nccl_errors", {"kind": "verbs_call"}),
    (warn("Call to ibv_reg_mr failed : Cannot allocate memory", "misc/ibvwrap.cc:120"), "verbs_call", "nccl_errors", {"kind": "verbs_call"}),
    (warn("Call to ibv_reg_mr failed: Cannot allocate memory", "misc/ibvwrap.cc:120"), "verbs_call", "nccl_errors", {"kind": "verbs_call"}),
    (info("Call to ibv_modify_qp failed with 110 Connection timed out, ncclIbModifyQp, retrying 1/5 after 1000 msec of sleep"), "verbs_call", None, {}),
    (warn("NET/IB : Unable to open device mlx5_2"), "ib_device_error", "nccl_errors", {"kind": "ib_device"}),
    (warn("NET/IB : Attempted to connect incompatible devices: [0]mlx5_0:1/IB and [1]mlx5_1:1/RoCE. Try selecting NICs of only one link type using NCCL_IB_HCA"),
     "ib_device_error", None, {}),
    (warn("lib wrapper not initialized.", "misc/ibvwrap.cc:173"), "libibverbs_missing", "nccl_net", {"what": "ib_missing", "name": "no_libibverbs"}),
    # socket failures, 2.4-2.12 and 2.16+ wordings
    (warn("Connect to 10.0.0.2<43000> failed : Connection refused", "include/socket.h:415"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (info("Call to connect returned Connection refused, retrying"), "socket_error", None, {}),
    (warn("Net : Connection closed by remote peer", "include/socket.h:422"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("Net : No interface found in the same subnet as remote address 10.1.2.3<4455>", "include/socket.h:320"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("socketStartConnect: exceeded retries (34)", "misc/socket.cc:575"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("socketStartConnect: exceeded timeouts (34)", "misc/socket.cc:575"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("socketProgressOpt: Call to recv from 10.0.0.2<45763> failed : Connection reset by peer", "misc/socket.cc:49"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("socketPollConnect poll() failed with error Connection refused", "misc/socket.cc:460"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("socketFinalizeAccept: wrong magic 1234 != 5678", "misc/socket.cc:416"), "foreign_connection", "nccl_errors", {"kind": "foreign_connection"}),
    (warn("Net : Socket creation failed : Address family not supported by protocol", "include/socket.h:361"), "socket_error", "nccl_errors", {"kind": "socket"}),  # 2.3-2.12
    (warn("Socket creation failed : Address family not supported by protocol", "include/socket.h:344"), "socket_error", "nccl_errors", {"kind": "socket"}),  # 2.4
    (warn("[Service thread] Accept failed Success", "proxy.cc:1494"), "proxy_error", "nccl_errors", {"kind": "proxy"}),
    (warn("[Service thread] Error encountered progressing operation=Connect, res=3", "proxy.cc:1523"), "proxy_error", "nccl_errors", {"kind": "proxy"}),  # a paste that cut its end
    (warn("Bootstrap : no socket interface found", "bootstrap.cc:61"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("NET/Socket : No usable listening interface found", "transport/net_socket.cc:70"), "socket_error", "nccl_errors", {"kind": "socket"}),
    (warn("NET/IB : No IP interface found.", "transport/net_ib.cc:390"), "ib_no_ip_interface", "nccl_net", {"what": "ib_missing", "name": "no_ip_interface"}),
    (info("NET/IB : No device found."), "ib_no_device", "nccl_net", {"what": "ib_missing", "name": "no_device"}),
    (info("Failed to open libibverbs.so[.1]"), "libibverbs_missing", "nccl_net", {"name": "no_libibverbs"}),  # INFO from 2.11
    # network choice and plugins: aws-ofi-nccl names with spaces, HPC-X, non-device plugins
    (info("Using network AWS Libfabric"), "network", "nccl_net", {"what": "network", "name": "AWS Libfabric"}),
    (info("NET/Plugin: Loaded net plugin NCCL RDMA Plugin (v4)"), "plugin", "nccl_net", {"what": "plugin", "name": "NCCL RDMA Plugin (v4)"}),
    (info("NET/Plugin: Loaded net plugin AWS Libfabric (v7)"), "plugin", "nccl_net", {"name": "AWS Libfabric (v7)"}),
    (info("NET/OFI Initializing aws-ofi-nccl 1.7.4-aws"), "plugin", None, {}),
    (info("NET/OFI Using Libfabric version 1.18"), "plugin", None, {}),
    (info("NET/OFI Selected Provider is efa (found 4 nics)"), "plugin", None, {}),
    (info("NET/OFI Setting FI_EFA_FORK_SAFE environment variable to 1"), "plugin", None, {}),
    (info("Initialized NET plugin Libfabric"), "plugin", "nccl_net", {"what": "plugin", "name": "Libfabric"}),  # 2.27+
    (info("Assigned NET plugin Libfabric to comm"), "plugin", None, {}),
    (info("TUNER/Plugin: Using tuner plugin nccl_ofi_tuner"), "plugin", None, {}),
    (info("NET/OFI No NIC info for dev 0. Supplying default values for NIC properties."), "plugin", None, {}),  # no failure
    (info("NET/OFI No NIC info for dev 0"), "ofi_no_nic", "nccl_errors", {"kind": "plugin"}),  # 1.4-1.5: init fails, INFO
    # aws-ofi-nccl's own failures and GPUDirect verdict (its WARNs name the function, not the file)
    (warn("NET/OFI No NIC info for dev 0", "nccl_net_ofi_init:1189"), "ofi_no_nic", "nccl_errors", {"kind": "plugin"}),
    (warn("NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument", "ofi_init:1136"), "ofi_error", "nccl_errors", {"kind": "plugin"}),
    (warn("NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge", "nccl_net_ofi_create_plugin:812"), "ofi_gdr", "nccl_net", {"what": "gdr_disabled", "name": "OFI"}),
    # 2.3-2.4: the network each GPU's data takes, named by its device list (2.3's socket network says `IP`)
    (info("CUDA Dev 0, IP Interfaces : lo(SOC) eth0(PXB)"), "net_distance", "nccl_net", {"what": "network", "name": "Socket"}),
    (info("CUDA Dev 2, IB Ports : mlx5_3/1(SOC) mlx5_2/1(SOC) mlx5_1/1(PIX) mlx5_0/1(PHB)"), "net_distance", "nccl_net", {"what": "network", "name": "IB"}),
    (info("CUDA Dev 6[6], Socket NIC distance :  PHB"), "net_distance", "nccl_net", {"what": "network", "name": "Socket"}),
    (info("RAS client listening socket at ::1<28028>"), "setup_info", None, {}),  # 2.24+: loopback by design
    (info("Using non-device net plugin version 0"), "plugin", None, {}),
    (info("TUNER/Plugin: Using internal tuner plugin."), "plugin", None, {}),
    (info("NCCL_IB_DISABLE set by environment to 1."), "env_set", "nccl_env", {"name": "NCCL_IB_DISABLE", "value": "1"}),
    # transports per channel
    (info("Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA"), "channel_conn", "nccl_channels",
     {"transport": "NET", "net": "AWS Libfabric", "nic": 0, "gdr": True, "direction": "send", "src_rank": 0, "dst_rank": 8}),
    (info("Channel 01/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA"), "channel_conn", "nccl_channels", {"net": "Libfabric", "direction": "receive"}),
    (info("Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA(PCI)"), "channel_conn", "nccl_channels", {"net": "IB", "nic": 0, "gdr": True}),
    (info("Channel 00/1 : 3[3] -> 11[3] [send] via NET/IB/1(6)/GDRDMA/Shared"), "channel_conn", "nccl_channels", {"nic": 1, "proxy_rank": 6, "gdr": True}),
    (info("Channel 02/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/2"), "channel_conn", "nccl_channels", {"net": "IBext_v8", "nic": 2, "gdr": False}),
    (info("Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL"), "channel_conn", "nccl_channels", {"transport": "P2P/MNNVL", "net": None}),
    (info("Channel 00/0 : 0[0] -> 1[1] via SHM/direct"), "channel_conn", "nccl_channels", {"transport": "SHM"}),
    (info("Channel 03/0 : 0[0] -> 1[1] via P2P/IPC/read/CE"), "channel_conn", "nccl_channels", {"transport": "P2P/IPC"}),
    (info("Ring 00 : 1 -> 0 via NET/IB/0"), "channel_conn", "nccl_channels", {"net": "IB", "src_rank": 1, "dst_rank": 0, "gdr": False}),  # 2.3
    (info("NVLS multicast support is available on dev 0"), "setup_info", None, {}),
    (info("NVLS multicast support is not available on dev 0"), "setup_info", None, {}),
    (info("Connected all rings, use ring PXN 0 GDR 1"), "connected", None, {}),
    # communicator lifecycle, 2.29+ `[Rank N] ` and split communicators
    (info("[Rank 5] ncclCommInitRankConfig comm 0x55d3c0 rank 5 nranks 16 cudaDev 5 nvmlDev 5 busId ac000 commId 0x8a1f2e3d4c5b6a79 - Init START"),
     "comm_init", "nccl_comms", {"rank": 5, "nranks": 16, "cuda_dev": 5, "bus_id": "ac000", "comm_hash": "0x8a1f2e3d4c5b6a79", "event": "init_start"}),
    (info("[Rank 5] ncclCommInitRankConfig comm 0x55d3c0 rank 5 nranks 16 cudaDev 5 nvmlDev 5 busId ac000 commId 0x8a1f2e3d4c5b6a79 - Init COMPLETE"),
     "comm_init", "nccl_comms", {"rank": 5, "event": "init_complete"}),
    (info("ncclCommSplit comm 0x55d3c0 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 29000 parent 0x55aa00 splitCount 1 color 2 key 1 commId 0x1a2b - Init START"),
     "comm_init", "nccl_comms", {"rank": 1, "nranks": 4, "comm_hash": "0x1a2b", "event": "init_start"}),
    (info("[Rank 5] comm 0x55d3c0 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0"), "comm_info", "nccl_comms", {"rank": 5, "nranks": 16}),
    (info("comm 0x55d3c0 rank 5 nranks 16 cudaDev 5 busId ac000 - Abort COMPLETE"), "comm_teardown", "nccl_comms", {"event": "abort"}),
    (info("NCCL version 2.30.7+cuda13.0"), "version", None, {}),
    (info("Init timings - ncclCommInitRankConfig: rank 5 nranks 16 total 1.23 (kernels 0.10, alloc 0.01, bootstrap 0.20, allgathers 0.01, topo 0.30, graphs 0.02, connections 0.50, rest 0.09)"),
     "init_timings", None, {}),
    (info("HINT: Default value is 20, which is ~30 seconds before error."), "ib_hint", None, {}),
    # error propagation and other failures
    (info("proxy.cc:874 -> 6 [Progress Thread]"), "error_propagation", None, {}),
    (warn("proxy.cc:979 -> 3 [Progress Thread]", "proxy.cc:979"), "error_propagation", "nccl_errors", {"kind": "warn"}),
    (warn("Error : ring 0 does not loop back to start (3 != 0)", "graph/rings.cc:40"), "graph_error", None, {}),
    (warn("CollNet is not supported or fails to initialize, ignoring NCCL_ALGO=COLLNET", "graph/tuning.cc:148"), "graph_error", None, {}),
    # CALL level: no [dev]
    ("gpu-node-3:4052:4052 NCCL CALL ncclCommInitRank(0x7ffd5c,16,0x1f2e3d,5)", "api_call", None, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "kind", "table", "expected"), BODIES, ids=[b[0][len(ENVELOPE) :][:70] for b in BODIES]
)
def test_documented_bodies(tmp_path, line, kind, table, expected):
    event, tables = one_record(tmp_path, line)
    assert event["kind"] == kind
    if table:
        row = tables[table].row(0, named=True)
        assert {k: row[k] for k in expected} == expected


def test_every_documented_nccl_line_is_classified(tmp_path):
    """The corpus check (>= 98% of NCCL-prefixed lines get a specific kind) made stricter: here, all of them."""
    status, tables = ingest_text(tmp_path, *(line for line, *_ in BODIES))
    assert status == [PARSED] * len(BODIES)
    assert "unknown" not in tables["nccl_events"]["kind"].to_list()


# ------------------------------------------------------------------ envelopes: launchers, hosts, line ends

LAUNCHER_PREFIXES = [
    ("node07: ", "node07"),  # pdsh (DeepSpeed multi-node)
    ("node07.cluster.local: ", "node07"),  # pdsh with a FQDN: cut at the first dot, as NCCL names hosts
    ("10.0.143.177: ", "10.0.143.177"),  # pdsh with IPs in the hostfile
    ("[1,0]<stdout>:", None),  # Open MPI --tag-output
    ("[1,12]<stderr>:", None),
    ("[rank0]:", None),  # torchrun --role rank --tee 3
    ("[default0]:", None),  # torchrun --tee, default role
    ("[trainer3]:", None),  # torchrun, role trainer
    ("(pid=21065) ", None),  # Ray worker
    ("(RayTrainWorker pid=355353, ip=10.0.0.5) ", None),
    ("(RayWorkerWrapper pid=1019) ", None),
    ("[3] ", None),  # mpirun rank tag
    ("[80746] ", None),  # log collector line ids
    ("[0m ", None),  # Ray colour residue
    ("\t", None),
    ("Epoch 0:  12%|█▏        | 120/1000 [01:02<07:38,  1.92it/s, loss=2.31]", None),  # tqdm bar, no newline
]


@pytest.mark.parametrize(("prefix", "pdsh_host"), LAUNCHER_PREFIXES)
def test_launcher_prefixes_on_warn_and_its_blank_line(tmp_path, prefix, pdsh_host):
    completion = "NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=8 vendor_err=129 req_type=Send hca mlx5_0"
    status, tables = ingest_text(
        tmp_path,
        f"{prefix}gpu-node-3:4052:4052 [2] NCCL INFO Using network IB",
        prefix.rstrip(),  # NCCL's blank line before a WARN, behind the same prefix
        f"{prefix}gpu-node-3:4052:4130 [2] transport/net_ib.cc:2543 NCCL WARN {completion}",
        f"{prefix}[rank2]:[E1107 10:12:01.123456789 ProcessGroupNCCL.cpp:1234] [PG ID 0 PG GUID 0(default_pg) Rank 2] ProcessGroupNCCL environments: NCCL version: 2.28.9, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3",
    )
    assert status == [PARSED, IGNORED, PARSED, PARSED]
    events = tables["nccl_events"]
    assert events["kind"].to_list() == ["network", "ib_completion", "pt_setup"]
    assert events["host"].to_list() == ["gpu-node-3", "gpu-node-3", pdsh_host]
    assert events["prefix"].to_list()[:2] == [prefix, prefix]
    assert tables["nccl_errors"].row(0, named=True)["status"] == 12


@pytest.mark.parametrize(
    ("line", "host", "pid", "tid"),
    [
        ("64:215:576 [0] NCCL INFO Using network IB", "64", 215, 576),  # a numeric hostname
        ("2e5hmh4t0q1th5f:88:157 [0] NCCL INFO Using network IB", "2e5hmh4t0q1th5f", 88, 157),  # container id
        ("0a1b2c3d4e5f:88:88 [0] NCCL INFO Using network IB", "0a1b2c3d4e5f", 88, 88),  # hex docker id
        ("-worker-1:946:988 [0] NCCL INFO Using network IB", "-worker-1", 946, 988),  # cut by the user
        ("<cluster_name>:926:1151 [7] NCCL INFO Using network IB", "<cluster_name>", 926, 1151),  # redacted
        ("ip-10-0-143-177:2819:2819 [0] NCCL INFO Using network IB", "ip-10-0-143-177", 2819, 2819),
        ("llm-pretrain-70b-a1b2c3d4e5f6a7b8-worker-17-0f1e2d3c4b5a69788796a5b4c3d2e1f0-gpu-h100-80gb:12:13 [0] NCCL INFO Using network IB",
         "llm-pretrain-70b-a1b2c3d4e5f6a7b8-worker-17-0f1e2d3c4b5a69788796a5b4c3d2e1f0-gpu-h100-80gb", 12, 13),  # long k8s name
        ("gpu-node-a-b:7:7 [0] NCCL INFO Using network IB", "gpu-node-a-b", 7, 7),  # 2.30.7: `%` and `/` became `-`
    ],
)  # fmt: skip
def test_hostnames(tmp_path, line, host, pid, tid):
    event, _ = one_record(tmp_path, line)
    assert (event["host"], event["pid"], event["tid"], event["kind"]) == (host, pid, tid, "network")


def test_crlf_tabs_and_shipper_lines_between_records(tmp_path):
    path = tmp_path / "cloudwatch.log"
    lines = [
        "algo-1:88:88 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\t",
        "2024-12-04T05:27:42.076Z",  # CloudWatch's own stamp between records
        "algo-1:88:88 [0] NCCL INFO Using network AWS Libfabric",
        "2024-12-04T05:27:42.077Z",
        "\talgo-1:88:88 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA",
    ]
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    status, tables = ingest(path)
    assert status == [PARSED, NOT_MINE, PARSED, NOT_MINE, PARSED]
    assert tables["nccl_net"].filter(pl.col("what") == "network")["name"].to_list() == ["AWS Libfabric"]
    assert tables["nccl_net"].filter(pl.col("what") == "bootstrap_if")["address"].to_list() == ["10.0.0.1"]
    assert tables["nccl_channels"]["via"].to_list() == ["NET/AWS Libfabric/0/GDRDMA"]


# ------------------------------------------------------------------ timestamps


@pytest.mark.parametrize(
    ("stamp", "ts"),
    [
        ("[2025-03-01 10:00:07] ", datetime(2025, 3, 1, 10, 0, 7, tzinfo=UTC)),  # 2.26+ default, WARN only
        ("[2025-03-01 10:00:07.123] ", datetime(2025, 3, 1, 10, 0, 7, 123000, tzinfo=UTC)),  # [%F %T.%3f]
        ("[2025-03-01 10:00:07.123456] ", datetime(2025, 3, 1, 10, 0, 7, 123456, tzinfo=UTC)),  # %6f
        ("[2025-03-01 10:00:07.123456789] ", datetime(2025, 3, 1, 10, 0, 7, 123456, tzinfo=UTC)),  # %9f, kept to the ns
        ("[2025-03-01T10:00:07.5] ", datetime(2025, 3, 1, 10, 0, 7, 500000, tzinfo=UTC)),  # [%FT%T.%1f]
        ("2025-03-01 10:00:07 ", datetime(2025, 3, 1, 10, 0, 7, tzinfo=UTC)),  # %F_%T_: underscores print as spaces
        ("[10:00:07] ", None),  # no date: left to the timeline
    ],
)
def test_nccl_timestamps_of_custom_formats(tmp_path, stamp, ts):
    status, tables = ingest_text(
        tmp_path,
        "",
        f"{stamp}gpu-node-3:4052:4130 [2] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer gpu-node-4<1234>",
    )
    assert status == [IGNORED, PARSED]
    event = tables["nccl_events"].row(0, named=True)
    assert event["host"] == "gpu-node-3" and event["kind"] == "socket_error"
    assert event["ts"] == ts


def test_timestamps_on_info_behind_a_launcher_stamp(tmp_path):
    _, tables = ingest_text(
        tmp_path,
        " 2025-02-18 12:54 gpu-node-3:4052:4052 [7] NCCL INFO misc/socket.cc:47 -> 3",  # a log shipper's stamp
        "[default0]:[2025-02-18 12:54:03.250] gpu-node-3:4052:4052 [0] NCCL INFO Using network IB",
    )
    assert tables["nccl_events"]["ts"].to_list() == [
        datetime(2025, 2, 18, 12, 54, tzinfo=UTC),
        datetime(2025, 2, 18, 12, 54, 3, 250000, tzinfo=UTC),
    ]
    assert tables["nccl_events"]["prefix"].to_list() == [" 2025-02-18 12:54 ", "[default0]:"]


# ------------------------------------------------------------------ PyTorch

WORK = "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000)"
OLD_WORK = "WorkNCCL(SeqNum=5, OpType=BROADCAST, Timeout(ms)=1800000)"
PG = "[PG ID 0 PG GUID 0(default_pg) Rank 1]"


@pytest.mark.parametrize(
    ("line", "kind", "expected"),
    [
        (f"[rank3]:[E ProcessGroupNCCL.cpp:523] [Rank 3] Watchdog caught collective operation timeout: {WORK} ran for 600123 milliseconds before timing out.",
         "watchdog_timeout", {"rank": 3, "seq": 12, "op_type": "ALLREDUCE", "timeout_ms": 600000, "ran_ms": 600123}),  # transitional: rank prefix, no time
        (f"[rank1]:[E1107 10:00:00.123456789 ProcessGroupNCCL.cpp:632] {PG} Watchdog caught collective operation timeout: {WORK} ran for 600045 milliseconds before timing out.",
         "watchdog_timeout", {"rank": 1, "seq": 12, "ran_ms": 600045}),
        (f"[rank1]:[E1107 10:00:00.123456789 ProcessGroupNCCL.cpp:1234] [Rank 1] Work {WORK} timed out in blocking wait.",
         "blocking_wait_timeout", {"rank": 1, "seq": 12, "timeout_ms": 600000}),
        (f"[E ProcessGroupNCCL.cpp:456] [Rank 1] Work {OLD_WORK} timed out in blocking wait (NCCL_BLOCKING_WAIT=1).",
         "blocking_wait_timeout", {"rank": 1, "seq": 5, "op_type": "BROADCAST"}),
        (f"[E ProcessGroupNCCL.cpp:828] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: {OLD_WORK} ran for 1800543 milliseconds before timing out.",
         "watchdog_timeout", {"rank": 2, "seq": 5, "timeout_ms": 1800000, "ran_ms": 1800543}),  # 2.0-2.1
        (f"[rank1]:[E1107 10:00:00.123456789 ProcessGroupNCCL.cpp:1234] {PG} Process group watchdog thread terminated with exception: {PG} Watchdog caught collective operation timeout: {WORK} ran for 600543 milliseconds before timing out.",
         "watchdog_timeout", {"rank": 1, "seq": 12}),
        (f"[rank1]:[E1107 10:00:00.123456789 ProcessGroupNCCL.cpp:1234] {PG}  failure detected by watchdog at work sequence id: 120049 PG status: last enqueued work: 120051, last completed work: 120048",
         "watchdog_exception", {"rank": 1, "seq": 120049}),
        (f"[rank1]:[E1107 10:00:00.123456789 ProcessGroupNCCL.cpp:1234] {PG} Timeout at NCCL work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.",
         "watchdog_exception", {"seq": 1580}),
        (f"[rank1]:[F1107 10:00:00.223456789 ProcessGroupNCCL.cpp:1350] {PG} {PG} Terminating the process after attempting to dump debug info, due to collective timeout or exception.",
         "watchdog_abort", {"rank": 1}),
        ("[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, we are taking the entire process down.",
         "watchdog_abort", {}),  # <=1.9
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5",
         "nccl_runtime_error", {}),
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
         "nccl_runtime_error", {}),
        ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ", "nccl_runtime_error", {}),
        ("ncclInternalError: Internal check failed.", "nccl_runtime_error", {}),
        ("ncclUnhandledCudaError: Call to CUDA function failed.", "cuda", {}),
        ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", "nccl_runtime_error", {}),
        ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.", "nccl_runtime_error", {}),
    ],
)  # fmt: skip
def test_pytorch_errors(tmp_path, line, kind, expected):
    _, tables = one_record(tmp_path, line)
    error = tables["nccl_errors"].row(0, named=True)
    assert error["kind"] == kind
    assert {k: error[k] for k in expected} == expected


@pytest.mark.parametrize(
    "line",
    [
        "[I1107 10:00:00.123456789 ProcessGroupNCCL.cpp:937] [PG ID 0 PG GUID 0(default_pg) Rank 1] ProcessGroupNCCL initialization options: size: 8, global rank: 1, TIMEOUT(ms): 600000",
        "[I ProcessGroupNCCL.cpp:686] [Rank 0] ProcessGroupNCCL initialization options:NCCL_ASYNC_ERROR_HANDLING: 1, NCCL_DESYNC_DEBUG: 0",
        "[rank0]:[W1107 10:30:00.123456789 ProcessGroupNCCL.cpp:1250] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources. (function operator())",
        "[W ProcessGroupNCCL.cpp:1569] Rank 0 using best-guess GPU 0 to perform barrier as devices used by this process are currently unknown.",
    ],
)
def test_pytorch_setup_chatter_is_known(tmp_path, line):
    event, _ = one_record(tmp_path, line)
    assert event["kind"] == "pt_setup"


def test_environment_dump_names_the_nccl_version(tmp_path):
    event, _ = one_record(
        tmp_path,
        f"[I1107 10:00:00.123456789 ProcessGroupNCCL.cpp:937] {PG} ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 1",
    )
    assert event["kind"] == "pt_setup" and event["level"] == "INFO"


COMPLETION_18 = (
    "NET/IB : Got completion from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
)
REMOTE = "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."


@pytest.mark.parametrize(
    ("lines", "statuses"),
    [
        ([f"{REMOTE} Last error:", COMPLETION_18], [PARSED, PARSED]),  # two lines
        ([REMOTE, "Last error:", COMPLETION_18], [PARSED, NOT_MINE, PARSED]),  # NCCLUtils' own line breaks
        ([f"node02: {REMOTE} Last error:", f"node02: {COMPLETION_18}"], [PARSED, PARSED]),  # behind pdsh
        ([f"{REMOTE} Last error: {COMPLETION_18}"], [PARSED]),  # a Markdown collapse
    ],
)
def test_the_nccl_warn_pytorch_quotes_is_an_ib_completion(tmp_path, lines, statuses):
    status, tables = ingest_text(tmp_path, *lines)
    assert status == statuses
    completion = tables["nccl_errors"].filter(pl.col("kind") == "ib_completion").row(0, named=True)
    assert (completion["status"], completion["vendor_err"], completion["peer"]) == (12, 129, "10.2.0.5<33092>")
    assert completion["line"] == len(lines)


# ------------------------------------------------------------------ whole logs: two nodes, one launcher each


def two_node_job(
    version: str, hcas: tuple[str, ...] = ("mlx5_0", "mlx5_1"), env: tuple[tuple[str, str], ...] = ()
) -> tuple[Comm, list[list[str]]]:
    """A 2-node x 2-GPU job of one NCCL version: each rank's NCCL INFO lines from start to Init COMPLETE."""
    v = Version(version, "12.4")
    hosts = [Host(f"gpu-node-{n}", f"10.1.0.{n}", gpus=2, version=v, hcas=hcas, env=env) for n in (1, 2)]
    procs = [
        Process(h, 4000 + 100 * n + dev, dev, 4050 + 100 * n + dev, 4070 + 100 * n + dev)
        for n, h in enumerate(hosts)
        for dev in range(2)
    ]
    comm = Comm([Member(p, f"0x55aa{rank:04x}0") for rank, p in enumerate(procs)], "8a1f2e3d4c5b6a79")
    per_rank = []
    for rank, proc in enumerate(procs):
        lines = [proc.info(m) for m in process_start(proc) + net_init(proc)]
        lines += [proc.info(m, proc.init_tid) for m in comm_init(comm, rank, lambda: [0.05] * 8)]
        if rank == 0 and not v.at_least("2.23"):
            lines.insert(1, v.banner)  # up to 2.22 rank 0 prints the version bare on stdout
        per_rank.append(lines)
    return comm, per_rank


def interleaved(per_rank: list[list[str]], prefix) -> list[str]:
    """Ranks print concurrently: their lines alternate, each behind its launcher prefix."""
    rounds = zip_longest(*([prefix(rank) + line for line in lines] for rank, lines in enumerate(per_rank)))
    return [line for line in chain.from_iterable(rounds) if line is not None]


def write_run(tmp_path: Path, lines: list[str]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run


def nccl_findings(run: Path) -> dict[str, Severity]:
    """TL1xx rule id -> worst severity over its findings."""
    found: dict[str, Severity] = {}
    for f in analyze(run).findings:
        if f.rule_id.startswith("TL1"):
            found[f.rule_id] = max(f.severity, found.get(f.rule_id, Severity.INFO))
    return found


def assert_all_nccl_lines_parsed(run: Path) -> None:
    status, _ = ingest(run / "train.log")
    text = (run / "train.log").read_text().splitlines()
    missed = [line for s, line in zip(status, text) if " NCCL " in line and s != PARSED]
    assert missed == []


@pytest.mark.parametrize("version", ["2.18.3", "2.21.5", "2.27.7"])
def test_healthy_ib_job_fires_no_nccl_warning(tmp_path, version):
    _, per_rank = two_node_job(version)
    run = write_run(tmp_path, interleaved(per_rank, lambda rank: f"gpu-node-{rank // 2 + 1}: "))  # DeepSpeed/pdsh
    assert_all_nccl_lines_parsed(run)
    findings = nccl_findings(run)
    assert {rule: sev for rule, sev in findings.items() if sev >= Severity.WARNING} == {}
    assert not {"TL101", "TL107", "TL108"} & set(findings)


def test_healthy_227_job_with_timestamps_on_every_level_behind_torchrun(tmp_path):
    """NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T.%3f] ', torchrun --tee 3."""
    _, per_rank = two_node_job("2.27.7")
    stamped = [
        [f"[2025-06-02 09:14:{10 + i // 100:02d}.{i % 100 * 7:03d}] {line}" for i, line in enumerate(lines)]
        for lines in per_rank
    ]
    run = write_run(tmp_path, interleaved(stamped, lambda rank: f"[default{rank % 2}]:"))
    assert_all_nccl_lines_parsed(run)
    assert {rule: sev for rule, sev in nccl_findings(run).items() if sev >= Severity.WARNING} == {}
    status, tables = ingest(run / "train.log")
    events = tables["nccl_events"]
    assert events["ts"].null_count() == 0 and set(events["host"]) == {"gpu-node-1", "gpu-node-2"}
    assert set(tables["nccl_channels"].filter(pl.col("transport") == "NET")["net"]) == {"IB"}


def test_socket_fallback_in_219_wording_behind_open_mpi_tags(tmp_path):
    _, per_rank = two_node_job("2.19.3", hcas=())  # `NET/IB : No device found.` -> `Using network Socket`
    run = write_run(tmp_path, interleaved(per_rank, lambda rank: f"[1,{rank}]<stdout>:"))
    assert_all_nccl_lines_parsed(run)
    findings = nccl_findings(run)
    assert findings["TL101"] is Severity.CRITICAL  # channels cross nodes over TCP
    assert "TL107" not in findings and "TL108" not in findings


def test_socket_fallback_by_ib_disable_in_216_wording_behind_ray(tmp_path):
    _, per_rank = two_node_job("2.16.5", env=(("NCCL_IB_DISABLE", "1"),))
    run = write_run(
        tmp_path, interleaved(per_rank, lambda rank: f"(RayTrainWorker pid={9000 + rank}, ip=10.1.0.{rank // 2 + 1}) ")
    )
    assert_all_nccl_lines_parsed(run)
    findings = nccl_findings(run)
    assert findings["TL101"] is Severity.CRITICAL and "TL102" in findings


@pytest.mark.parametrize("version", ["2.28.9", "2.23.4", "2.18.3"])
def test_completion_errors_behind_pdsh_prefixes(tmp_path, version):
    comm, per_rank = two_node_job(version)
    proc, peer = comm.members[2].proc, comm.members[1].proc
    err = IbError(f"{peer.host.ip}<48133>", 12, 129, "Send", "fe80::1", "fe80::2", "mlx5_0")
    flush = IbError(f"{peer.host.ip}<48133>", 5, 249, "Recv", "fe80::1", "fe80::2", "mlx5_0", opcode=128)
    when = datetime(2025, 6, 2, 9, 20, 1)
    per_rank[2] += ib_completion_error(proc, err, when) + ib_completion_error(proc, flush, when)
    run = write_run(tmp_path, interleaved(per_rank, lambda rank: f"gpu-node-{rank // 2 + 1}: "))
    assert_all_nccl_lines_parsed(run)
    findings = nccl_findings(run)
    assert findings["TL107"] is Severity.CRITICAL
    assert "TL101" not in findings
    _, tables = ingest(run / "train.log")
    errors = tables["nccl_errors"].filter(pl.col("kind") == "ib_completion")
    assert errors.select("host", "status", "vendor_err", "peer").rows() == [
        ("gpu-node-2", 12, 129, "10.1.0.1<48133>"), ("gpu-node-2", 5, 249, "10.1.0.1<48133>")
    ]  # fmt: skip


def test_completion_error_quoted_by_pytorch_only(tmp_path):
    """NCCL_DEBUG unset: the only trace of the IB error is PyTorch's DistBackendError."""
    run = write_run(
        tmp_path,
        [
            "[rank2]: Traceback (most recent call last):",
            '[rank2]:   File "train.py", line 88, in <module>',
            "[rank2]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027, remote process exited or there was a network error, NCCL version 2.21.5",
            f"[rank2]: {REMOTE} ",
            "[rank2]: Last error:",
            "[rank2]: NET/IB : Got completion from peer 10.1.0.2<48133> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.0.3 remoteGids::ffff:10.1.0.2",
        ],
    )
    findings = nccl_findings(run)
    assert findings["TL107"] is Severity.CRITICAL and findings["TL109"] is Severity.CRITICAL


@pytest.mark.parametrize(
    "prefix",
    [lambda rank: f"[default{rank % 2}]:", lambda rank: f"gpu-node-{rank // 2 + 1}: ", lambda rank: ""],
    ids=["torchrun", "pdsh", "plain"],
)
def test_watchdog_timeout_after_a_healthy_init(tmp_path, prefix):
    _, per_rank = two_node_job("2.21.5")
    when = datetime(2025, 6, 2, 9, 40, 0)
    work = pytorch.Work(seq=4711, op_type="_ALLGATHER_BASE", numel=65536)
    for rank in (0, 1, 3):  # rank 2 never reached the collective
        per_rank[rank] += pytorch.watchdog_timeout(rank, work, 600_000 + 40 * rank, when, 1_000_000 * rank)
    run = write_run(tmp_path, interleaved(per_rank, prefix))
    assert_all_nccl_lines_parsed(run)
    findings = nccl_findings(run)
    assert findings["TL108"] is Severity.CRITICAL
    assert "TL107" not in findings and "TL101" not in findings
    (timeout,) = [f for f in analyze(run).findings if f.rule_id == "TL108"]
    assert "_ALLGATHER_BASE SeqNum=4711" in timeout.summary and timeout.ranks == [0, 1, 3]
