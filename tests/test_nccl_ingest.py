"""NCCL log ingest: envelopes, launcher prefixes, accounting, and the six nccl_* tables.

Expected values were read off the quoted lines themselves. Synthetic lines follow
docs/formats/nccl.md; corpus tests read ../shared/corpus/nccl when present.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.nccl import ingest, ingest_text
from tracelens.ingest.text.lines import IGNORED, NOT_MINE, PARSED, UNRECOGNIZED

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "nccl"
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"real-log corpus not found at {CORPUS}")


def corpus(name: str) -> tuple[list[int], dict[str, pl.DataFrame]]:
    return ingest(next(CORPUS.glob(f"{name}_*.log")))


def row(table: pl.DataFrame, line: int) -> dict:
    return table.filter(pl.col("line") == line).to_dicts()[0]


# ------------------------------------------------------------------ corpus-wide


@needs_corpus
def test_corpus_classifies_at_least_98_percent_of_records():
    parsed = unrecognized = 0
    samples = []
    for path in sorted(CORPUS.glob("*.log")):
        status, _ = ingest(path)  # also: no file raises
        parsed += status.count(PARSED)
        unrecognized += status.count(UNRECOGNIZED)
        lines = path.read_text(errors="replace").splitlines()
        samples += [f"{path.name}:{i + 1}: {lines[i]}" for i, s in enumerate(status) if s == UNRECOGNIZED]
    assert parsed > 600
    assert parsed / (parsed + unrecognized) >= 0.98, "\n".join(samples)


@needs_corpus
def test_libsharp_lines_are_not_nccl_records():
    status, _ = corpus("059")
    lines = next(CORPUS.glob("059_*.log")).read_text().splitlines()
    sharp = [s for s, text in zip(status, lines) if text.startswith("[node:0:")]
    assert sharp and set(sharp) == {NOT_MINE}


# ------------------------------------------------------------------ envelope and prefixes


@pytest.mark.parametrize(
    ("prefix", "host"),
    [
        ("", None),
        ("node07: ", "node07"),  # pdsh (DeepSpeed multi-node)
        ("[1,0]<stdout>:", None),  # Open MPI --tag-output
        ("[rank0]:", None),  # torchrun --role rank --tee
        ("[default0]:", None),  # torchrun --tee default role
        ("(pid=21065) ", None),  # Ray worker
        ("(RayTrainWorker pid=355353, ip=10.0.0.5) ", None),
        ("[3] ", None),  # mpirun rank tag
        ("[0m ", None),  # ANSI residue
        ("  0%|          | 0/400000 [00:00<?, ?it/s]", None),  # tqdm junk, no newline
        ("451 ", None),  # editor line numbers
    ],
)
def test_launcher_prefixes_are_split_off(tmp_path, prefix, host):
    status, tables = ingest_text(tmp_path, f"{prefix}gpu-node-3:4052:4122 [2] NCCL INFO Using network IB")
    assert status == [PARSED]
    event = tables["nccl_events"].row(0, named=True)
    assert (event["host"], event["pid"], event["tid"], event["cuda_dev"]) == ("gpu-node-3", 4052, 4122, 2)
    assert (event["prefix"], event["kind"], event["level"], event["message"]) == (
        prefix,
        "network",
        "INFO",
        "Using network IB",
    )
    net = tables["nccl_net"].row(0, named=True)
    assert (net["what"], net["name"], net["host"]) == ("network", "IB", "gpu-node-3")
    pytorch = "[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600003 milliseconds before timing out."
    _, tables = ingest_text(tmp_path, prefix + pytorch)
    assert tables["nccl_errors"]["host"].to_list() == [host]  # PyTorch lines name no host but pdsh's


def test_old_and_prefix_stripped_envelopes(tmp_path):
    status, tables = ingest_text(
        tmp_path,
        "nmyjs-202-75:24499:24701 [0] INFO NET/IB: [0] mlx4_0:1/IB",  # NCCL 2.2: no NCCL word
        "[3] NCCL INFO AllReduce: opCount 1 sendbuff 0x7f recvbuff 0x7f count 8 datatype 7 op 0 root 0 comm 0x7f [nranks=16] stream 0x7f",
        "INFO:tensorflow:Running local_init_op.",
    )
    assert status == [PARSED, PARSED, NOT_MINE]
    events = tables["nccl_events"]
    assert events["kind"].to_list() == ["ib_device", "coll_op"]
    assert events["host"].to_list() == ["nmyjs-202-75", None]
    assert events["cuda_dev"].to_list() == [0, 3]


@needs_corpus
def test_glued_line_after_an_empty_record_reads_the_second():
    # learnfair062:40507:40644 [2] NCCL INFO learnfair062:40515:40515 [6] NCCL INFO Using internal Network IB
    _, tables = corpus("001")
    event = row(tables["nccl_events"], 6)
    assert (event["pid"], event["cuda_dev"], event["kind"]) == (40515, 6, "network")


# ------------------------------------------------------------------ timestamps


def test_nccl_and_dated_wrapper_timestamps_become_ts(tmp_path):
    _, tables = ingest_text(
        tmp_path,
        "",
        "[2025-03-01 10:00:07] h1:1:2 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer h2<1234>",
        "[2024-04-18 10:41:06,648] h1:1:2 [0] NCCL INFO Using network Socket",
        " 2025-02-18 12:54 h1:1:2 [7] NCCL INFO misc/socket.cc:47 -> 3",
        "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
        "h1:1:2 [0] NCCL INFO Using network Socket",
    )
    events = tables["nccl_events"]
    utc = timezone.utc
    assert events["ts"].to_list() == [
        datetime(2025, 3, 1, 10, 0, 7, tzinfo=utc),
        datetime(2024, 4, 18, 10, 41, 6, 648000, tzinfo=utc),
        datetime(2025, 2, 18, 12, 54, tzinfo=utc),
        None,  # c10's MMDD has no year: left to the timeline stage
        None,
    ]
    assert events["ts_quality"].to_list() == ["exact", "exact", "exact", "none", "none"]
    assert events["prefix"].to_list()[:3] == ["", "[2024-04-18 10:41:06,648] ", " 2025-02-18 12:54 "]


@needs_corpus
def test_nccl_timestamp_behind_a_ray_actor_prefix():
    status, tables = corpus("062")
    # [..:19.085] (ActorClassName=..., pid=46627)[2026-04-14 21:28:19.007] g340-...
    event = row(tables["nccl_events"], 1)
    assert event["ts"] == datetime(2026, 4, 14, 21, 28, 19, 7000, tzinfo=timezone.utc)
    assert event["prefix"].endswith("pid=46627)") and event["host"] == "g340-cd51-7700-58b4-b0e2-29f6-d319"
    assert status[3] == IGNORED  # the prefix-only line is the WARN's blank line


# ------------------------------------------------------------------ accounting


@needs_corpus
@pytest.mark.parametrize(("name", "blank_line"), [("004", 3), ("032", 4)])
def test_warn_blank_lines_are_ignored(name, blank_line):
    status, _ = corpus(name)  # 004: empty line; 032: "[0m " before "[0m ... NCCL WARN Failed to open libibverbs.so[.1]"
    assert status[blank_line - 1] == IGNORED
    assert status[blank_line] == PARSED


def test_unknown_body_is_unrecognized_and_garbage_is_not_mine(tmp_path):
    status, tables = ingest_text(
        tmp_path,
        "h1:1:2 [0] NCCL INFO Something NCCL never printed",
        "\x00\x01 garbage NCCL",
        "[E ProcessGroupNCCL.cpp:1] ???",
        "",
    )
    assert status == [UNRECOGNIZED, NOT_MINE, UNRECOGNIZED, NOT_MINE]
    assert tables["nccl_events"]["kind"].to_list() == ["unknown", "unknown"]


# ------------------------------------------------------------------ channels


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("Ring 00 : 1 -> 0 via NET/IB/0", (0, None, 1, 0, None, None, None, "NET", "IB", 0, None, False)),  # 2.3
        ("Ring 00 : 0 -> 1 [send] via NET/Socket/0", (0, None, 0, 1, None, None, "send", "NET", "Socket", 0, None, False)),  # 2.4
        ("Ring 01 : 2[2] -> 3[3] via P2P/IPC", (1, None, 2, 3, "2", "3", None, "P2P/IPC", None, None, None, None)),  # 2.3/2.4
        ("Channel 00 : 1[1e0] -> 0[1e0] [receive] via NET/Socket/0", (0, None, 1, 0, "1e0", "1e0", "receive", "NET", "Socket", 0, None, False)),  # 2.7
        ("Channel 01 : 7[d0000] -> 2[4a000] [send] via NET/IB/3/GDRDMA", (1, None, 7, 2, "d0000", "4a000", "send", "NET", "IB", 3, None, True)),
        ("Channel 02/1 : 3[3] -> 11[3] [send] via NET/IB/1(9)/GDRDMA/Shared", (2, 1, 3, 11, "3", "3", "send", "NET", "IB", 1, 9, True)),
        ("Channel 05/0 : 1[1] -> 0[0] via P2P/CUMEM", (5, 0, 1, 0, "1", "0", None, "P2P/CUMEM", None, None, None, None)),  # 2.18+
        ("Channel 03 : 5[99000] -> 4[93000] via P2P/direct pointer/read", (3, None, 5, 4, "99000", "93000", None, "P2P/direct", None, None, None, None)),
        ("Channel 20 : 5[5] -> 4[4] via SHM/direct/direct", (20, None, 5, 4, "5", "4", None, "SHM", None, None, None, None)),
        ("CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA", (5, 0, 5, None, None, None, "receive", "COLLNET", "SHARP", 5, None, True)),
    ],
)  # fmt: skip
def test_channel_lines_of_every_era(tmp_path, body, expected):
    _, tables = ingest_text(tmp_path, f"h1:10:11 [0] NCCL INFO {body}")
    columns = [
        "channel",
        "conn",
        "src_rank",
        "dst_rank",
        "src_dev",
        "dst_dev",
        "direction",
        "transport",
        "net",
        "nic",
        "proxy_rank",
        "gdr",
    ]
    channel = tables["nccl_channels"].row(0, named=True)
    assert tuple(channel[c] for c in columns) == expected
    assert channel["via"] == body.split(" via ")[1]


@needs_corpus
def test_socket_fallback_gives_socket_rows():
    # <cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
    _, tables = corpus("005")
    channel = row(tables["nccl_channels"], 8)
    assert (channel["src_rank"], channel["dst_rank"], channel["net"], channel["nic"], channel["gdr"]) == (
        15,
        6,
        "Socket",
        3,
        False,
    )
    # Failed to open libibverbs.so[.1] -> NET/Socket : Using [0]ens5:... -> Using network Socket
    _, tables = corpus("032")
    net = tables["nccl_net"]
    assert net.filter(pl.col("what") == "network")["name"].to_list() == ["Socket"]
    assert net.filter(pl.col("what") == "ib_missing")["name"].to_list() == ["no_libibverbs"]
    assert net.filter(pl.col("what") == "socket_if")["address"].to_list() == [
        "172.31.0.137",
        "fe80::14ad:64ff:fe64:b31e%veth75fa783",
    ]
    assert tables["nccl_errors"]["kind"].to_list() == ["ib_unavailable"]


# ------------------------------------------------------------------ network facts, env, comms


@needs_corpus
def test_network_facts():
    _, tables = corpus("071")  # NET/IB : Using [0]ibP111p0s0:1/IB [1]rdmaP1111p0s2:1/RoCE [RO]; OOB eth0:10.2.0.4<0>
    net = tables["nccl_net"].select("what", "name", "port", "link_layer", "address").rows()
    assert sorted(net, key=str) == sorted(
        [
            ("ib_device", "ibP111p0s0", 1, "IB", None),
            ("ib_device", "rdmaP1111p0s2", 1, "RoCE", None),
            ("oob_if", "eth0", None, None, "10.2.0.4"),
        ],
        key=str,
    )
    _, tables = corpus("067")  # NET/IB: [11] mlx5_11:uverbs11:1/RoCE provider=Mlx5 speed=400000 ...
    device = tables["nccl_net"].filter(pl.col("what") == "ib_device").row(0, named=True)
    assert (device["name"], device["port"], device["link_layer"]) == ("mlx5_11", 1, "RoCE")
    _, tables = corpus("050")  # 2.3: NET/IB : Using interface ib0 for sideband communication
    assert row(tables["nccl_net"], 2)["what"] == "oob_if" and row(tables["nccl_net"], 2)["name"] == "ib0"
    _, tables = corpus("017")  # Bootstrap list cut by NCCL's 1024-byte buffer mid-entry
    bootstrap = tables["nccl_net"].filter(pl.col("what") == "bootstrap_if")
    assert bootstrap["name"].to_list()[:3] == ["enp7s0", "virbr0", "vethee19468"]
    assert bootstrap["address"][2] == "fe80::4463:98ff:fe1a:66c9%vethee19468"


@needs_corpus
def test_env_settings():
    _, tables = corpus("088")
    assert (row(tables["nccl_env"], 1)["name"], row(tables["nccl_env"], 1)["value"]) == ("NCCL_IB_TIMEOUT", "18")
    _, tables = corpus("023")
    assert (row(tables["nccl_env"], 2)["name"], row(tables["nccl_env"], 2)["value"]) == ("NCCL_SOCKET_IFNAME", "bond0")
    _, tables = corpus("067")
    assert row(tables["nccl_env"], 7)["value"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_11"


def test_comms_take_the_process_version_else_the_bare_one(tmp_path):
    _, tables = ingest_text(
        tmp_path,
        "NCCL version 2.21.5+cuda12.4",
        "h1:7:7 [0] NCCL INFO NCCL version 2.23.4+cuda12.6",
        "h1:7:9 [0] NCCL INFO ncclCommInitRank comm 0x55a rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0xab - Init START",
        "h1:8:8 [1] NCCL INFO comm 0x55b rank 1 nranks 2 cudaDev 1 busId 1a000 - Destroy COMPLETE",
        "h1:8:8 [1] NCCL INFO rank 1 nranks 2",
    )
    comms = tables["nccl_comms"].select(
        "pid", "comm_id", "comm_hash", "rank", "nranks", "cuda_dev", "nvml_dev", "bus_id", "event", "nccl_version"
    )
    assert comms.rows() == [
        (7, "0x55a", "0xab", 0, 2, 0, 0, "18000", "init_start", "2.23.4"),
        (8, "0x55b", None, 1, 2, 1, None, "1a000", "destroy", "2.21.5"),
        (8, None, None, 1, 2, 1, None, None, "rank_info", "2.21.5"),
    ]
    version = tables["nccl_events"].row(0, named=True)
    assert (version["level"], version["kind"], version["host"], version["pid"]) == ("VERSION", "version", None, None)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("warn", "expected"),
    [
        # 2.3-2.9: no peer
        ("transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
         (12, "IBV_WC_RETRY_EXC_ERR", 1, 129, None)),
        # 2.10-2.19
        ("transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with error 5, opcode 0, len 0, vendor err 249 (Recv)",
         (5, "IBV_WC_WR_FLUSH_ERR", 0, 249, "10.2.0.5<33092>")),
        # 2.20-2.21
        ("transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer 10.0.1.12<48133> with status=4 opcode=129 len=0 vendor err 81 (Recv) localGid ::ffff:10.0.1.11 remoteGids::ffff:10.0.1.12",
         (4, "IBV_WC_LOC_PROT_ERR", 129, 81, "10.0.1.12<48133>")),
        # 2.22-2.28.3: `NET/IB:` and hca
        ("transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer fe80::1%ib0<53249> with status=13 opcode=0 len=4 vendor err 0 (Send) localGid fe80::2 remoteGidsfe80::1 hca mlx5_1",
         (13, "IBV_WC_RNR_RETRY_EXC_ERR", 0, 0, "fe80::1%ib0<53249>")),
        # 2.28.7+: symbolic status and opcode
        ("transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=65536 vendor_err=129 req_type=Send localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1 hca mlx5_0",
         (12, "IBV_WC_RETRY_EXC_ERR", 0, 129, "10.0.0.1<50000>")),
        # 2.30.7: the WARN names the function
        ("transport/net_ib/p2p.cc:688 (ncclIbTest) NCCL WARN NET/IB: Got completion from peer 10.0.0.1<50000> with status=IBV_WC_REM_ACCESS_ERR(10) opcode=IBV_WC_RECV(128) vendor_err=136 localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1 hca mlx5_0",
         (10, "IBV_WC_REM_ACCESS_ERR", 128, 136, "10.0.0.1<50000>")),
    ],
)  # fmt: skip
def test_ib_completion_errors_of_every_era(tmp_path, warn, expected):
    status, tables = ingest_text(tmp_path, "", f"node-2:5776:5902 [0] {warn}")
    assert status == [IGNORED, PARSED]
    error = tables["nccl_errors"].row(0, named=True)
    assert error["kind"] == "ib_completion"
    assert (error["status"], error["status_name"], error["opcode"], error["vendor_err"], error["peer"]) == expected


@needs_corpus
def test_hard_wrapped_completion_error_is_joined():
    status, tables = corpus("071")  # "... with error 12, opcode 0, len" / "0, vendor err 129 (Recv)"
    assert status[1:3] == [PARSED, PARSED]
    error = tables["nccl_errors"].row(0, named=True)
    assert (error["status"], error["status_name"], error["vendor_err"], error["peer"]) == (
        12,
        "IBV_WC_RETRY_EXC_ERR",
        129,
        "10.2.0.5<33092>",
    )


@needs_corpus
def test_watchdog_timeouts_old_and_new():
    # [E ProcessGroupNCCL.cpp:737] [Rank 1] ... SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212
    _, tables = corpus("013")
    error = row(tables["nccl_errors"], 1)
    assert (error["kind"], error["rank"], error["seq"], error["op_type"], error["timeout_ms"], error["ran_ms"]) == (
        "watchdog_timeout",
        1,
        469508,
        "ALLREDUCE",
        1800000,
        1802212,
    )
    assert row(tables["nccl_events"], 1)["level"] == "ERROR"
    # [rank0]:[E1206 ...] [Rank 0] ... SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, ..., Timeout(ms)=600000) ran for 600061
    _, tables = corpus("011")
    error = row(tables["nccl_errors"], 1)
    assert (error["rank"], error["seq"], error["op_type"], error["timeout_ms"], error["ran_ms"]) == (
        0,
        7753,
        "_REDUCE_SCATTER_BASE",
        600000,
        600061,
    )
    exception = row(tables["nccl_errors"], 2)  # [PG 1 Rank 0] Exception ... detected by watchdog at work: 7753
    assert (exception["kind"], exception["rank"], exception["seq"]) == ("watchdog_exception", 0, 7753)
    # [PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 120049
    _, tables = corpus("080")
    assert (row(tables["nccl_errors"], 2)["rank"], row(tables["nccl_errors"], 2)["seq"]) == (5, 120049)
    _, tables = corpus("082")  # [Rank 1] Work WorkNCCL(SeqNum=2521, ...) timed out in blocking wait.
    assert (
        row(tables["nccl_errors"], 2)["kind"] == "blocking_wait_timeout"
        and row(tables["nccl_errors"], 2)["seq"] == 2521
    )


@needs_corpus
def test_terminal_wrapped_watchdog_record_is_joined():
    # "...watchdog thread terminat" / "ed with exception: [Rank 1] ... NumelOut=112," / " Timeout(ms)=1800000) ran for 1800010 ..."
    status, tables = corpus("083")
    assert status[3:6] == [PARSED, PARSED, PARSED]
    assert status[6] == NOT_MINE  # "Exception raised from checkTimeout at ..." is PyTorch's, not a wrap
    error = row(tables["nccl_errors"], 4)
    assert (error["kind"], error["rank"], error["seq"], error["op_type"], error["timeout_ms"], error["ran_ms"]) == (
        "watchdog_timeout",
        1,
        4,
        "BROADCAST",
        1800000,
        1800010,
    )


@needs_corpus
def test_pytorch_nccl_runtime_error_and_other_warns():
    # RuntimeError: NCCL error in: .../ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL version 2.10.3
    _, tables = corpus("038")
    assert tables["nccl_errors"]["kind"].to_list() == ["nccl_runtime_error"]
    _, tables = corpus("031")
    assert tables["nccl_errors"]["kind"].to_list() == ["socket", "proxy", "socket", "proxy"]
    _, tables = corpus("029")  # ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed
    assert set(tables["nccl_errors"]["kind"]) == {"verbs_call"}
