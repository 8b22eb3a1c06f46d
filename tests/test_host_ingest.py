"""Host evidence ingest: nvidia-smi / dcgmi, kernel logs, interfaces, nccl-tests, perftest.

Every file of ../shared/corpus/host (except hang/, another module's) must be claimed by the
right format and read with no unrecognized line; the real listings made on this machine
(lab/host-evidence) too.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from lark import Lark

from tests.helpers import REPO, corpus_dir
from tracelens.ingest import InputFile, ingest_file, sniff_format
from tracelens.ingest.host import kernel
from tracelens.ingest.text.lines import read_lines
from tracelens.ingest.text.shell_context import context
from tracelens.resources import grammar_text
from tracelens.tables import conform

# folder/file-name part -> (format, table, rows)
EXPECTED = {
    "aiblog_dmon_410era": ("nvidia_smi", "gpu_samples", 2),
    "aiblog_table_410": ("nvidia_smi", "gpu_samples", 4),
    "dcgm265_dcgmi_dmon": ("nvidia_smi", "gpu_samples", 1),
    "dlperf106_table_450": ("nvidia_smi", "gpu_samples", 2),
    "gpuexp_dmon_590_h100": ("nvidia_smi", "gpu_samples", 5),
    "gpuexp_dmon_590_h200_mig": ("nvidia_smi", "gpu_samples", 5),
    "gpuexp_querygpu_csv": ("nvidia_smi", "gpu_samples", 1),
    "gpuexp_table_590_h100": ("nvidia_smi", "gpu_samples", 1),
    "gpuexp_table_590_h200_mig": ("nvidia_smi", "gpu_samples", 1),
    "gpuexp_table_610": ("nvidia_smi", "gpu_samples", 1),
    "ksysguard27_querygpu": ("nvidia_smi", "gpu_samples", 13),
    "pem5_table_460": ("nvidia_smi", "gpu_samples", 3),
    "pixellink135_table_396": ("nvidia_smi", "gpu_samples", 1),
    "akash209_dmesg_T": ("kernel_log", "kernel_events", 5),
    "armnas16_dmesg": ("kernel_log", "kernel_events", 14),
    "gpud_kmsg_raw": ("kernel_log", "kernel_events", 27),  # link up lines and NVIDIA driver records are kept
    "mptcp61_syslog": ("kernel_log", "kernel_events", 1),  # the watchdog line; its call trace is counted, not kept
    "ogkm1150_kernel_xid45": ("kernel_log", "kernel_events", 7),
    "openwrtnic11_dmesg": ("kernel_log", "kernel_events", 7),
    "returnn1486_dmesg_delta": ("kernel_log", "kernel_events", 13),
    "tranx41_dmesg_oom": ("kernel_log", "kernel_events", 3),
    "eksblueprints_efa_allreduce": ("log", "nccl_tests", 63),
    "liplus_sendrecv": ("log", "nccl_tests", 8),
    "nccltests107_allreduce": ("log", None, 0),  # headers only
    "nccltests232_allreduce": ("log", "nccl_tests", 10),
    "ocihpcoke_allreduce_2x8A100": ("log", "nccl_tests", 63),
    "ocihpcoke_slurm_allreduce": ("log", "nccl_tests", 8),
    "superbench_allreduce_8xA100": ("log", "nccl_tests", 69),
    "superbench_alltoall_8xA100": ("log", "nccl_tests", 69),
    "avocado1196_ib_send_bw": ("perftest", "perftest", 1),
    "perftest214_ib_write_bw": ("perftest", None, 0),  # header only
    "perftest234_ib_write_bw": ("perftest", None, 0),
    "perftest82_ib_send_bw": ("perftest", None, 0),
    "superbench_ib_write_bw_loopback_8M": ("perftest", "perftest", 2),
    "superbench_ib_write_bw_loopback_all_sizes": ("perftest", "perftest", 24),
    "3fs283_ip_addr": ("interfaces", "interfaces", 2),
    "3fs283_rdma_link_show": ("interfaces", "ib_ports", 2),
    "coreos412_ip_a": ("interfaces", "interfaces", 2),
    "jc_fixture_ifconfig": ("interfaces", "interfaces", 2),
    "multus1100_show_gids_pod_a": ("interfaces", "gids", 2),
    "multus1100_show_gids_pod_b": ("interfaces", "gids", 2),
    "nccl1573_show_gids": ("interfaces", "gids", 9),
    "netlab1750_ip_link": ("interfaces", "interfaces", 6),
    "ompi6184_ifconfig": ("interfaces", "interfaces", 3),
    "ucx3787_ibv_devinfo": ("ibv_devinfo", "ib_ports", 1),
    "ucx9484_show_gids": ("interfaces", "gids", 6),
}
FOLDERS = ("nvsmi", "kernel", "nccltests", "perftest", "iface")


def read(path: Path):
    fmt = sniff_format(path.read_bytes()[: 64 << 10])
    return fmt, ingest_file(InputFile(path=path, name=path.name, format=fmt))


def corpus_file(part: str) -> Path:
    root = corpus_dir("host")
    (found,) = [p for folder in FOLDERS for p in (root / folder).glob(f"{part}*")]
    return found


def test_every_host_corpus_file_is_expected():
    root = corpus_dir("host")
    files = [p for folder in FOLDERS for p in (root / folder).iterdir()]
    assert len(files) == len(EXPECTED)
    for path in files:
        assert [k for k in EXPECTED if path.name.startswith(k)], f"{path.name} has no expectation"


# Lines of other programs around the tool's output (ssh's host-key warnings, kubectl, a job script's
# echo, an empty line behind an MPI tag): no parser reads them, so they are unrecognised.
FOREIGN_LINES = {"eksblueprints_efa_allreduce": 3, "ocihpcoke_allreduce_2x8A100": 3, "ocihpcoke_slurm_allreduce": 5}


@pytest.mark.parametrize("part", sorted(EXPECTED))
def test_corpus_file_is_read_with_no_unrecognized_line(part):
    fmt, result = read(corpus_file(part))
    expected_format, table, rows = EXPECTED[part]
    assert fmt == expected_format
    assert result.account.errors == []
    assert result.account.unrecognized == FOREIGN_LINES.get(part, 0), result.account.samples
    assert result.account.parsed > 0
    if table:
        assert result.tables[table].height == rows
    else:
        assert not {"gpu_samples", "nccl_tests", "perftest"} & set(result.tables)


def test_nvidia_smi_values():
    table = read(corpus_file("aiblog_table_410"))[1].tables["gpu_samples"]
    assert table["util_gpu"].to_list() == [44.0, 0.0, 0.0, 0.0]
    assert table["bus_id"][3] == "00000000:AF:00.0"
    assert table["mem_used_mib"][0] == 31194
    mig = read(corpus_file("gpuexp_table_590_h200_mig"))[1].tables["gpu_samples"]
    assert mig["util_gpu"].to_list() == [None] and mig["power_w"].to_list() == [295.0]
    timed = read(corpus_file("dlperf106"))[1].tables["gpu_samples"]
    assert str(timed["ts"][0]) == "2021-01-08 19:32:40+00:00" and timed["util_gpu"].to_list() == [94.0, 91.0]
    dmon = read(corpus_file("aiblog_dmon_410era"))[1].tables["gpu_samples"]
    assert dmon["util_gpu"].to_list() == [0.0, 97.0] and dmon["sm_clock_mhz"].to_list() == [1075.0, 1075.0]
    wide = read(corpus_file("gpuexp_querygpu_csv"))[1].tables["gpu_samples"].row(0, named=True)
    assert (wide["util_gpu"], wide["power_w"], wide["name"]) == (100.0, 626.26, "NVIDIA H200")
    assert str(wide["ts"]) == "2026-07-03 22:11:09.763000+00:00"


def test_dmon_with_time_and_date_columns(tmp_path):
    """`-o DT` and `-o T` (no public sample: the documented layout)."""
    dt = tmp_path / "dmon-dt.txt"
    dt.write_text(
        "#Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk\n"
        "#YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %   MHz   MHz\n"
        " 20241206   18:31:01      0    68    39     -    35     4     0     0  9251  1530\n"
        " 20241206   18:31:02      1   298    61     -    97    40     0     0  9251  1980\n"
    )
    fmt, result = read(dt)
    rows = result.tables["gpu_samples"]
    assert fmt == "nvidia_smi" and result.account.unrecognized == 0
    assert [str(t) for t in rows["ts"]] == ["2024-12-06 18:31:01+00:00", "2024-12-06 18:31:02+00:00"]
    assert rows["util_gpu"].to_list() == [35.0, 97.0]
    only_t = tmp_path / "dmon-t.txt"
    only_t.write_text(
        "Fri Dec  6 23:59:59 2024\n#Time        gpu   pwr    sm   mem\n#HH:MM:SS    Idx     W     %     %\n"
        " 23:59:59      0    68    35     4\n 00:00:01      0    70    36     4\n"
    )
    rows = read(only_t)[1].tables["gpu_samples"]
    assert [str(t) for t in rows["ts"]] == ["2024-12-06 23:59:59+00:00", "2024-12-07 00:00:01+00:00"]


def test_headerless_csv_takes_fields_from_the_command(tmp_path):
    path = tmp_path / "smi.txt"
    path.write_text(
        "$ nvidia-smi --query-gpu=timestamp,index,utilization.gpu,power.draw --format=csv,noheader,nounits -l 1\n"
        "2024/12/06 18:31:01.100, 0, 35, 120.5\n2024/12/06 18:31:02.100, 0, 97, 290.1\n"
    )
    fmt, result = read(path)
    rows = result.tables["gpu_samples"]
    assert fmt == "nvidia_smi" and result.account.unrecognized == 0
    assert rows["util_gpu"].to_list() == [35.0, 97.0] and rows["power_w"].to_list() == [120.5, 290.1]


def test_the_context_lines_dumps_know_name_the_host_of_host_evidence_too(tmp_path):
    """One reader of the lines pasted around a tool's output: `hostname`'s output names the host and
    a `...` where the paste was shortened is context, as in a perfquery dump."""
    path = tmp_path / "smi.txt"
    path.write_text(
        "$ hostname\ngpu-node12\n"
        "$ nvidia-smi --query-gpu=timestamp,index,utilization.gpu,power.draw --format=csv,noheader,nounits -l 1\n"
        "2024/12/06 18:31:01.100, 0, 35, 120.5\n...\n2024/12/06 18:31:09.100, 0, 97, 290.1\n"
    )
    fmt, result = read(path)
    rows = result.tables["gpu_samples"]
    assert fmt == "nvidia_smi" and result.account.unrecognized == 0
    assert rows["util_gpu"].to_list() == [35.0, 97.0] and set(rows["host"]) == {"gpu-node12"}


def test_headerless_csv_without_a_command_is_counted_unrecognized(tmp_path):
    path = tmp_path / "smi.txt"
    path.write_text("index, utilization.gpu [%]\n0, 35 %\n1, 97 %, 12 W\n")
    result = read(path)[1]
    assert result.tables["gpu_samples"].height == 1 and result.account.unrecognized == 1


def test_kernel_events():
    xid = read(corpus_file("akash209"))[1].tables["kernel_events"].filter(pl.col("kind") == "xid").row(0, named=True)
    assert xid["xid"] == 79 and "fallen off the bus" in xid["detail"] and str(xid["ts"]) == "2024-04-05 21:29:39+00:00"
    nvlink = read(corpus_file("ogkm1150"))[1].tables["kernel_events"]
    assert set(nvlink["xid"].to_list()) == {45} and nvlink["device"].n_unique() == 4
    aer = read(corpus_file("returnn1486"))[1].tables["kernel_events"]
    assert aer.filter(pl.col("kind") == "pcie_aer").height == 4
    assert set(aer.filter(pl.col("kind") == "pcie_aer")["detail"].to_list()) == {"Corrected"}
    watchdog = read(corpus_file("openwrtnic11"))[1].tables["kernel_events"].filter(pl.col("kind") == "tx_timeout")
    assert watchdog.height == 7 and set(watchdog["netdev"].to_list()) == {"eth1", "eth4"}
    assert watchdog["uptime_s"][0] == pytest.approx(1356.29693)
    old = read(corpus_file("mptcp61"))[1].tables["kernel_events"].filter(pl.col("kind") == "tx_timeout")
    assert old["netdev"].to_list() == ["eth2"] and old["host"].to_list() == ["11008211"]
    oom = read(corpus_file("tranx41"))[1].tables["kernel_events"].filter(pl.col("kind") == "oom_kill")
    assert oom["detail"].to_list() == ["25315 (python3)"]


def test_kernel_grammar_and_vectorized_kinds_agree():
    """The grammar is the spec: every corpus and fixture record gets the same kind from it."""
    parser = Lark(grammar_text("kernel"), parser="earley", start="message")
    bodies = []
    for path in [
        *corpus_dir("host").joinpath("kernel").iterdir(),
        *(REPO / "lab" / "host-evidence" / "out").glob("dmesg*"),
    ]:
        lines = context(read_lines(InputFile(path=path, name=path.name, format="kernel_log")))
        bodies += kernel.records(lines.filter(lines["ctx"].is_null()), 2026).select("message", "kind").rows()
    bodies += [(m, k) for m, k in _SYNTHETIC_BODIES]
    for message, kind in bodies:
        assert parser.parse(message).data == kind, message
        assert pl.select(kernel.classify(pl.lit(message))).item() == kind, message


_SYNTHETIC_BODIES = [  # the documented shapes the corpus lacks (mlx5 flaps and TX timeouts)
    ("mlx5_core 0000:3b:00.0 ens1f0np0: Link down", "link_down"),
    ("mlx5_core 0000:3b:00.0 ens1f0np0: Link up", "link_up"),
    ("mlx5_core 0000:3b:00.0 ens1f0np0: TX timeout detected", "tx_timeout"),
    ("mlx4_en: eth2: Link Down", "link_down"),
    ("watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [python:4242]", "soft_lockup"),
    ("INFO: task python:4242 blocked for more than 120 seconds.", "hung_task"),
]


def test_kernel_sniffer_leaves_other_logs_alone():
    assert not kernel.sniff(b"[2023-04-18 01:46:59,142] [INFO] [logging.py:96:log_dist] step=10\n" * 5)
    assert not kernel.sniff(b"node01:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n" * 5)


def test_nccl_tests_rows():
    rows = read(corpus_file("ocihpcoke_allreduce_2x8A100"))[1].tables["nccl_tests"]
    big = rows.filter(pl.col("size_bytes") == 8589934592).sort("placement")
    assert big["busbw_gbs"].to_list() == [237.52, 237.94] and big["wrong"].to_list() == [0, 0]
    assert rows.filter(pl.col("kind") == "average")["busbw_gbs"].to_list() == [66.4834]
    assert rows["nranks"].unique().to_list() == [16]
    assert rows["rank_hosts"][0] == "nccl-allreduce-job0-mpiworker-0,nccl-allreduce-job0-mpiworker-1"
    old = read(corpus_file("superbench_allreduce"))[1].tables["nccl_tests"].filter(pl.col("kind") == "row")
    assert old["wrong"].null_count() == old.height and old["redop"].unique().to_list() == ["sum"]
    a2a = read(corpus_file("superbench_alltoall"))[1].tables["nccl_tests"].filter(pl.col("kind") == "row")
    assert a2a["redop"].null_count() == a2a.height and a2a["busbw_gbs"].max() == 226.16
    mpi = read(corpus_file("eksblueprints"))[1].tables["nccl_tests"]
    assert (
        mpi["prefix"].unique().to_list() == ["[1,0]<stdout>:"]
        and mpi.filter(pl.col("kind") == "average")["busbw_gbs"][0] == 1.15327
    )


def test_nccl_tests_grammar_agrees_with_the_vectorized_rows():
    """Every result row of the corpus, parsed by the grammar, has the values the split took."""
    parser = Lark(grammar_text("nccl_tests"), parser="earley")
    for part in (
        "ocihpcoke_allreduce_2x8A100",
        "superbench_allreduce",
        "superbench_alltoall",
        "liplus",
        "eksblueprints",
    ):
        path = corpus_file(part)
        rows = read(path)[1].tables["nccl_tests"].filter(pl.col("kind") == "row", pl.col("placement") == "out")
        text = path.read_text().splitlines()
        for row in rows.iter_rows(named=True):
            line = text[row["line"] - 1].removeprefix(row["prefix"] or "").strip()
            tree = parser.parse(line)
            assert tree.data == "row"
            head = [str(t) for t in tree.children if not hasattr(t, "data")]
            out = [str(t) for t in tree.children[-2].children]
            assert (int(head[0]), int(head[1]), head[2]) == (row["size_bytes"], row["count"], row["dtype"])
            assert (head[3] if len(head) > 3 else None) == row["redop"]
            assert (float(out[0]), float(out[2])) == (row["time_us"], row["busbw_gbs"])


def test_perftest_rows():
    rows = read(corpus_file("superbench_ib_write_bw_loopback_all_sizes"))[1].tables["perftest"]
    last = rows.sort("bytes").row(-1, named=True)
    assert (last["bytes"], last["bw_avg"], last["bw_unit"], last["device"], last["mtu"]) == (
        8388608,
        23240.68,
        "MB/sec",
        "ib0",
        4096,
    )
    wrapped = read(corpus_file("avocado1196"))[1].tables["perftest"].row(0, named=True)
    assert (wrapped["bytes"], wrapped["bw_avg"], str(wrapped["ts"])) == (
        1024,
        1476.74,
        "2019-07-16 03:43:24.134000+00:00",
    )


def first_perftest_row(path: Path) -> dict:
    """The first perftest row of a file that must be read whole as perftest output."""
    fmt, result = read(path)
    assert fmt == "perftest" and result.account.unrecognized == 0
    return result.tables["perftest"].row(0, named=True)


def test_latency_table(tmp_path):
    """ib_write_lat (no public sample: the documented layout, marked synthetic)."""
    path = tmp_path / "lat.txt"
    path.write_text(
        "---------------------------------------------------------------------------------------\n"
        "                    RDMA_Write Latency Test\n"
        " Dual-port       : OFF\t\tDevice         : mlx5_0\n Mtu             : 4096[B]\n Link type       : Ethernet\n"
        "---------------------------------------------------------------------------------------\n"
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99%"
        " percentile[usec]   99.9% percentile[usec] \n"
        " 2       1000          1.04           3.38         1.07"
        "     \t       1.08        \t0.05   \t\t1.21    \t\t3.38   \n"
    )
    row = first_perftest_row(path)
    assert (row["test"], row["lat_typical_us"], row["lat_p999_us"], row["link_type"]) == (
        "RDMA_Write Latency Test",
        1.07,
        3.38,
        "Ethernet",
    )


def test_interfaces():
    bond = read(corpus_file("netlab1750"))[1].tables["interfaces"]
    members = bond.filter(pl.col("master") == "bond1")
    assert members["ifname"].to_list() == ["swp1", "swp2"] and members["mtu"].to_list() == [9216, 9216]
    old = read(corpus_file("jc_fixture_ifconfig"))[1].tables["interfaces"].row(0, named=True)
    assert (old["ifname"], old["mtu"], old["ipv4"], old["rx_bytes"], old["tx_bytes"]) == (
        "ens33",
        1500,
        "192.168.248.129/24",
        5602,
        13935,
    )
    down = read(corpus_file("coreos412"))[1].tables["interfaces"]
    assert down["state"].to_list() == ["DOWN", "DOWN"] and down["ipv4"][0] == "10.187.10.11/24"
    gids = read(corpus_file("multus1100_show_gids_pod_b"))[1].tables["gids"]
    assert gids.select("index", "roce", "netdev").rows() == [(6, "v1", "net1"), (7, "v2", "net1")]
    rdma = read(corpus_file("3fs283_rdma_link"))[1].tables["ib_ports"]
    assert rdma.select("ca", "port", "state", "netdev").rows() == [
        ("mlx5_0", 1, "Active", "p1p1"),
        ("mlx5_1", 1, "Active", "p1p2"),
    ]


@pytest.mark.parametrize("bad", ["10.0.0.1/1e-400", "10.0.0.1/33", "10.0.0.999/24"])
def test_an_address_that_is_none_is_a_bad_line_not_a_rule_failure(tmp_path, bad):
    """Fuzz find: `inet 10.0.0.1/1e-400` was kept as the interface's address and TL602 failed on it."""
    from tracelens.analyze import analyze

    text = (
        "2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP group default qlen 1000\n"
        "    link/ether 0c:42:a1:00:00:01 brd ff:ff:ff:ff:ff:ff\n"
        f"    inet {bad} brd 10.0.0.255 scope global eth0\n"
        "eth1: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n"
        "        inet 10.0.1.1  netmask 255.0.255.0  broadcast 10.0.1.255\n"
    )
    (tmp_path / "run" / "node01").mkdir(parents=True)
    (tmp_path / "run" / "node01" / "ip_addr.txt").write_text(text)
    analysis = analyze(tmp_path / "run")
    assert analysis.failed == []
    interfaces = analysis.tables["interfaces"]
    assert interfaces["ifname"].to_list() == ["eth0", "eth1"] and interfaces["ipv4"].to_list() == [None, None]
    (row,) = analysis.tables["inputs"].to_dicts()
    assert row["unrecognized"] == 2 and [s["line"] for s in row["samples"]] == [3, 5]  # a netmask with holes


REAL = REPO / "lab" / "host-evidence" / "out"


@pytest.mark.parametrize("path", sorted(REAL.glob("*.txt")), ids=lambda p: p.name)
def test_real_listings_from_this_machine(path):
    fmt, result = read(path)
    if path.name.endswith("-ethtool.txt"):  # `ethtool IFACE` (link settings) is no format tracelens reads
        assert fmt == "log" and result.account.unrecognized == result.account.lines - result.account.ignored > 0
        return
    assert result.account.errors == [] and result.account.unrecognized == 0, result.account.samples
    if "ip" in path.name or "ifconfig" in path.name:
        assert fmt == "interfaces"
        rows = result.tables["interfaces"].filter(pl.col("ifname").str.starts_with("vh-"))
        assert rows["mtu"].to_list() == ([9000] if "tlhost-a" in path.name else [1500])
        assert rows["host"].to_list() == [path.name.split("-ip")[0].split("-ifconfig")[0]]
    if path.name == "dmesg-iso.txt":  # virtio_net records only: counted, none kept; their times carry a zone
        lines = context(read_lines(InputFile(path=path, name=path.name, format="kernel_log")))
        assert kernel.records(lines, 2026)["printed_zone"].all() and "kernel_events" not in result.tables
    if path.name.endswith("ethtool-S.txt"):
        counters = result.tables["ib_counters"]
        assert fmt == "ethtool" and counters["node"].unique().to_list() == [
            {"tlhost-a": "vh-a", "tlhost-b": "vh-b"}[counters["host"][0]]
        ]
        assert "peer_ifindex" in counters["counter"].to_list()
    if path.name.endswith("ip-d-link.txt"):
        assert result.tables["interfaces"].filter(pl.col("kind") == "veth")["max_mtu"].to_list() == [65535]


def test_older_latency_table_and_notes(tmp_path):
    """perftest before 4.x printed five latency columns; runtime notes are read, not unrecognized."""
    path = tmp_path / "lat-old.txt"
    path.write_text(
        "                    Send Latency Test\n Dual-port       : OFF\t\tDevice         : mlx5_1\n"
        " Requested SQ size might be too big. Try reducing TX depth and/or inline size.\n"
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n"
        " 2       1000          0.98           5.10         1.01\n"
    )
    row = first_perftest_row(path)
    assert (row["lat_min_us"], row["lat_typical_us"], row.get("lat_avg_us"), row["device"]) == (
        0.98,
        1.01,
        None,
        "mlx5_1",
    )


@pytest.mark.parametrize(
    ("text", "kind", "timed"),
    [
        ("kern  :err   : [ 1234.567890] mlx5_core 0000:3b:00.0 ens1f0np0: Link down\n", "link_down", False),  # dmesg -x
        (
            "Dec 06 18:31:01.123456 node02 kernel: mlx5_core 0000:3b:00.0 ens1f0np0: Link down\n",
            "link_down",
            True,
        ),  # short-precise
        ("2024-12-06T18:31:01,123456+01:00 mlx4_en: eth2: Link Down\n", "link_down", True),  # dmesg --time-format iso
        # journalctl -k in the output modes a monitoring agent may choose (synthetic, systemd's documented shapes)
        ("2024-12-06T18:31:01+0100 node02 kernel: mlx4_en: eth2: Link Down\n", "link_down", True),  # short-iso
        ("2024-12-06T18:31:01.123456+0100 node02 kernel: mlx4_en: eth2: Link Down\n", "link_down", True),  # -precise
        ("Fri 2024-12-06 17:31:01 UTC node02 kernel: mlx4_en: eth2: Link Down\n", "link_down", True),  # short-full
        ("1733506261.123456 node02 kernel: mlx4_en: eth2: Link Down\n", "link_down", True),  # short-unix
        ("[ 1234.567890] node02 kernel: mlx4_en: eth2: Link Down\n", "link_down", False),  # short-monotonic
    ],
)
def test_kernel_prefix_variants(tmp_path, text, kind, timed):
    path = tmp_path / "k.txt"
    path.write_text(text * 3)
    fmt, result = read(path)
    rows = result.tables["kernel_events"]
    assert fmt == "kernel_log" and result.account.unrecognized == 0
    assert rows["kind"].unique().to_list() == [kind] and rows["ts"].is_not_null().all() == timed
    if "+01:00" in text:
        assert str(rows["ts"][0]) == "2024-12-06 17:31:01.123456+00:00" and rows["zoned"].all()
    if " node02 kernel: " in text:
        assert rows["host"].unique().to_list() == ["node02"]
        if timed and not text.startswith("Dec"):  # these print the year and their zone
            assert str(rows["ts"][0]).startswith("2024-12-06 17:31:01") and rows["zoned"].all()


def test_show_gids_trailer_and_ipoib_ifconfig(tmp_path):
    gids = tmp_path / "gids.txt"
    gids.write_text(
        "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV\n---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---\n"
        "mlx5_0\t1\t3\t0000:0000:0000:0000:0000:ffff:0a00:0001\t10.0.0.1  \tv2\tens1f0\nn_gids_found=1\n"
    )
    fmt, result = read(gids)
    assert (
        fmt == "interfaces" and result.account.unrecognized == 0 and result.tables["gids"]["roce"].to_list() == ["v2"]
    )
    ipoib = tmp_path / "ifconfig.txt"
    ipoib.write_text(
        "ib0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 2044\n        inet 192.168.10.1  netmask 255.255.255.0\n"
        "Infiniband hardware address can be incorrect! Please read BUGS section in ifconfig(8).\n"
        "        infiniband 80:00:02:08:FE:80:00:00:00:00:00:00:00:00:00:00:00:00:00:00  txqueuelen 256  (InfiniBand)\n"
    )
    fmt, result = read(ipoib)
    row = result.tables["interfaces"].row(0, named=True)
    assert result.account.unrecognized == 0 and (row["ifname"], row["mtu"], row["link_type"]) == (
        "ib0",
        2044,
        "infiniband",
    )


DEVINFO_V = """hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tnode_guid:\t\t\tb83f:d203:00a1:b2c4
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t1024 (3)
\t\t\tlink_layer:\t\tEthernet
\t\t\tactive_width:\t\t4X (2)
\t\t\tactive_speed:\t\t50.0 Gbps (64)
\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:ba3f:d2ff:fea1:b2c4, RoCE v1
\t\t\tGID[  1]:\t\tfe80::ba3f:d2ff:fea1:b2c4, RoCE v2
\t\t\tGID[  3]:\t\t::ffff:10.0.0.1, RoCE v2
"""


def test_ibv_devinfo_v_gid_table_and_the_low_active_mtu(tmp_path):
    """`ibv_devinfo -v` as rdma-core prints it (docs/formats/fabric.md): GIDs with RoCE v1/v2, active_mtu
    1024 of 4096."""
    from tests.helpers import fire
    from tracelens.analyze import ingest_run

    (tmp_path / "node01").mkdir()
    (tmp_path / "node01" / "ibv_devinfo-v.txt").write_text(DEVINFO_V)
    tables, _ = ingest_run(tmp_path, tmp_path / "work")
    assert tables["gids"].select("index", "roce", "ipv4").rows() == [
        (0, "v1", None),
        (1, "v2", None),
        (3, "v2", "10.0.0.1"),
    ]
    (finding,) = fire(tables, "TL603")
    assert finding.hosts == ["node01"] and "active MTU 1024 below the 4096" in finding.title


def test_nvidia_smi_failures_and_a_header_per_loop(tmp_path):
    """`-l` loops may print the header every time; a lost GPU prints an error line, which is read, not unknown."""
    path = tmp_path / "smi.txt"
    header = "timestamp, index, utilization.gpu [%]\n"
    path.write_text(
        header + "2024/12/06 18:31:01.100, 0, 35 %\n" + header + "2024/12/06 18:31:02.100, 0, 36 %\n"
        "Unable to determine the device handle for GPU0000:a1:00.0: Unknown Error\n"
    )
    fmt, result = read(path)
    assert fmt == "nvidia_smi" and result.account.unrecognized == 0 and result.account.parsed == 5
    assert result.tables["gpu_samples"]["util_gpu"].to_list() == [35.0, 36.0]


def test_perftest_with_a_gpu_buffer(tmp_path):
    """`ib_read_bw --use_cuda=0` (a GPUDirect RDMA test; synthetic, perftest's printf wording): the GPU
    buffer's set-up and tear-down lines are read, not unrecognized, and the result row still is."""
    path = tmp_path / "read-bw.txt"
    path.write_text(
        "                    RDMA_Read BW Test\n Dual-port       : OFF\t\tDevice         : mlx5_0\n"
        " Outstand reads  : 16\n Mtu             : 4096[B]\n Link type       : IB\n"
        "initializing CUDA\nThere are 8 devices supporting CUDA, picking first...\n"
        "[pid = 4242, dev = 0] device name = [NVIDIA A100-SXM4-80GB]\ncreating CUDA Ctx\n"
        "making it the current CUDA Ctx\ncuMemAlloc() of a 131072 bytes GPU buffer\n"
        "allocated GPU buffer address at 00007f0c9d3b1000 pointer=0x7f0c9d3b1000\n"
        " Device not recognized to implement inline feature. Disabling it\n"
        " local address: LID 0x05 QPN 0x0175 PSN 0x6e3d2f OUT 0x10 RKey 0x1fd9ee VAddr 0x007f0c9d3b1000\n"
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        " 65536      1000             11756.84            11753.53\t\t   0.188056\n"
        "destroying current CUDA Ctx\n"
    )
    fmt, result = read(path)
    assert fmt == "perftest" and result.account.unrecognized == 0, result.account.samples
    row = result.tables["perftest"].row(0, named=True)
    assert (row["test"], row["device"], row["bw_avg"]) == ("RDMA_Read BW Test", "mlx5_0", 11753.53)


@pytest.mark.parametrize(
    "prefix",
    [
        "2019-06-02T16:13:44.884Z: [1,0]<stdout>:",  # Open MPI's tag after a shipper's time
        "gpu-node-7 [stderr] ",  # a benchmark runner's host and stream
        "| 2024-12-04T05:27:42.076Z | ",  # a CloudWatch console table
    ],
)
def test_nccl_tests_behind_shippers_and_runners(tmp_path, prefix):
    """A real all_reduce_perf output with each prefix put before every line reads as the plain one does."""
    original = corpus_file("ocihpcoke_allreduce_2x8A100")
    path = tmp_path / "prefixed.txt"
    path.write_text("".join(prefix + line for line in original.read_text().splitlines(keepends=True)))
    plain, prefixed = read(original)[1], read(path)[1]
    columns = ["kind", "size_bytes", "placement", "busbw_gbs", "wrong", "nranks", "rank_hosts"]
    assert prefixed.tables["nccl_tests"].select(columns).equals(plain.tables["nccl_tests"].select(columns))
    assert (prefixed.account.parsed, prefixed.account.unrecognized) == (
        plain.account.parsed,
        plain.account.unrecognized,
    )


def test_the_tail_of_an_nccl_tests_output_without_result_rows_reads_its_average(tmp_path):
    """A paste cut after the results: the average alone is a row, the file is read (it was lost to an
    error: the average's row had no result columns to select)."""
    path = tmp_path / "tail.txt"
    path.write_text("[1,0]<stdout>:# Out of bounds values : 0 OK\n[1,0]<stdout>:# Avg bus bandwidth    : 1.15327\n")
    result = read(path)[1]
    assert not result.account.errors
    rows = conform("nccl_tests", result.tables["nccl_tests"])  # as the run's tables hold it
    assert rows.select("kind", "busbw_gbs", "size_bytes").rows() == [("average", 1.15327, None)]
    assert (result.account.lines, result.account.parsed) == (2, 2)
