"""Error lines as people paste them (issue 11), written from the issue's descriptions: each is
read into the right kind, its finding fires, and the findings it must not trigger stay quiet."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracelens.analyze import analyze

WATCHDOG = (
    "[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, "
    "NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
)


def _analyze(tmp_path: Path, text: str, name: str = "node01/train.log"):
    path = tmp_path / "run" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return analyze(tmp_path / "run")


def _fired(analysis) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in analysis.findings:
        out.setdefault(f.rule_id, []).append(f)
    return out


def _account(analysis) -> dict:
    (row,) = analysis.tables["inputs"].iter_rows(named=True)
    return row


# -- C++ exception wrappers around watchdog and NCCL errors -----------------------------------------


@pytest.mark.parametrize(
    "lines",
    [
        [
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  [PG 3 Rank 5] Process group watchdog thread terminated with exception: {WATCHDOG}",
            "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most recent call first):",
        ],
        [
            "[default5]:terminate called after throwing an instance of 'std::runtime_error'",
            f"[default5]:  what():  NCCL watchdog thread terminated with exception: {WATCHDOG}",
        ],
        [f"c10::DistBackendError: {WATCHDOG}"],
        [
            f"torch.distributed.DistBackendError: [PG 3 Rank 5] Process group watchdog thread terminated with exception: {WATCHDOG}"
        ],
        [f"RuntimeError: {WATCHDOG}"],
    ],
)
def test_watchdog_timeouts_inside_cpp_exception_wrappers_fire_tl108(tmp_path: Path, lines: list[str]):
    analysis = _analyze(tmp_path, "\n".join(lines) + "\n")
    (finding,) = _fired(analysis)["TL108"]
    assert "_ALLGATHER_BASE SeqNum=9141" in finding.summary and "Timeout(ms)=600000" in finding.summary
    assert finding.ranks == [5]
    errors = analysis.tables["nccl_errors"]
    assert errors.filter(pl.col("kind") == "watchdog_timeout")["ran_ms"].to_list() == [600020]
    assert _account(analysis)["parsed"] >= 1


def test_the_terminate_line_itself_is_read():
    from tracelens.ingest.nccl.log import parse_body

    assert parse_body("terminate called after throwing an instance of 'c10::DistBackendError'")[0] == "pt_terminate"


# -- GPUDirect RDMA on the socket transport ----------------------------------------------------------

SOCKET_RUN = """node01:100:100 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
node01:100:100 [0] NCCL INFO NET/IB : No device found.
node01:100:100 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0:10.0.0.1<0>
node01:100:100 [0] NCCL INFO Using network Socket
node01:100:105 [0] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 0 'enp1s0f0'
node01:100:105 [0] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 1 'lo'
node01:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""


def test_socket_transport_gdr_lines_never_fire_tl104(tmp_path: Path):
    assert "TL104" not in _fired(_analyze(tmp_path, SOCKET_RUN))


def test_ib_gdr_disabled_still_fires_tl104(tmp_path: Path):
    ib = """node01:100:100 [0] NCCL INFO Using network IB
node01:100:105 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'
node01:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
"""
    assert "TL104" in _fired(_analyze(tmp_path, ib))


# -- CUDA, NVML and out-of-memory errors are their own finding, never a network failure -------------

CUDA_BUILD = """node01:100:100 [0] NCCL INFO Using network Socket

node01:100:100 [0] enqueue.cc:215 NCCL WARN Cuda failure 'invalid device function'
node01:100:100 [0] NCCL INFO enqueue.cc:1050 -> 1
RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, unhandled cuda error, NCCL version 2.10.3
ncclUnhandledCudaError: Call to CUDA function failed.
"""


def test_an_nccl_build_without_the_gpus_architecture_fires_tl110_not_tl109(tmp_path: Path):
    fired = _fired(_analyze(tmp_path, CUDA_BUILD))
    assert "TL109" not in fired
    (finding,) = fired["TL110"]
    assert finding.title == "CUDA errors" and "not the network" in finding.summary


@pytest.mark.parametrize(
    "line, title",
    [
        ("node01:100:100 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'", "GPU out-of-memory errors"),
        (
            "node01:100:100 [0] include/alloc.h:48 NCCL WARN Failed to CUDA calloc 2097152 bytes",
            "GPU out-of-memory errors",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB",
            "GPU out-of-memory errors",
        ),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "CUDA errors"),
        (
            "node01:100:100 [0] misc/nvmlwrap.cc:187 NCCL WARN NVML failure 999 'Unknown Error'",
            "NVML (GPU management library) errors",
        ),
    ],
)
def test_cuda_nvml_and_oom_errors_are_tl110(tmp_path: Path, line: str, title: str):
    fired = _fired(_analyze(tmp_path, line + "\n"))
    assert [f.title for f in fired["TL110"]] == [title]
    assert "TL109" not in fired


def test_a_socket_failure_is_tl109_not_tl110(tmp_path: Path):
    text = "node01:100:100 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<43000> failed : Connection refused\n"
    fired = _fired(_analyze(tmp_path, text))
    assert "TL109" in fired and "TL110" not in fired


# -- NCCL 2.2-era WARN lines without the word NCCL ----------------------------------------------------


def test_pre_2_3_warn_lines_are_read_as_socket_failures(tmp_path: Path):
    text = """node03:3345:3345 [0] INFO NET : Using interface eth0:10.0.0.3<0>

node03:3345:3412 [0] include/socket.h:360 WARN Call to connect failed : Connection timed out

node03:3345:3413 [0] include/socket.h:371 WARN Connection closed by remote peer
"""
    analysis = _analyze(tmp_path, text)
    errors = analysis.tables["nccl_errors"]
    assert errors["kind"].to_list() == ["socket", "socket"] and errors["host"].to_list() == ["node03", "node03"]
    (finding,) = _fired(analysis)["TL109"]
    assert "2 socket connection failures" in finding.summary
    assert _account(analysis)["unrecognized"] == 0


# -- NCCL 2.26+ lines with a platform timestamp and NCCL's own, in every kind -------------------------

PLATFORM = "2025-01-14T03:12:55.120Z "


@pytest.mark.parametrize(
    "record, rule, check",
    [
        (
            "[2025-01-14 03:12:55] node01:200:290 [0] transport/net_ib.cc:180 NCCL WARN NET/IB : mlx5_ib0:1 async fatal event "
            "on QP (0x7f69f01519a8): local access violation work queue error",
            "TL111",
            "QP fatal",
        ),
        (
            "[2025-01-14 03:12:55] node01:200:290 [0] transport/net_ib.cc:2121 (ncclIbTest) NCCL WARN NET/IB: Got completion "
            "from peer 10.0.0.2<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 "
            "remoteGids::ffff:10.0.0.2 hca mlx5_0",
            "TL107",
            "IBV_WC_RETRY_EXC_ERR (12)",
        ),
        (
            "[2025-01-14 03:12:55.118] node01:200:200 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer node02<34567>",
            "TL109",
            "socket connection failures",
        ),
        (
            "[2025-01-14 03:12:55] node01:200:290 [0] transport/net_ib.cc:1500 NCCL WARN communicator encountered a fatal error "
            "(detected in ncclIbTest)",
            "TL111",
            "device fatal",
        ),
    ],
)
def test_double_timestamps_are_read_in_every_kind(tmp_path: Path, record: str, rule: str, check: str):
    analysis = _analyze(tmp_path, f"{PLATFORM}{record}\n")
    (finding,) = _fired(analysis)[rule]
    assert check in finding.summary
    (ts,) = analysis.tables["nccl_errors"]["ts"].to_list()
    assert str(ts).startswith("2025-01-14 03:12:55")  # NCCL's own time, taken over the platform's
    assert _account(analysis)["unrecognized"] == 0


def test_double_timestamps_on_info_lines(tmp_path: Path):
    text = (
        f"{PLATFORM}[2025-01-14 03:12:54.900] node01:200:200 [0] NCCL INFO Using network IB\n"
        f"{PLATFORM}[2025-01-14 03:12:54.901] node01:200:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n"
    )
    analysis = _analyze(tmp_path, text)
    channels = analysis.tables["nccl_channels"]
    assert channels["gdr"].to_list() == [True] and str(channels["ts"][0]).startswith("2025-01-14 03:12:54.901")
    assert _account(analysis)["parsed"] == 2


# -- IB async events: port error, QP fatal, CQ error, device fatal -----------------------------------


def test_ib_async_events_are_their_own_finding_by_class(tmp_path: Path):
    text = """node01:1:2 [0] transport/net_ib.cc:110 NCCL WARN NET/IB : Got async event : port error
node01:1:2 [0] transport/net_ib.cc:110 NCCL WARN NET/IB : mlx5_0:1 async fatal event: CQ error
node01:1:2 [0] transport/net_ib.cc:110 NCCL WARN NET/IB : mlx5_0:1 Got async error event: local catastrophic error
node01:1:2 [0] transport/net_ib.cc:180 NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x55d0): local work queue catastrophic error
"""
    fired = _fired(_analyze(tmp_path, text))
    (finding,) = fired["TL111"]
    for part in ("1 x port error", "1 x CQ error", "1 x device fatal", "1 x QP fatal"):
        assert part in finding.summary
    assert "TL109" not in fired and "TL110" not in fired


# -- Pasted text: Markdown quotes and links, HTML entities, chat clients ------------------------------


def test_a_log_pasted_in_a_markdown_quote_with_links_and_entities_is_read(tmp_path: Path):
    text = """> node02:77:77 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:[10.0.0.2](http://10.0.0.2)&lt;0&gt;
>
> node02:77:79 [1] transport/[net_ib.cc:1909](http://net_ib.cc:1909/) NCCL WARN NET/IB : Got completion from peer [10.0.0.3](http://10.0.0.3)&lt;45123&gt; with error 12, opcode 0, len 0, vendor err 129 (Recv)
> node02:77:79 [1] NCCL INFO transport/[net.cc:1298](http://net.cc:1298/) -&gt; 6
"""
    analysis = _analyze(tmp_path, text)
    (finding,) = _fired(analysis)["TL107"]
    assert "10.0.0.3<45123>" in finding.summary and "IBV_WC_RETRY_EXC_ERR (12)" in finding.summary
    row = _account(analysis)
    assert row["unrecognized"] == 0 and row["parsed"] == 3


@pytest.mark.parametrize(
    "prefix",
    ["[10:32 AM] Jane Doe: ", "jdoe  10:32 AM  ", "Jane Doe — Today at 10:32 ", "[2025-01-14 10:32:01] <jdoe> "],
)
def test_chat_clients_timestamps_and_names_before_the_lines(tmp_path: Path, prefix: str):
    text = (
        f"{prefix}node01:100:100 [0] NCCL INFO Using network IB\n"
        f"{prefix}node01:100:101 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer node02<34567>\n"
        f"{prefix}[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] {WATCHDOG}\n"
    )
    analysis = _analyze(tmp_path, text)
    fired = _fired(analysis)
    assert "TL108" in fired and "TL109" in fired
    assert analysis.tables["nccl_errors"].filter(pl.col("kind") == "socket")["host"].to_list() == ["node01"]
