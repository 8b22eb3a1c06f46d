"""Fabric dump variants the corpus lacks (docs/formats/fabric.md), generated in each tool's own layout:
perfquery -a / -X / -E / -D / -T blocks, DR-path and GID port ids, old headers and names, RS-FEC;
ibstat with several CAs and odd rates; ibstatus of several devices; full ibv_devinfo -v;
ethtool -S of mlx5 (hundreds of counters) and of other drivers; rdma statistic; sysfs greps."""

from __future__ import annotations

import polars as pl

from synth.fabric import ethtool
from tests.helpers.fabric import read, write


def pq(name: str, value: int | str) -> str:
    """One perfquery field line: the value starts at column 34 (libibmad _mad_dump_field)."""
    return f"{name}:{'.' * (32 - len(name))}{value}\n"


def counters(result) -> dict[tuple[int, str], int]:
    rows = result.tables["ib_counters"]
    return {(r["port"], r["counter"]): r["value"] for r in rows.iter_rows(named=True)}


BASIC = [
    ("SymbolErrorCounter", 65535),
    ("LinkErrorRecoveryCounter", 255),
    ("LinkDownedCounter", 3),
    ("PortRcvErrors", 12),
    ("PortRcvRemotePhysicalErrors", 0),
    ("PortRcvSwitchRelayErrors", 0),
    ("PortXmitDiscards", 40),
    ("PortXmitConstraintErrors", 0),
    ("PortRcvConstraintErrors", 0),
    ("CounterSelect2", "0x00"),
    ("LocalLinkIntegrityErrors", 15),
    ("ExcessiveBufferOverrunErrors", 0),
    ("VL15Dropped", 0),
    ("PortXmitData", 4294967295),
    ("PortRcvData", 1000),
    ("PortXmitPkts", 10),
    ("PortRcvPkts", 20),
    ("PortXmitWait", 777),
]


def basic_block(header: str, port: int) -> str:
    return header + pq("PortSelect", port) + pq("CounterSelect", "0x1b01") + "".join(pq(n, v) for n, v in BASIC)


def test_all_ports_aggregate_dr_path_and_gid_port_ids(tmp_path):
    text = (
        basic_block("# Port counters: Lid 12 port 255 (CapMask: 0x5300)\n", 255)
        + basic_block("# Port counters: DR path slid 0; dlid 0; 0,1,3 port 2 (CapMask: 0x1400)\n", 2)
        + basic_block("# Port counters: Lid 12 Gid fe80::248a:703:9b:c0e2 port 1 (CapMask: 0x1400)\n", 1)
    )
    result = read(write(tmp_path, "pq.txt", text))
    assert result.account.errors == [] and result.account.unrecognized == 0
    rows = result.tables["ib_counters"]
    assert rows.group_by("node", "lid", "port").len().sort("port").rows() == [
        ("Lid 12 Gid fe80::248a:703:9b:c0e2", 12, 1, 17),
        ("DR path slid 0; dlid 0; 0,1,3", None, 2, 17),
        ("Lid 12", 12, 255, 17),
    ]  # every counter but the CounterSelect2 selector
    values = counters(result)
    assert values[(255, "SymbolErrorCounter")] == 65535 and values[(2, "PortXmitWait")] == 777


def test_old_headers_names_and_timestamp_lines(tmp_path):
    legacy = [
        ("SymbolErrors", 4),
        ("LinkRecovers", 1),
        ("LinkDowned", 2),
        ("RcvErrors", 5),
        ("XmtDiscards", 6),
        ("XmtData", 100),
        ("RcvData", 200),
        ("XmtPkts", 3),
        ("RcvPkts", 4),
    ]
    text = (
        "timestamp 1700000000\n# Port counters: Lid 7 port 1\n"
        + pq("PortSelect", 1)
        + "".join(pq(n, v) for n, v in legacy)
        + "timestamp 1700000060\n# Port counters: Lid 7 port 1\n"
        + pq("PortSelect", 1)
        + "".join(pq(n, v + 1) for n, v in legacy)
    )
    rows = read(write(tmp_path, "old.txt", text)).tables["ib_counters"]
    downed = rows.filter(pl.col("counter") == "LinkDownedCounter").sort("ts")
    assert downed["value"].to_list() == [2, 3]
    assert downed["ts"].dt.epoch("s").to_list() == [1700000000, 1700000060]
    assert {"PortXmitDiscards", "PortXmitData", "PortRcvErrors"} <= set(rows["counter"])


def test_capmask_without_xmit_wait_and_rs_fec(tmp_path):
    text = basic_block("# Port counters: Lid 3 port 1 (CapMask: 0x0200)\n", 1)
    values = counters(read(write(tmp_path, "nowait.txt", text)))
    assert (1, "PortXmitWait") not in values and values[(1, "PortXmitDiscards")] == 40
    fec = (
        "# PortExtendedSpeedsCountersRSFEC counters: Lid 3 port 1\n"
        + pq("PortSelect", 1)
        + pq("CounterSelect", "0x00000000")
        + pq("SyncHeaderErrorCounter", 0)
        + pq("UnknownBlockCounter", 0)
        + "".join(pq(f"FECCorrectableBlockCtrLane{i}", 10 * i) for i in range(4))
        + pq("PortFECCorrectableBlockCounter", 55)
        + pq("PortFECUncorrectableBlockCounter", 2)
        + pq("PortFECCorrectedSymbolCounter", 123456)
    )
    result = read(write(tmp_path, "fec.txt", fec))
    rows = result.tables["ib_counters"]
    values = counters(result)
    assert values[(1, "PortFECUncorrectableBlockCounter")] == 2 and values[(1, "FECCorrectableBlockCtrLane3")] == 30
    assert set(rows["source"]) == {"perfquery_detail"}


def test_detail_blocks_of_every_option(tmp_path):
    blocks = {
        "PortRcvErrorDetails": [
            "PortLocalPhysicalErrors",
            "PortMalformedPktErrors",
            "PortBufferOverrunErrors",
            "PortDLIDMappingErrors",
            "PortVLMappingErrors",
            "PortLoopingErrors",
        ],
        "PortXmitDiscardDetails": [
            "PortInactiveDiscards",
            "PortNeighborMTUDiscards",
            "PortSwLifetimeLimitDiscards",
            "PortSwHOQLifetimeLimitDiscards",
        ],
        "PortXmitDataSL": [f"XmtDataSL{i}" for i in range(16)],
        "PortRcvDataSL": [f"RcvDataSL{i}" for i in range(16)],
    }
    text = "".join(
        f"# {kind} counters: Lid 2052 port 1\n"
        + pq("PortSelect", 1)
        + pq("CounterSelect", "0x0000")
        + "".join(pq(name, i + 1) for i, name in enumerate(names))
        for kind, names in blocks.items()
    )
    result = read(write(tmp_path, "detail.txt", text))
    assert result.account.unrecognized == 0
    values = counters(result)
    assert values[(1, "PortSwHOQLifetimeLimitDiscards")] == 4 and values[(1, "PortLoopingErrors")] == 6
    assert values[(1, "XmtDataSL15")] == 16 and len(values) == 6 + 4 + 16 + 16


def test_extended_block_with_additional_error_counters(tmp_path):
    text = (
        "# Port extended counters: Lid 12 port 1 (CapMask: 0x5A00 CapMask2: 0x0000002)\n"
        + pq("PortSelect", 1)
        + pq("CounterSelect", "0x0000")
        + "".join(
            pq(n, v)
            for n, v in [
                ("PortXmitData", 2**40),
                ("PortRcvData", 2**41),
                ("PortXmitPkts", 9),
                ("PortRcvPkts", 9),
                ("PortUnicastXmitPkts", 8),
                ("PortUnicastRcvPkts", 8),
                ("PortMulticastXmitPkts", 1),
                ("PortMulticastRcvPkts", 1),
            ]
        )
        + pq("CounterSelect2", "0x00000000")
        + pq("SymbolErrorCounter", 70000)
        + pq("PortXmitWait", 5 * 2**32)
        + pq("QP1Dropped", 3)
        + "\n"
    )
    rows = read(write(tmp_path, "x.txt", text)).tables["ib_counters"]
    got = {r["counter"]: (r["value"], r["bits"], r["source"]) for r in rows.iter_rows(named=True)}
    assert got["SymbolErrorCounter"] == (70000, 64, "perfquery_x")
    assert got["PortXmitWait"][0] == 5 * 2**32 and got["PortXmitData"][0] == 2**40


def ibstat_ca(name: str, ports: list[dict[str, str]], indent: str = "\t") -> str:
    out = (
        f"CA '{name}'\n{indent}CA type: MT4123\n{indent}Number of ports: {len(ports)}\n"
        f"{indent}Firmware version: 20.31.1014\n{indent}Hardware version: 0\n"
        f"{indent}Node GUID: 0x0c42a10300a1b2c3\n{indent}System image GUID: 0x0c42a10300a1b2c3\n"
    )
    for number, attrs in enumerate(ports, start=1):
        out += f"{indent}Port {number}:\n" + "".join(f"{indent * 2}{k}: {v}\n" for k, v in attrs.items())
    return out


def ib_port(state="Active", phys="LinkUp", rate="200", lid="12", **extra) -> dict[str, str]:
    return {
        "State": state,
        "Physical state": phys,
        "Rate": rate,
        **extra,
        "Base lid": lid,
        "LMC": "0",
        "SM lid": "1",
        "Capability mask": "0x2651e848",
        "Port GUID": "0x0c42a10300a1b2c3",
        "Link layer": "InfiniBand",
    }


def test_ibstat_several_cas_odd_rates_and_dead_ports(tmp_path):
    text = ibstat_ca("mlx5_0", [ib_port(rate="10 (FDR10)"), ib_port(rate="2.5", lid="65535")]) + ibstat_ca(
        "mlx5_1",
        [
            ib_port(state="Down", phys="Polling", rate="10"),
            ib_port(state="Down", phys="Disabled", rate="40"),
            ib_port(state="Initializing", phys="LinkUp", rate="100", **{"Effective speed": "100"}),
        ],
        indent=" " * 8,
    )
    result = read(write(tmp_path, "ibstat.txt", text))
    assert result.account.unrecognized == 0 and result.account.errors == []
    rows = result.tables["ib_ports"].select("ca", "port", "state", "phys_state", "rate_gbps", "lid").rows()
    assert rows == [
        ("mlx5_0", 1, "Active", "LinkUp", 10.0, 12),
        ("mlx5_0", 2, "Active", "LinkUp", 2.5, 65535),
        ("mlx5_1", 1, "Down", "Polling", 10.0, 12),
        ("mlx5_1", 2, "Down", "Disabled", 40.0, 12),
        ("mlx5_1", 3, "Initializing", "LinkUp", 100.0, 12),
    ]


def test_ibstatus_several_devices(tmp_path):
    def port(dev: str, n: int, state: str, phys: str, rate: str, layer: str) -> str:
        return (
            f"Infiniband device '{dev}' port {n} status:\n\tdefault gid:\t fe80:0000:0000:0000:0c42:a103:00a1:b2c3\n"
            f"\tbase lid:\t 0x{n:x}\n\tsm lid:\t\t 0x1\n\tstate:\t\t {state}\n\tphys state:\t {phys}\n"
            f"\trate:\t\t {rate}\n\tlink_layer:\t {layer}\n\n"
        )

    text = (
        port("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "InfiniBand")
        + port("mlx5_1", 1, "1: DOWN", "3: Disabled", "10 Gb/sec (4X)", "InfiniBand")
        + port("mlx5_bond_0", 1, "4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)", "Ethernet")
    )
    rows = read(write(tmp_path, "ibstatus.txt", text)).tables["ib_ports"]
    assert rows.select("ca", "state", "phys_state", "rate_gbps", "width", "link_layer", "lid").rows() == [
        ("mlx5_0", "Active", "LinkUp", 200.0, "4X", "InfiniBand", 1),
        ("mlx5_1", "Down", "Disabled", 10.0, "4X", "InfiniBand", 1),
        ("mlx5_bond_0", "Active", "LinkUp", 100.0, "4X", "Ethernet", 1),
    ]


DEVINFO_V = """hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tnode_guid:\t\t\tb83f:d203:00a1:b2c3
\tsys_image_guid:\t\t\tb83f:d203:00a1:b2c3
\tvendor_id:\t\t\t0x02c9
\tvendor_part_id:\t\t\t4129
\thw_ver:\t\t\t0x0
\tboard_id:\t\t\tMT_0000000838
\tphys_port_cnt:\t\t\t1
\tmax_mr_size:\t\t\t0xffffffffffffffff
\tpage_size_cap:\t\t\t0xfffffffffffff000
\tmax_qp:\t\t\t\t131072
\tdevice_cap_flags:\t\t0xed721c36
\t\t\t\t\tBAD_PKEY_CNTR
\t\t\t\t\tBAD_QKEY_CNTR
\t\t\t\t\tAUTO_PATH_MIG
\t\t\t\t\tCHANGE_PHY_PORT
\t\t\t\t\tUD_IP_CSUM
\t\t\t\t\tXRC
\t\t\t\t\tMEM_MGT_EXTENSIONS
\t\t\t\t\tMANAGED_FLOW_STEERING
\t\t\t\t\tUnknown flags: 0xC8400000
\tdevice_cap_exp_flags:\t\t0x5048F8F100000000
\t\t\t\t\tEXP_DC_TRANSPORT
\tmax_sge:\t\t\t30
\tatomic_cap:\t\t\tATOMIC_HCA (1)
\tcompletion timestamp_mask:\t\t\t0x7fffffffffffffff
\ttag matching not supported
\tnum_comp_vectors:\t\t63
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t1024 (3)
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tEthernet
\t\t\tmax_msg_sz:\t\t0x40000000
\t\t\tport_cap_flags:\t\t0x04010000
\t\t\tport_cap_flags2:\t0x0000
\t\t\tmax_vl_num:\t\tinvalid value (0)
\t\t\tbad_pkey_cntr:\t\t0x0
\t\t\tqkey_viol_cntr:\t\t0x0
\t\t\tsm_sl:\t\t\t0
\t\t\tpkey_tbl_len:\t\t1
\t\t\tgid_tbl_len:\t\t255
\t\t\tsubnet_timeout:\t\t0
\t\t\tinit_type_reply:\t0
\t\t\tactive_width:\t\t4X (2)
\t\t\tactive_speed:\t\t50.0 Gbps (64)
\t\t\tphys_state:\t\tLINK_UP (5)
\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:ba3f:d2ff:fea1:b2c3, RoCE v1
\t\t\tGID[  1]:\t\tfe80::ba3f:d2ff:fea1:b2c3, RoCE v2
\t\t\tGID[  2]:\t\t0000:0000:0000:0000:0000:ffff:0a00:0001, RoCE v1
\t\t\tGID[  3]:\t\t::ffff:10.0.0.1, RoCE v2

"""


def test_ibv_devinfo_verbose_full_with_tabs_or_spaces(tmp_path):
    for name, text in (("tabs.txt", DEVINFO_V), ("spaces.txt", DEVINFO_V.expandtabs(8))):
        result = read(write(tmp_path, name, text))
        assert result.account.errors == [] and result.account.unrecognized == 0, name
        (row,) = result.tables["ib_ports"].to_dicts()
        assert (row["ca"], row["port"], row["state"], row["phys_state"], row["active_mtu"], row["max_mtu"]) == (
            "mlx5_0",
            1,
            "Active",
            "LinkUp",
            1024,
            4096,
        ), name
        assert (row["width"], row["rate_gbps"], row["link_layer"], row["ca_type"]) == ("4X", 200.0, "Ethernet", "4129")


def mlx5_ethtool() -> tuple[str, dict[str, int]]:
    names = [f"{d}_{what}" for d in ("rx", "tx") for what in ("packets", "bytes", "csum_none", "xdp_drop")]
    names += [
        f"{d}_prio{p}_{what}"
        for p in range(8)
        for d in ("rx", "tx")
        for what in ("bytes", "packets", "pause", "pause_duration", "pause_transition", "discards")
    ]
    names += [f"ch{c}_{what}" for c in range(32) for what in ("events", "poll", "arm", "aff_change", "eq_rearm")]
    names += [
        "rx_discards_phy",
        "rx_out_of_buffer",
        "rx_symbol_err_phy",
        "rx_crc_errors_phy",
        "rx_corrected_bits_phy",
        "link_down_events_phy",
        "rx_pause_ctrl_phy",
        "tx_pause_ctrl_phy",
        "rx_buffer_passed_thres_phy",
        "rx_pcs_symbol_err_phy",
        "rx_err_lane_0_phy",
        "module_unplug",
        "module_bus_stuck",
    ]
    values = {name: i * 1_000_003 for i, name in enumerate(names)}
    return ethtool(values), values


def test_ethtool_mlx5_with_hundreds_of_counters(tmp_path):
    text, values = mlx5_ethtool()
    assert len(values) > 200
    result = read(write(tmp_path, "ethtool_ens1f0.txt", "$ ethtool -S ens1f0\n" + text))
    rows = result.tables["ib_counters"]
    assert result.account.unrecognized == 0 and dict(zip(rows["counter"], rows["value"])) == values
    assert set(rows["node"]) == {"ens1f0"}


def test_ethtool_of_other_drivers(tmp_path):
    ixgbe = (
        "NIC statistics:\n     rx_packets: 10\n     tx_queue_0_packets: 4\n"
        "     rx_queue_1_bytes: 99\n     os2bmc_rx_by_bmc: 0\n"
    )
    rows = read(write(tmp_path, "ixgbe.txt", ixgbe)).tables["ib_counters"]
    assert dict(zip(rows["counter"], rows["value"])) == {
        "rx_packets": 10,
        "tx_queue_0_packets": 4,
        "rx_queue_1_bytes": 99,
        "os2bmc_rx_by_bmc": 0,
    }
    bnxt = (
        "NIC statistics:\n     [0]: rx_ucast_packets: 5\n     [0]: rx_bcast_packets: 1\n     rx_total_discard_pkts: 2\n"
    )
    result = read(write(tmp_path, "bnxt.txt", bnxt))
    rows = result.tables["ib_counters"]
    assert dict(zip(rows["counter"], rows["value"])) == {
        "[0]: rx_ucast_packets": 5,
        "[0]: rx_bcast_packets": 1,
        "rx_total_discard_pkts": 2,
    }


def test_rdma_statistic_show_link(tmp_path):
    text = (
        "link mlx5_0/1 rx_write_requests 10 rx_read_requests 0 rx_atomic_requests 0 out_of_buffer 0 "
        "out_of_sequence 7 duplicate_request 1 rnr_nak_retry_err 0 packet_seq_err 3 implied_nak_seq_err 0 "
        "local_ack_timeout_err 2705 resp_local_length_error 0 np_cnp_sent 40 np_ecn_marked_roce_packets 44 "
        "rp_cnp_handled 12 rp_cnp_ignored 0 roce_adp_retrans 0 roce_slow_restart 0\n"
        "link mlx5_1/1 out_of_sequence 0 local_ack_timeout_err 0\n"
    )
    rows = read(write(tmp_path, "rdma.txt", text)).tables["ib_counters"]
    got = {(r["node"], r["port"], r["counter"]): r["value"] for r in rows.iter_rows(named=True)}
    assert got[("mlx5_0", 1, "local_ack_timeout_err")] == 2705 and got[("mlx5_0", 1, "np_cnp_sent")] == 40
    assert got[("mlx5_1", 1, "out_of_sequence")] == 0 and len(got) == 19


def test_sysfs_grep_of_hw_counters_and_counters(tmp_path):
    base = "/sys/class/infiniband/mlx5_2/ports/1"
    text = "".join(
        f"{base}/hw_counters/{n}:{v}\n"
        for n, v in [("out_of_sequence", 5), ("packet_seq_err", 2), ("np_cnp_sent", 9), ("rp_cnp_handled", 8)]
    )
    text += "".join(
        f"{base}/counters/{n}:{v}\n"
        for n, v in [("symbol_error", 1), ("port_xmit_wait", 123), ("port_xmit_data", 2**40), ("link_downed", 2)]
    )
    rows = read(write(tmp_path, "grep.txt", text)).tables["ib_counters"]
    got = {r["counter"]: (r["value"], r["source"], r["bits"]) for r in rows.iter_rows(named=True)}
    assert got["out_of_sequence"] == (5, "hw_counters", 64)
    assert got["SymbolErrorCounter"] == (1, "sysfs_counters", 16) and got["PortXmitData"] == (
        2**40,
        "sysfs_counters",
        64,
    )
    assert set(rows["node"]) == {"mlx5_2"} and set(rows["port"]) == {1}
