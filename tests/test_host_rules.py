"""TL601-TL607 on small hand-built tables: each fires on its evidence and stays quiet on a healthy host."""

from __future__ import annotations

from tests.helpers import fire, tables_from
from tests.helpers.host import gpu, iface, kev, nccl_row, perf, port, rates
from tests.helpers.steps import SLOW, analysed, at, counters, slow_span, steps


def test_tl601_gpus_idle_while_the_network_dropped_packets():
    t = analysed(
        steps=steps(slow=SLOW),
        ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 3000, 6000, 6000, 6000, 6000]),
        gpu_samples=gpu("node01", 35.0) + gpu("node02", 34.0),
    )
    (finding,) = fire(t, "TL601")
    assert finding.title.startswith("GPUs idle while waiting on the network")
    assert "node01's 2 GPUs at 35% (usually 93%)" in finding.summary and "node02" in finding.summary
    assert "a bad link" in finding.summary and finding.window is not None


def test_tl601_gpus_busy_is_compute_bound():
    t = analysed(steps=steps(slow=SLOW), gpu_samples=gpu("node01", 97.0, 95.0))
    (finding,) = fire(t, "TL601")
    assert "compute bound" in finding.title and "97%" in finding.summary and finding.severity.label == "info"


def test_tl601_quiet_without_a_slow_window_or_samples():
    assert fire(analysed(steps=steps(), gpu_samples=gpu("node01", 93.0)), "TL601") == []
    assert fire(analysed(steps=steps(slow=SLOW)), "TL601") == []


def test_tl602_mtu_mismatch_on_one_network():
    t = tables_from(
        interfaces=[
            iface("node01", "ens1f0", 9000, "10.0.0.1/24"),
            iface("node02", "ens1f0", 1500, "10.0.0.2/24"),
            iface("node01", "eth0", 1500, "192.168.1.1/24"),
            iface("node02", "eth0", 1500, "192.168.1.2/24"),
        ]
    )
    (finding,) = fire(t, "TL602")
    assert finding.title == "MTU mismatch on network 10.0.0.0/24: 1500, 9000"
    assert "node01 ens1f0 9000" in finding.summary and finding.hosts == ["node01", "node02"]


def test_tl602_quiet_when_every_host_agrees():
    t = tables_from(
        interfaces=[iface("node01", "ens1f0", 9000, "10.0.0.1/24"), iface("node02", "ens1f0", 9000, "10.0.0.2/24")]
    )
    assert fire(t, "TL602") == []


def test_tl603_roce_active_mtu_below_the_port():
    t = tables_from(
        ib_ports=[
            port("node01", 1024),
            port("node02", 4096),
            {**port("node01", None), "source": "rdma_link", "netdev": "ens1f0"},
        ],
        interfaces=[iface("node01", "ens1f0", 1500, "10.0.0.1/24")],
    )
    (finding,) = fire(t, "TL603")
    assert "active MTU 1024 below the 4096" in finding.title and "netdev ens1f0 has MTU 1500" in finding.summary
    assert finding.ports == ["mlx5_0:1"]


def test_tl603_quiet_at_full_mtu():
    assert fire(tables_from(ib_ports=[port("node01", 4096), port("node02", 4096)]), "TL603") == []


def test_tl604_socket_transport_without_jumbo_frames():
    net = [
        {"host": "node01", "pid": 1, "what": "network", "name": "Socket"},
        {"host": "node01", "pid": 1, "what": "socket_if", "name": "eth0", "address": "10.0.0.1"},
    ]
    t = tables_from(nccl_net=net, interfaces=[iface("node01", "eth0", 1500, "10.0.0.1/24")])
    (finding,) = fire(t, "TL604")
    assert "eth0 without jumbo frames (MTU 1500)" in finding.title
    healthy = tables_from(nccl_net=net, interfaces=[iface("node01", "eth0", 9000, "10.0.0.1/24")])
    assert fire(healthy, "TL604") == []


def test_tl605_link_flap_in_the_slow_window_and_an_xid():
    begin, _ = slow_span()
    inside = (begin - at(0)).total_seconds() + 10
    t = analysed(
        steps=steps(slow=SLOW),
        kernel_events=[
            kev("node02", "link_down", inside, netdev="ens1f0np0", subsystem="mlx5_core"),
            kev("node02", "link_up", inside + 3, netdev="ens1f0np0", subsystem="mlx5_core"),
            kev(
                "node01",
                "xid",
                400,
                xid=79,
                detail="Xid 79: GPU has fallen off the bus (PCIe link lost)",
                device="0000:a1:00",
            ),
        ],
    )
    found = {f.hosts[0]: f for f in fire(t, "TL605")}
    assert (
        "1 link flap (down, then up again)" in found["node02"].summary
        and "It falls in a slow window" in found["node02"].summary
    )
    assert found["node02"].ports == ["ens1f0np0"] and found["node02"].severity.label == "critical"
    assert (
        "Xid 79: GPU has fallen off the bus" in found["node01"].title and found["node01"].severity.label == "critical"
    )
    # a site that keeps Xid 79 off its critical list ([rules.TL605] critical_xids): a warning
    found = {f.hosts[0]: f for f in fire(t, "TL605", critical_xids=(48, 94, 95))}
    assert found["node01"].severity.label == "warning" and found["node02"].severity.label == "critical"


def test_tl605_quiet_on_a_corrected_aer_trickle_outside_slow_windows():
    t = analysed(
        steps=steps(slow=SLOW),
        kernel_events=[kev("node01", "pcie_aer", 5, detail="Corrected"), kev("node01", "other", 6)],
    )
    assert fire(t, "TL605") == []


def test_tl606_busbw_far_below_the_links():
    (finding,) = fire(tables_from(nccl_tests=nccl_row(41.3), ib_ports=rates()), "TL606")
    assert "41.3 GB/s, 21% of the link" in finding.title and "200 GB/s the links give" in finding.summary


def test_tl606_reads_the_out_of_place_busbw_at_the_largest_size():
    """The figure quoted for a run is nccl-tests' first busbw column; the in-place one, here 3% higher,
    is not taken in its place."""
    rows = nccl_row(41.3)
    rows[1]["busbw_gbs"] = 42.6
    (finding,) = fire(tables_from(nccl_tests=rows, ib_ports=rates()), "TL606")
    assert "41.3 GB/s" in finding.title and "42.6" not in finding.summary


def test_tl606_wrong_results():
    (finding,) = fire(tables_from(nccl_tests=nccl_row(190.0, wrong=12), ib_ports=rates()), "TL606")
    assert finding.severity.label == "critical" and "#wrong" in finding.title


def test_tl606_quiet_on_a_healthy_run_or_one_host():
    assert fire(tables_from(nccl_tests=nccl_row(189.6), ib_ports=rates()), "TL606") == []
    assert fire(tables_from(nccl_tests=nccl_row(20.0, hosts="localhost"), ib_ports=rates()), "TL606") == []


def test_tl607_perftest_below_line_rate():
    (finding,) = fire(tables_from(perftest=perf(11000.0), ib_ports=rates()), "TL607")
    assert "88.0 Gb/s on mlx5_0, 44% of its 200 Gb/s" in finding.title


def test_tl607_quiet_near_line_rate():
    assert fire(tables_from(perftest=perf(23240.68), ib_ports=rates()), "TL607") == []


def test_the_verdict_says_the_gpus_idled_in_the_bad_links_window(analysis_of):
    """fixtures/scenario-gpu-idle-bad-link (synthetic): the root cause names node02's link and the GPU numbers."""
    analysis = analysis_of("scenario-gpu-idle-bad-link")
    top = analysis.findings[0]
    assert top.rule_id == "TL410" and top.hosts == ["node02"]
    assert "GPU utilisation fell: node02's 4 GPUs at 3" in top.summary and "(usually 9" in top.summary
    assert "node02's kernel logged" in top.summary
    idle = [f for f in analysis.findings if f.rule_id == "TL601"]
    assert idle and idle[0].title.startswith("GPUs idle while waiting on the network")


def test_tl602_real_veth_pair_with_one_end_at_9000(tmp_path):
    """lab/host-evidence (real): vh-a in netns tlhost-a at 9000, its peer vh-b in tlhost-b at 1500; found by
    their common network from `ip addr`, and from `ip link` alone by the veth pair's `@ifN` and `link-netns`."""
    import shutil

    from tests.helpers import REPO
    from tracelens.analyze import ingest_run

    real = REPO / "lab" / "host-evidence" / "out"
    tables, _ = ingest_run(real, tmp_path / "work")
    (finding,) = fire(tables, "TL602")
    assert finding.title == "MTU mismatch on network 10.77.0.0/24: 1500, 9000" and finding.hosts == [
        "tlhost-a",
        "tlhost-b",
    ]
    links_only = tmp_path / "links"
    links_only.mkdir()
    for path in real.glob("*-ip-link.txt"):
        shutil.copy(path, links_only / path.name)
    tables, _ = ingest_run(links_only, tmp_path / "work2")
    (finding,) = fire(tables, "TL602")
    assert finding.title == "MTU mismatch on veth pair tlhost-a/vh-a - tlhost-b/vh-b: 1500, 9000"


def test_tl602_ports_of_one_name_and_bond_members():
    listed = [
        {**iface("node01", "ens1f0", 9000, None), "ipv4": None},
        {**iface("node02", "ens1f0", 1500, None), "ipv4": None},
        {**iface("node03", "bond0", 9000, None), "ipv4": None},
        {**iface("node03", "ens2f0", 1500, None), "ipv4": None, "master": "bond0"},
    ]
    titles = sorted(f.title for f in fire(tables_from(interfaces=listed), "TL602"))
    assert titles == [
        "MTU mismatch on bond bond0 on node03: 1500, 9000",
        "MTU mismatch on ens1f0 on every host: 1500, 9000",
    ]
    same = [{**iface(h, "ens1f0", 9000, None), "ipv4": None} for h in ("node01", "node02")]
    assert fire(tables_from(interfaces=same), "TL602") == []


def test_tl606_without_port_dumps_assumes_the_usual_nic_per_gpu(tmp_path):
    """nccl-tests output alone: 2 hosts x 8 A100 ranks -> 8 x 200 Gb/s per host is assumed, and said."""
    from tracelens.analyze import ingest_run

    ranks = "".join(
        f"#  Rank {r:2d} Group  0 Pid {40 + r:6d} on node0{1 + r // 8} device  {r % 8} [0x0f] NVIDIA A100-SXM4-40GB\n"
        for r in range(16)
    )
    head = (
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor)"
        " warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n"
        "#\n# Using devices\n" + ranks + "#\n"
        "#       size         count      type   redop    root     time"
        "   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "#        (B)    (elements)                               (us)"
        "  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
    )
    slow = (
        "  8589934592    2147483648     float     sum      -1   268435"
        "   32.00   60.00      0   268435   32.00   60.00      0\n"
    )
    good = (
        "  8589934592    2147483648     float     sum      -1    67689"
        "  126.90  237.94      0    67811  126.68  237.52      0\n"
    )
    for name, row, fires in (("slow", slow, True), ("good", good, False)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "all_reduce_perf.log").write_text(head + row + "# Avg bus bandwidth    : 20.1\n")
        tables, _ = ingest_run(folder, tmp_path / f"work-{name}")
        found = fire(tables, "TL606")
        assert bool(found) == fires
        if fires:
            assert "30% of the link" in found[0].title and "assumed: 8 A100 GPUs per host" in found[0].summary


def test_tl605_says_which_gpu_or_nic_a_pcie_error_hit():
    begin, _ = slow_span()
    inside = (begin - at(0)).total_seconds() + 10
    t = analysed(
        steps=steps(slow=SLOW),
        gpu_samples=[
            {
                "file": "node01/smi.txt",
                "line": 9,
                "host": "node01",
                "gpu": 3,
                "bus_id": "00000000:3B:00.0",
                "util_gpu": 90.0,
            }
        ],
        kernel_events=[
            kev("node01", "pcie_aer", inside, device="0000:3b:00.0", detail="Uncorrected (Non-Fatal)"),
            kev("node01", "other", 1, subsystem="mlx5_core", device="0000:5e:00.1", netdev="ens1f1"),
            kev("node01", "pcie_aer", inside + 1, device="0000:5e:00.1", detail="Corrected"),
        ],
    )
    (finding,) = fire(t, "TL605")
    assert "0000:3b:00.0 (GPU 3)" in finding.summary and "0000:5e:00.1 (NIC mlx5_core ens1f1)" in finding.summary


def gid_rows(host: str, first: int) -> list[dict]:
    """A pod's GID table as multus/macvlan leaves it: link-local v1/v2 first, then the IPv4 v1/v2 pair."""
    return [
        {
            "file": f"{host}/show_gids.txt",
            "line": 3 + i,
            "host": host,
            "ca": "mlx5_4",
            "port": 1,
            "index": first + i,
            "gid": gid,
            "ipv4": ip,
            "roce": v,
            "netdev": "net1",
            "source": "show_gids",
        }
        for i, (gid, ip, v) in enumerate(
            [
                ("fe80::a4ed:ccff:fe8b:1994", None, "v1"),
                ("fe80::a4ed:ccff:fe8b:1994", None, "v2"),
                ("::ffff:172.20.1.1", "172.20.1.1", "v1"),
                ("::ffff:172.20.1.1", "172.20.1.1", "v2"),
            ]
        )
    ]


def test_tl608_gid_index_that_is_v2_on_one_pod_and_v1_on_the_other():
    env = [
        {
            "host": h,
            "pid": 1,
            "name": "NCCL_IB_GID_INDEX",
            "value": "5",
            "message": "NCCL_IB_GID_INDEX set by environment to 5.",
        }
        for h in ("pod-a", "pod-b")
    ]
    (finding,) = fire(tables_from(gids=gid_rows("pod-a", 2) + gid_rows("pod-b", 4), nccl_env=env), "TL608")
    assert finding.hosts == ["pod-b"] and "index 5 is v2 fe80::" in finding.summary and "at index 7" in finding.summary
    healthy = gid_rows("pod-a", 2) + gid_rows("pod-b", 2)
    assert fire(tables_from(gids=healthy, nccl_env=env), "TL608") == []


def test_tl608_reads_the_gid_index_a_launcher_exported():
    # without NCCL_DEBUG=INFO NCCL echoes nothing: the launcher's line is all that says the index
    exported = [{"host": "pod-b", "key": "NCCL_IB_GID_INDEX", "value": "5", "source": "launcher_env", "line": 3}]
    (finding,) = fire(tables_from(gids=gid_rows("pod-b", 4), deepspeed_settings=exported), "TL608")
    assert finding.hosts == ["pod-b"] and "NCCL_IB_GID_INDEX=5" in finding.title
    assert fire(tables_from(gids=gid_rows("pod-b", 2), deepspeed_settings=exported), "TL608") == []
