"""Fabric dump ingest: perfquery, ibstat, ibstatus, ibv_devinfo, ethtool -S, hw_counters."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from lark import Lark

from tests.helpers import corpus_dir
from tests.helpers.fabric import read, sniffed, write
from tracelens.ingest.fabric import ethtool, hw_counters
from tracelens.ingest.text.shell_context import parse_time
from tracelens.resources import grammar_text

# --- the real corpus -------------------------------------------------------------------

EXPECTED = {  # file name part -> (format, table, rows)
    "perfquery_x_treydock_0x506b": ("perfquery", "ib_counters", 22),
    "perfquery_x_treydock_0x7cfe9003009ce5b0": ("perfquery", "ib_counters", 44),
    "perfquery-rcv-error": ("perfquery", "ib_counters", 6),
    "perfquery__0x7cfe9003003b4b": ("perfquery", "ib_counters", 22),
    "perfquery__0x506b4b03005c2740": ("perfquery", "ib_counters", 22),
    "perfquery__0x7cfe9003009ce5b0": ("perfquery", "ib_counters", 44),
    "ibsim_pr1_perfquery_basic": ("perfquery", "ib_counters", 8),
    "ibstat_roce_ethernet": ("ibstat", "ib_ports", 3),
    "ibstat_ndr400": ("ibstat", "ib_ports", 1),
    "ibstatus_roce": ("ibstatus", "ib_ports", 3),
    "ibv_devinfo_roce_h100": ("ibv_devinfo", "ib_ports", 2),
    "ibv_devinfo_ib": ("ibv_devinfo", "ib_ports", 1),
    "ibv_devinfo_v_mlnxofed": ("ibv_devinfo", None, 0),  # cut before the port section
    "ethtool_S_grep_prio": ("ethtool", "ib_counters", 32),
    "ethtool_S_cx4": ("ethtool", "ib_counters", 23),
}


def test_every_corpus_file_is_read_into_the_right_table():
    folder = corpus_dir("perfquery")
    seen = 0
    for path in sorted(folder.iterdir()):
        if path.name == "SOURCES.md" or path.stat().st_size == 0:
            continue
        ((fmt, table, rows),) = [v for k, v in EXPECTED.items() if k in path.name]
        found = sniffed(path)
        assert found is not None and found.name == fmt, path.name
        result = read(path)
        acc = result.account
        assert acc.errors == [] and acc.unrecognized == 0, (path.name, acc.samples)
        assert acc.parsed + acc.ignored == acc.lines
        got = result.tables[table].height if table else 0
        assert got == rows, path.name
        seen += 1
    assert seen == 20


def test_empty_perfquery_file_gives_nothing_and_no_error():
    path = corpus_dir("perfquery") / "treydock-infiniband_exporter__perfquery__0x506b4b0300cc02a6.out"
    result = read(path, "perfquery")
    assert result.tables == {} and result.account.errors == [] and result.account.lines == 0


def test_extended_switch_port_dump_values():
    path = corpus_dir("perfquery") / "perfquery_x_treydock_0x506b4b03005c2740.out"
    rows = read(path).tables["ib_counters"]
    values = dict(zip(rows["counter"], rows["value"]))
    assert values["LinkDownedCounter"] == 1
    assert values["PortXmitDiscards"] == 20046
    assert values["PortXmitWait"] == 41864608
    assert values["PortXmitData"] == 178791657177235
    assert set(rows["node"]) == {"Lid 2052"} and set(rows["lid"]) == {2052} and set(rows["port"]) == {1}
    assert set(rows["source"]) == {"perfquery_x"} and set(rows["bits"]) == {64}  # CapMask2 0x2: all 64-bit
    assert "PortSelect" not in values and "CounterSelect" not in values


def test_extended_without_capmask2_keeps_basic_widths_for_errors():
    path = corpus_dir("perfquery") / "treydock-infiniband_exporter__perfquery__0x7cfe9003003b4b96.out"
    rows = read(path).tables["ib_counters"]
    bits = dict(zip(rows["counter"], rows["bits"]))
    assert bits["PortXmitData"] == 64 and bits["SymbolErrorCounter"] == 16 and bits["LinkDownedCounter"] == 8


def test_two_port_blocks_in_one_file():
    path = corpus_dir("perfquery") / "perfquery_x_treydock_0x7cfe9003009ce5b0.out"
    rows = read(path).tables["ib_counters"]
    wait = rows.filter(rows["counter"] == "PortXmitWait").sort("port")
    assert wait["port"].to_list() == [1, 2] and wait["value"].to_list() == [22730501, 36510964]


def test_detail_block_and_headerless_basic_block():
    folder = corpus_dir("perfquery")
    detail = read(folder / "treydock-infiniband_exporter__perfquery-rcv-error__0x7cfe9003009ce5b0-2.out")
    rows = detail.tables["ib_counters"]
    assert set(rows["source"]) == {"perfquery_detail"} and set(rows["port"]) == {2} and set(rows["bits"]) == {16}
    assert "PortLocalPhysicalErrors" in rows["counter"].to_list()
    basic = read(folder / "gh_ibsim_pr1_perfquery_basic_partial.txt")
    rows = basic.tables["ib_counters"]
    assert set(rows["source"]) == {"perfquery"} and set(rows["port"]) == {1}  # from PortSelect
    assert basic.account.ignored == 1  # the shell prompt line


def test_ibstat_roce_and_down_port():
    rows = read(corpus_dir("perfquery") / "gh_mooncake_issue1999_ibstat_roce_ethernet.txt").tables["ib_ports"]
    by_ca = {r["ca"]: r for r in rows.iter_rows(named=True)}
    assert by_ca["mlx5_0"]["state"] == "Active" and by_ca["mlx5_0"]["rate_gbps"] == 200
    assert by_ca["mlx5_0"]["link_layer"] == "Ethernet" and by_ca["mlx5_0"]["ca_type"] == "MT4129"
    assert by_ca["mlx5_10"]["state"] == "Down" and by_ca["mlx5_10"]["phys_state"] == "Disabled"


def test_ibstat_ib_port_lid():
    (row,) = read(corpus_dir("perfquery") / "gh_nccl_issue1591_ibstat_ndr400.txt").tables["ib_ports"].to_dicts()
    assert (row["ca"], row["port"], row["rate_gbps"], row["lid"], row["link_layer"]) == (
        "mlx5_5",
        1,
        400,
        987,
        "InfiniBand",
    )


def test_ibstatus_state_codes_rate_and_width():
    rows = read(corpus_dir("perfquery") / "gh_nccl_issue1866_ibstatus_roce.txt").tables["ib_ports"]
    first = rows.row(0, named=True)
    assert (first["ca"], first["state"], first["phys_state"], first["rate_gbps"], first["width"]) == (
        "mlx5_0",
        "Active",
        "LinkUp",
        100,
        "4X",
    )


def test_ibv_devinfo_starting_mid_record():
    rows = read(corpus_dir("perfquery") / "gh_deepep_issue38_ibv_devinfo_roce_h100_partial.txt").tables["ib_ports"]
    orphan, named = rows.to_dicts()
    assert orphan["ca"] is None and orphan["active_mtu"] == 4096 and orphan["link_layer"] == "Ethernet"
    assert (named["ca"], named["port"], named["state"], named["ca_type"]) == ("mlx5_2", 1, "Active", "4129")


def test_ibv_devinfo_verbose_with_tabs(tmp_path):
    text = (
        "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tdevice_cap_flags:\t\t0x1\n\t\t\t\t\tBAD_PKEY_CNTR\n"
        "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t1024 (3)\n"
        "\t\t\tlink_layer:\t\tEthernet\n\t\t\tactive_width:\t\t4X (2)\n\t\t\tactive_speed:\t\t25.0 Gbps (32)\n"
        "\t\t\tphys_state:\t\tLINK_UP (5)\n\t\t\tGID[  3]:\t\tfe80::1, RoCE v2\n"
    )
    result = read(write(tmp_path, "devinfo.txt", text))
    (row,) = result.tables["ib_ports"].to_dicts()
    assert (row["rate_gbps"], row["width"], row["active_mtu"], row["max_mtu"], row["phys_state"]) == (
        100,
        "4X",
        1024,
        4096,
        "LinkUp",
    )
    assert result.account.unrecognized == 0


# --- times, hosts, several dumps in one file ------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Tue Mar  5 09:00:00 UTC 2024", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("Tue Mar  5 10:00:00 CET 2024", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("Tue 05 Mar 2024 09:00:00 AM UTC", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("Tue, 05 Mar 2024 09:00:00 +0000", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("2024-03-05T11:00:00+02:00", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("2024-03-05 09:00:00", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("timestamp 1709629200", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("# date: 2024-03-05T09:00:00Z", datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)),
        ("PortXmitWait:....................41864608", None),
        ("Rate: 400", None),
    ],
)
def test_timestamp_lines(text, expected):
    assert parse_time(text) == expected


BLOCK = (
    "# Port counters: Lid 7 port 1 (CapMask: 0x1400)\nPortSelect:......................1\n"
    "SymbolErrorCounter:..............{n}\n"
)


def test_dumps_appended_with_date_lines_take_each_its_time_and_host(tmp_path):
    text = (
        "[root@gpu-node07 ~]# perfquery 7 1\n"
        + "Tue Mar  5 09:00:00 UTC 2024\n"
        + BLOCK.format(n=1)
        + "Tue Mar  5 09:15:00 UTC 2024\n"
        + BLOCK.format(n=5)
    )
    result = read(write(tmp_path, "loop.log", text))
    rows = result.tables["ib_counters"]
    assert rows["value"].to_list() == [1, 5]
    assert [t.minute for t in rows["dump_ts"]] == [0, 15]
    assert set(rows["ts_quality"]) == {"exact"} and set(rows["host"]) == {"gpu-node07"}
    assert result.account.unrecognized == 0


def test_time_from_file_name_then_mtime(tmp_path):
    named = read(write(tmp_path, "perfquery_20240305T091500.txt", BLOCK.format(n=0))).tables["ib_counters"]
    assert named["ts_quality"][0] == "filename" and named["dump_ts"][0] == datetime(
        2024, 3, 5, 9, 15, tzinfo=timezone.utc
    )
    plain = write(tmp_path, "perfquery_before.txt", BLOCK.format(n=0))
    os.utime(plain, (1709629200, 1709629200))
    rows = read(plain).tables["ib_counters"]
    assert rows["ts_quality"][0] == "mtime" and rows["dump_ts"][0] == datetime(2024, 3, 5, 9, 0, tzinfo=timezone.utc)


def test_hostname_command_and_legacy_names(tmp_path):
    text = (
        "$ hostname\nnode12\n# Port counters: Lid 3 port 1\nSymbolErrors:....................4\n"
        "XmtWait:.........................9\n"
    )
    rows = read(write(tmp_path, "pq.txt", text)).tables["ib_counters"]
    assert rows["counter"].to_list() == ["SymbolErrorCounter", "PortXmitWait"]
    assert set(rows["host"]) == {"node12"}


def test_a_prompt_names_its_host_whatever_the_command_and_ssh_names_the_one_it_ran_on(tmp_path):
    prompt = read(write(tmp_path, "pq.txt", "root@gpu-node07:~$ cd /data/dumps\n" + BLOCK.format(n=2)))
    assert set(prompt.tables["ib_counters"]["host"]) == {"gpu-node07"}
    assert prompt.account.unrecognized == 0 and prompt.account.ignored == 1
    remote = read(write(tmp_path, "pq2.txt", "ssh root@gpu-node05 perfquery 7 1\n" + BLOCK.format(n=2)))
    assert set(remote.tables["ib_counters"]["host"]) == {"gpu-node05"}


def test_xmit_wait_dropped_when_the_port_cannot_count_it(tmp_path):
    text = (
        "# Port counters: Lid 3 port 1 (CapMask: 0x0200)\nPortSelect:......................1\n"
        "PortXmitWait:....................0\n"
    )
    result = read(write(tmp_path, "pq.txt", text))
    assert "ib_counters" not in result.tables


def test_ethtool_netdev_from_the_command_line(tmp_path):
    text = "$ ethtool -S ens1f0 | grep prio\n     rx_prio3_pause: 12\n     tx_prio0_bytes: 5\n"
    rows = read(write(tmp_path, "eth.txt", text)).tables["ib_counters"]
    assert set(rows["node"]) == {"ens1f0"} and rows["value"].to_list() == [12, 5]


def test_garbage_is_counted_never_raised(tmp_path):
    path = tmp_path / "pq.txt"
    path.write_bytes(b"# Port counters: Lid 3 port 1\n\xff\xfe garbage \x00 line\nPortSelect:......................1\n")
    result = read(path, "perfquery")
    assert result.account.unrecognized == 1 and result.account.samples[0][0] == 2


# --- the regex readers agree with the grammars ------------------------------------------


def _lark(name: str) -> Lark:
    return Lark(grammar_text(name), parser="lalr")


def test_ethtool_reader_agrees_with_its_grammar():
    grammar = _lark("ethtool")
    lines = [line for f in corpus_dir("perfquery").glob("*ethtool*") for line in f.read_text().splitlines()]
    lines += ["     weird name.with-dots: 7", "NIC statistics:", "not a counter", "     rx_bytes: -1"]
    for line in lines:
        try:
            tree = grammar.parse(line.strip())
        except Exception:
            tree = None
        ours = ethtool.parse_line(line)
        if tree is None:
            assert ours is None, line
        elif tree.data == "header":
            assert ours == ethtool.HEADER
        else:
            assert ours == (str(tree.children[0]), int(tree.children[1])), line


def test_hw_counters_reader_agrees_with_its_grammar():
    grammar = _lark("hw_counters")
    lines = [
        "/sys/class/infiniband/mlx5_0/ports/1/hw_counters/local_ack_timeout_err:2705",
        "/sys/class/infiniband/mlx5_1/ports/2/counters/port_xmit_wait:99",
        "hw_counters/out_of_sequence:3",
        "link mlx5_0/1 rx_write_requests 0 out_of_sequence 12",
        "local_ack_timeout_err 3",
        "/sys/class/net/eth0/statistics/rx_bytes:5",
    ]
    for line in lines:
        try:
            tree = grammar.parse(line)
        except Exception:
            tree = None
        ours = hw_counters.parse_line(line)
        assert (tree is None) == (ours is None), line
        if tree is not None:
            values = [int(t) for t in tree.scan_values(lambda t: t.type == "INT")]
            assert [c["value"] for c in ours] == values[-len(ours) :], line
