"""Kinds of real pasted input a third round of public threads showed (issue 36), each as a
synthetic sample in the documented wording, and against the real corpus where it has one: read
into the right kind, its finding fired, and the findings it must not trigger quiet."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.helpers import corpus_dir
from tests.test_pastes import WATCHDOG, _account, _analyze, _fired
from tracelens.analyze import analyze
from tracelens.findings import Severity

# -- NCCL 2.3: the socket network named only by its device line ---------------------------------------

# synthetic, NCCL 2.3 wording: the socket network also runs 2.3's bootstrap, so `NET : Using interface`
# and `NET/Socket : N interfaces found` appear on IB runs too; `IP Interfaces` names the data network
NCCL_23_SOCKET = """node01:4101:4101 [0] NCCL INFO NET : Using interface lo:127.0.0.1<0>
node01:4101:4101 [0] NCCL INFO NET/Socket : 2 interfaces found
NCCL version 2.3.7+cuda9.2
node01:4101:4101 [0] NCCL INFO rank 0 nranks 2
node01:4101:4101 [0] NCCL INFO CUDA Dev 0, IP Interfaces : lo(SOC) eth0(PXB)
node02:5202:5202 [0] NCCL INFO NET : Using interface lo:127.0.0.1<0>
node02:5202:5202 [0] NCCL INFO NET/Socket : 2 interfaces found
node02:5202:5202 [0] NCCL INFO rank 1 nranks 2
node02:5202:5202 [0] NCCL INFO CUDA Dev 0, IP Interfaces : lo(SOC) eth0(PXB)
"""

NCCL_23_IB = """node01:4101:4101 [0] NCCL INFO NET : Using interface ib0:10.0.0.1<0>
node01:4101:4101 [0] NCCL INFO NET/IB : Using interface ib0 for sideband communication
node01:4101:4101 [0] NCCL INFO NET/IB: [0] mlx5_0:1/IB
node01:4101:4101 [0] NCCL INFO Using internal Network IB
node01:4101:4101 [0] NCCL INFO NET/Socket : 1 interfaces found
node01:4101:4101 [0] NCCL INFO CUDA Dev 0, IB Ports : mlx5_0/1(PIX)
node02:5202:5202 [0] NCCL INFO NET : Using interface ib0:10.0.0.2<0>
node02:5202:5202 [0] NCCL INFO CUDA Dev 0, IB Ports : mlx5_0/1(PIX)
"""


def test_nccl_23_socket_network_fires_tl101_and_its_loopback_tl105(tmp_path: Path):
    analysis = _analyze(tmp_path, NCCL_23_SOCKET)
    fired = _fired(analysis)
    (socket,) = fired["TL101"]
    assert socket.severity == Severity.CRITICAL and socket.hosts == ["node01", "node02"]
    (loopback,) = fired["TL105"]
    assert "socket lo:127.0.0.1" in loopback.summary and loopback.severity == Severity.CRITICAL
    net = analysis.tables["nccl_net"].filter(pl.col("what") == "network")
    assert net["name"].to_list() == ["Socket", "Socket"]
    assert _account(analysis)["unrecognized"] == 0


def test_nccl_23_ib_run_does_not_fire_tl101(tmp_path: Path):
    analysis = _analyze(tmp_path, NCCL_23_IB)
    assert "TL101" not in _fired(analysis)
    assert set(analysis.tables["nccl_net"].filter(pl.col("what") == "network")["name"]) == {"IB"}


def _corpus_run(tmp_path: Path, kind: str, *names: str):
    folder = corpus_dir(kind)
    run = tmp_path / "run"
    run.mkdir(parents=True)
    for name in names:
        (path,) = folder.glob(f"{name}*")
        (run / path.name).write_bytes(path.read_bytes())
    return analyze(run)


def test_corpus_nccl_23_and_24_device_lines_name_the_network(tmp_path: Path):
    ib_23 = _corpus_run(tmp_path / "a", "nccl", "001_")  # `CUDA Dev 2, IB Ports : mlx5_3/1(SOC) ...`
    assert "IB" in set(ib_23.tables["nccl_net"].filter(pl.col("what") == "network")["name"])
    assert "TL101" not in _fired(ib_23)
    ib_235 = _corpus_run(tmp_path / "b", "nccl", "050_")  # 2.3.5 IB run printing `NET/Socket : 1 interfaces found`
    assert "TL101" not in _fired(ib_235)
    socket_24 = _corpus_run(tmp_path / "c", "nccl", "035_")  # `CUDA Dev 6[6], Socket NIC distance :  PHB`
    nets = socket_24.tables["nccl_net"].filter(pl.col("what") == "network")
    assert nets["name"].to_list() == ["Socket"]
    assert "TL101" in _fired(socket_24)


# -- failures outside the data path: old socket wording and the OFI plugin ------------------------------


@pytest.mark.parametrize(
    "line, kind, part",
    [
        (  # NCCL 2.3-2.12 include/socket.h
            "node01:4101:4120 [0] include/socket.h:361 NCCL WARN Net : Socket creation failed : "
            "Address family not supported by protocol",
            "socket",
            "socket connection failures",
        ),
        (  # aws-ofi-nccl: its WARNs name the function where NCCL's name the file
            "node02:77:77 [0] nccl_net_ofi_init:1189 NCCL WARN NET/OFI No NIC info for dev 0",
            "plugin",
            "network plugin failures",
        ),
        (
            "node02:77:77 [0] ofi_init:1136 NCCL WARN NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
            "plugin",
            "network plugin failures",
        ),
    ],
)
def test_old_socket_and_plugin_failures_fire_tl109(tmp_path: Path, line: str, kind: str, part: str):
    analysis = _analyze(tmp_path, line + "\n")
    assert analysis.tables["nccl_errors"]["kind"].to_list() == [kind]
    (finding,) = _fired(analysis)["TL109"]
    assert part in finding.summary and finding.severity == Severity.CRITICAL


def test_corpus_ofi_plugin_chatter_is_no_failure(tmp_path: Path):
    # the EFA run's `NET/OFI Using aws-ofi-nccl 1.5.0aws`, `NET/OFI Selected Provider is efa` INFO lines
    analysis = _corpus_run(tmp_path, "host/nccltests", "eksblueprints_efa")
    assert "TL109" not in _fired(analysis)


# -- GPUDirect RDMA on EFA: the plugin's words, not the channels' ---------------------------------------

EFA_GDR_OFF = """ip-10-0-1-5:120:120 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
ip-10-0-1-5:120:120 [0] NCCL INFO Using network AWS Libfabric

ip-10-0-1-5:120:120 [0] nccl_net_ofi_create_plugin:812 NCCL WARN NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge
ip-10-0-1-5:120:130 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0
"""


def test_efa_gdr_disabled_in_the_plugins_words_fires_tl104(tmp_path: Path):
    (finding,) = _fired(_analyze(tmp_path, EFA_GDR_OFF))["TL104"]
    assert "GDR disabled on GDR-supported instance type" in finding.summary
    assert "without /GDRDMA" not in finding.summary  # an EFA channel without it is no evidence


def test_efa_channels_without_gdrdma_do_not_fire_tl104(tmp_path: Path):
    text = EFA_GDR_OFF.splitlines()
    healthy = "\n".join(line for line in text if "GDR disabled" not in line) + "\n"
    # NCCL's own per-device line names the plugin's network (2.18+): the plugin's words decide on EFA
    healthy += "ip-10-0-1-5:120:125 [0] NCCL INFO NET/AWS Libfabric : GPU Direct RDMA Disabled for HCA 0 'rdmap16s27'\n"
    analysis = _analyze(tmp_path, healthy)
    assert "TL104" not in _fired(analysis) and _account(analysis)["unrecognized"] == 0


def test_corpus_efa_run_on_instances_without_gdr_does_not_fire_tl104(tmp_path: Path):
    # 2 x g4dn (T4, no GPUDirect on EFA): every channel `via NET/AWS Libfabric/0`
    analysis = _corpus_run(tmp_path, "host/nccltests", "eksblueprints_efa")
    assert analysis.tables["nccl_channels"]["net"].unique().to_list() == ["AWS Libfabric"]
    assert "TL104" not in _fired(analysis)


# -- PyTorch's heartbeat monitor ----------------------------------------------------------------------

HEARTBEAT = (
    "[rank3]:[E1203 10:11:12.123456789 ProcessGroupNCCL.cpp:1427] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
    "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, "
    "and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), "
    "or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout "
    "would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or "
    "disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0)."
)


def _hard_wrapped(text: str, width: int) -> str:
    """A terminal's hard wrap: every `width` characters, words split where they fall."""
    return "\n".join(text[i : i + width] for i in range(0, len(text), width)) + "\n"


@pytest.mark.parametrize("text", [HEARTBEAT + "\n", _hard_wrapped(HEARTBEAT, 115), _hard_wrapped(HEARTBEAT, 116)])
def test_heartbeat_monitor_fires_tl108_even_hard_wrapped(tmp_path: Path, text: str):
    analysis = _analyze(tmp_path, text)
    (finding,) = _fired(analysis)["TL108"]
    assert finding.title == "NCCL watchdog stuck" and "stuck for 480 s" in finding.summary
    assert finding.ranks == [3]
    assert _account(analysis)["parsed"] == text.count("\n")  # every wrapped line is the record's


def test_heartbeat_inside_a_cpp_exception_and_with_the_prefix_twice(tmp_path: Path):
    stuck = HEARTBEAT.split("] [PG ID", 1)[1]
    text = (
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  [PG ID{stuck}\n"
        f"[rank3]:[F1203 10:11:13.000000000 ProcessGroupNCCL.cpp:1306] [PG ID 0 PG GUID 0(default_pg) Rank 3] [PG ID{stuck}\n"
    )
    (finding,) = _fired(_analyze(tmp_path, text))["TL108"]
    assert finding.title == "NCCL watchdog stuck"


def test_no_heartbeat_no_stuck_finding(tmp_path: Path):
    text = "[rank3]:[I1203 10:11:12.123456789 ProcessGroupNCCL.cpp:900] [PG ID 0 PG GUID 0(default_pg) Rank 3] ProcessGroupNCCL initialization options: size: 8\n"
    assert "TL108" not in _fired(_analyze(tmp_path, text))


# -- settings on a launcher's command line --------------------------------------------------------------

MPIRUN = """$ mpirun -np 16 -H node01:8,node02:8 --bind-to none -x NCCL_DEBUG=INFO -x NCCL_IB_DISABLE={value} -x LD_LIBRARY_PATH python train.py
node01:3001:3001 [0] NCCL INFO NET : Using interface eth0:10.0.0.1<0>
NCCL version 2.3.7+cuda9.2
node01:3001:3001 [0] NCCL INFO rank 0 nranks 16
node02:4001:4001 [0] NCCL INFO NET : Using interface eth0:10.0.0.2<0>
node02:4001:4001 [0] NCCL INFO rank 8 nranks 16
"""


def test_ib_disabled_only_on_the_mpirun_command_line_fires_tl102_and_tl101(tmp_path: Path):
    analysis = _analyze(tmp_path, MPIRUN.format(value=1))
    fired = _fired(analysis)
    assert "NCCL_IB_DISABLE" in fired["TL102"][0].summary and "TL101" in fired
    env = analysis.tables["nccl_env"].sort("name")
    assert env.select("name", "value").rows() == [("NCCL_DEBUG", "INFO"), ("NCCL_IB_DISABLE", "1")]
    assert _account(analysis)["unrecognized"] == 0


def test_ib_enabled_on_the_command_line_fires_nothing(tmp_path: Path):
    fired = _fired(_analyze(tmp_path, MPIRUN.format(value=0)))
    assert "TL102" not in fired and "TL101" not in fired


def test_mpich_genv_settings(tmp_path: Path):
    text = "mpiexec -n 16 -ppn 8 -genv NCCL_IB_DISABLE 1 -genv NCCL_SOCKET_IFNAME=eth0 -env NCCL_DEBUG INFO ./train\n"
    env = _analyze(tmp_path, text).tables["nccl_env"].sort("name")
    assert env.select("name", "value").rows() == [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_DISABLE", "1"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
    ]


def test_deepspeed_runner_exports_are_settings(tmp_path: Path):
    text = (
        "[2023-06-21 07:39:01,100] [INFO] [runner.py:555:main] cmd = pdsh -S -f 1024 -w worker-0,worker-1 "
        "export NCCL_IB_DISABLE=1; export PYTHONPATH=/job;  cd /job; /usr/bin/python -u -m deepspeed.launcher.launch "
        "--world_info=eyJ3b3JrZXItMCI6IFswXX0= --node_rank=%n train.py\n"
    )
    env = _analyze(tmp_path, text).tables["nccl_env"]
    assert env.select("name", "value").rows() == [("NCCL_IB_DISABLE", "1")]


# -- prefixes and forms seen in these pastes -----------------------------------------------------------


@pytest.mark.parametrize(
    "line, host, pid",
    [
        ("| 2024-12-04T05:27:42.076Z | ip-10-0-1-5:120:120 [0] NCCL INFO Using network IB", "ip-10-0-1-5", 120),
        # a collector's `<date time.us> host >> ` before a record whose host field is empty
        ("2024-12-04 05:27:43.123456 worker-9 >> :168:1228 [2] NCCL INFO Using network IB", "worker-9", 168),
        ("[36m(RayWorkerWrapper pid=3456)[0m ray-node-2:3456:3456 [1] NCCL INFO Using network IB", "ray-node-2", 3456),
        ("gpu-node-7 [stderr] gpu-node-7:900:900 [0] NCCL INFO Using network IB", "gpu-node-7", 900),
        ("2019-06-02T16:13:44.884Z: [1,12]<stdout>:hpc-12:4000:4000 [4] NCCL INFO Using network IB", "hpc-12", 4000),
    ],
)
def test_prefixes_before_nccl_records(tmp_path: Path, line: str, host: str, pid: int):
    analysis = _analyze(tmp_path, line + "\n")
    (row,) = analysis.tables["nccl_net"].iter_rows(named=True)
    assert (row["what"], row["name"], row["host"], row["pid"]) == ("network", "IB", host, pid)
    assert _account(analysis)["parsed"] == 1


def test_collector_host_before_a_pytorch_record(tmp_path: Path):
    line = f"2024-12-04 05:27:43.123456 worker-9 >> [rank5]:[E1204 05:27:43.123456789 ProcessGroupNCCL.cpp:616] {WATCHDOG}\n"
    (finding,) = _fired(_analyze(tmp_path, line))["TL108"]
    assert finding.hosts == ["worker-9"]


def test_bare_version_behind_a_torchrun_tag(tmp_path: Path):
    analysis = _analyze(tmp_path, "[default0]:NCCL version 2.18.1+cuda12.1\n")
    events = analysis.tables["nccl_events"]
    assert events.select("kind", "message").rows() == [("version", "NCCL version 2.18.1+cuda12.1")]


def test_coalesced_work_with_negative_numels_fires_tl108(tmp_path: Path):
    line = (
        "[rank1]:[E1203 10:11:12.123456789 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=98, OpType=COALESCED, NumelIn=-1, NumelOut=-1, Timeout(ms)=600000) ran for 600012 "
        "milliseconds before timing out.\n"
    )
    (finding,) = _fired(_analyze(tmp_path, line))["TL108"]
    assert "COALESCED SeqNum=98" in finding.summary


def test_watchdog_glued_to_extension_modules_and_split_in_a_number(tmp_path: Path):
    glued = WATCHDOG.replace("ran for 600020", "ran for 60\n0020")
    text = f"Extension modules: numpy.core._multiarray_umath, torch._C, torch._C._fft (total: 20)[rank5]:[E1203 10:11:12.123456789 ProcessGroupNCCL.cpp:1484] {glued}\n"
    analysis = _analyze(tmp_path, text)
    (finding,) = _fired(analysis)["TL108"]
    assert "ran up to 600020 ms" in finding.summary
    assert _account(analysis)["unrecognized"] == 0


def test_client_reregistration_is_information_not_a_fatal_event(tmp_path: Path):
    sm = "node01:1:2 [0] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_1:1 Got async event : client reregistration\n"
    (finding,) = _fired(_analyze(tmp_path, sm))["TL111"]
    assert finding.severity == Severity.INFO and "subnet-manager" in finding.summary
    port = sm.replace("client reregistration", "port error")
    (finding,) = _fired(_analyze(tmp_path / "b", port))["TL111"]
    assert finding.severity == Severity.CRITICAL and "1 x port error" in finding.summary


def test_wrong_magic_is_foreign_traffic_not_a_failure(tmp_path: Path):
    line = "node01:1:9 [0] misc/socket.cc:422 NCCL WARN socketFinalizeAccept: wrong magic 5454502f312e3120 != 3c9e0b7ac70a7b6c\n"
    (finding,) = _fired(_analyze(tmp_path, line))["TL109"]
    assert finding.severity == Severity.INFO and "not NCCL" in finding.summary


def test_ibv_create_cq_out_of_memory_is_a_verbs_failure(tmp_path: Path):
    line = (
        "node01:1:9 [0] misc/ibvwrap.cc:169 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory\n"
    )
    fired = _fired(_analyze(tmp_path, line))
    assert "IB verbs call failures" in fired["TL109"][0].summary and "TL110" not in fired


def test_ras_listener_on_loopback_does_not_fire_tl105(tmp_path: Path):
    text = """node01:1:1 [0] NCCL INFO RAS client listening socket at ::1<28028>
node01:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
node01:1:1 [0] NCCL INFO Using network IB
"""
    analysis = _analyze(tmp_path, text)
    assert "TL105" not in _fired(analysis) and _account(analysis)["unrecognized"] == 0
    lo = text.replace("eth0:10.0.0.1", "lo:127.0.0.1")
    assert "TL105" in _fired(_analyze(tmp_path / "b", lo))


def test_only_incidents_reach_the_network_timeline(tmp_path: Path):
    """Foreign traffic, subnet-manager events and a plugin's GPUDirect verdict are no incident; a stuck
    watchdog is a stall."""
    from tracelens.derived import RunContext

    text = (
        "[2025-01-14 03:12:54] node01:1:1 [0] platform_init:245 NCCL WARN NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge\n"
        "[2025-01-14 03:12:55] node01:1:9 [0] misc/socket.cc:422 NCCL WARN socketFinalizeAccept: wrong magic 1 != 2\n"
        "[2025-01-14 03:12:56] node01:1:2 [0] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_1:1 Got async event : client reregistration\n"
        "[2025-01-14 03:12:57] node01:1:2 [0] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_1:1 Got async event : port error\n"
        f"2025-01-14 03:20:57 {HEARTBEAT}\n"
    )
    analysis = _analyze(tmp_path, text)
    events = RunContext(analysis.tables).network_events.filter(pl.col("source") == "NCCL")
    assert events.select("cause", "what").rows() == [("link", "IB async event"), ("stall", "watchdog stuck")]


def test_ofi_plugin_version_skew_in_both_wordings_fires_tl106(tmp_path: Path):
    """aws-ofi-nccl names its version `Initializing aws-ofi-nccl 1.10.0-aws` (1.10+) or `Using aws-ofi-nccl
    1.5.0aws` (before): a second host on the older plugin, which printed no NCCL version line of its
    own, shows the skew in the plugin's older wording only (synthetic lines)."""
    text = (
        "node01:10:10 [0] NCCL INFO NCCL version 2.18.3+cuda12.2\n"
        "node01:10:10 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)\n"
        "node01:10:10 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.10.0-aws\n"
        "node02:20:20 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)\n"
        "node02:20:20 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.5.0aws\n"
    )
    analysis = _analyze(tmp_path, text)
    plugins = analysis.tables["nccl_net"].filter(pl.col("what") == "plugin")
    assert plugins.select("host", "name").rows() == [
        ("node01", "AWS Libfabric (v6)"),
        ("node01", "aws-ofi-nccl 1.10.0-aws"),
        ("node02", "AWS Libfabric (v6)"),
        ("node02", "aws-ofi-nccl 1.5.0aws"),
    ]
    (skew,) = _fired(analysis)["TL106"]
    assert skew.title == "NCCL network plugin versions differ across the run"
    assert skew.severity == Severity.CRITICAL and skew.hosts == ["node01", "node02"]
    assert skew.summary == (
        "aws-ofi-nccl: 1.5.0 on node02; 1.10.0 on node01. (NCCL 2.18.3 on node01; no NCCL version line from node02)"
    )
    assert [e.line for e in skew.evidence] == [3, 5]


@pytest.mark.parametrize("line", [
    "node02:20:20 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.10.0aws",  # the same release, another packaging tag
    "node02:20:20 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.10.0-aws",
])  # fmt: skip
def test_one_plugin_release_on_every_host_does_not_fire_tl106(tmp_path: Path, line: str):
    text = "node01:10:10 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.10.0-aws\n" + line + "\n"
    assert "TL106" not in _fired(_analyze(tmp_path, text))


def test_plugin_api_levels_that_differ_fire_tl106(tmp_path: Path):
    """NCCL names the plugin API it loaded (`(v6)`, `IBext_v8`): two levels are two plugin builds."""
    text = "node01:10:10 [0] NCCL INFO P2P plugin IBext_v8\nnode02:20:20 [0] NCCL INFO P2P plugin IBext_v7\n"
    (skew,) = _fired(_analyze(tmp_path, text))["TL106"]
    assert skew.summary.startswith("IBext: v7 on node02; v8 on node01.")


def test_corpus_ofi_plugin_version(tmp_path: Path):
    analysis = _corpus_run(tmp_path, "host/nccltests", "eksblueprints_efa")
    plugins = analysis.tables["nccl_net"].filter(pl.col("what") == "plugin")
    assert plugins.select("host", "name").rows() == [
        ("test-nccl-efa-worker-0", "aws-ofi-nccl 1.5.0aws"),
        ("test-nccl-efa-worker-1", "aws-ofi-nccl 1.5.0aws"),
    ]
    assert "TL106" not in _fired(analysis)  # one plugin release on both hosts


# -- records whose host prefix a paste cut off ------------------------------------------------------


@pytest.mark.parametrize("line, table, kind", [
    ("misc/ibvwrap.cc:203 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory", "nccl_errors", "verbs_call"),
    ("NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory", "nccl_errors", "verbs_call"),
    ("include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol", "nccl_errors", "socket"),  # 2.4
    ("NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.3", "nccl_net", "plugin"),
])  # fmt: skip
def test_a_record_without_its_host_prefix_is_read(tmp_path: Path, line: str, table: str, kind: str):
    """Pastes keep NCCL's mark (and its source location) but cut `host:pid:tid [dev]` (synthetic lines in
    the wording of real threads)."""
    analysis = _analyze(tmp_path, line + "\n")
    rows = analysis.tables[table]
    assert rows[table == "nccl_errors" and "kind" or "what"].to_list() == [kind]
    assert _account(analysis)["unrecognized"] == 0


@pytest.mark.parametrize("line", [
    "Look for NCCL INFO NET/OFI lines to confirm EFA is used",
    "if grep -q 'NCCL WARN' train.log; then echo failed; fi",
    "main.c:12 WARN low disk space",
])  # fmt: skip
def test_text_that_mentions_the_mark_is_no_record(tmp_path: Path, line: str):
    analysis = _analyze(tmp_path, line + "\n")
    assert analysis.tables["nccl_errors"].height == analysis.tables["nccl_net"].height == 0
