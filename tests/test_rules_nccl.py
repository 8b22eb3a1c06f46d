"""TL101-TL109 on small hand-built tables: each rule fires on its case and stays quiet on a healthy one."""

from __future__ import annotations

from tests.helpers import fire, tables_from
from tracelens.findings import Severity

IB_HEALTHY = dict(
    nccl_events=[
        {"host": "node01", "pid": 11, "kind": "version", "message": "NCCL version 2.21.5+cuda12.4"},
        {"host": "node02", "pid": 21, "kind": "version", "message": "NCCL version 2.21.5+cuda12.4"},
    ],
    nccl_net=[
        {"host": "node01", "pid": 11, "what": "network", "name": "IB"},
        {"host": "node01", "pid": 11, "what": "ib_device", "name": "mlx5_0", "port": 1, "link_layer": "IB"},
        {"host": "node01", "pid": 11, "what": "bootstrap_if", "name": "eth0", "address": "10.0.0.1"},
        {"host": "node02", "pid": 21, "what": "network", "name": "IB"},
        {"host": "node02", "pid": 21, "what": "bootstrap_if", "name": "eth0", "address": "10.0.0.2"},
    ],
    nccl_channels=[
        {
            "host": "node01",
            "pid": 11,
            "transport": "NET",
            "net": "IB",
            "gdr": True,
            "src_rank": 3,
            "dst_rank": 4,
            "direction": "send",
        },
        {
            "host": "node02",
            "pid": 21,
            "transport": "NET",
            "net": "IB",
            "gdr": True,
            "src_rank": 3,
            "dst_rank": 4,
            "direction": "receive",
        },
        {"host": "node01", "pid": 11, "transport": "P2P/IPC", "src_rank": 0, "dst_rank": 1},
    ],
    nccl_env=[
        {"host": "node01", "pid": 11, "name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"host": "node02", "pid": 21, "name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
    ],
    nccl_comms=[
        {"host": "node01", "pid": 11, "rank": 3, "nranks": 8, "event": "init_complete"},
        {"host": "node02", "pid": 21, "rank": 4, "nranks": 8, "event": "init_complete"},
    ],
)


def healthy(**changes):
    """The healthy two-node IB tables with some tables replaced or extended."""
    rows = {name: list(items) for name, items in IB_HEALTHY.items()}
    for name, items in changes.items():
        rows[name] = rows.get(name, []) + items
    return tables_from(**rows)


def test_healthy_ib_run_fires_no_nccl_rule():
    tables = healthy()
    for rule_id in ["TL101", "TL102", "TL103", "TL104", "TL105", "TL106", "TL107", "TL108", "TL109"]:
        assert fire(tables, rule_id) == [], rule_id


def test_socket_channels_on_an_ib_run_are_critical():
    tables = healthy(
        nccl_channels=[
            {
                "host": "node02",
                "pid": 22,
                "transport": "NET",
                "net": "Socket",
                "gdr": False,
                "src_rank": 5,
                "dst_rank": 6,
                "direction": "send",
            }
        ]
    )
    (finding,) = fire(tables, "TL101")
    assert finding.severity is Severity.CRITICAL
    assert finding.hosts == ["node02"]
    assert "1 channel connection via NET/Socket" in finding.summary
    assert "NCCL_IB_HCA" in finding.fix  # the documented fix is attached


def test_socket_network_on_one_node_without_network_channels_is_only_info():
    tables = tables_from(
        nccl_events=[{"host": "box", "pid": 1, "kind": "network", "message": "Using network Socket"}],
        nccl_net=[{"host": "box", "pid": 1, "what": "network", "name": "Socket"}],
        nccl_channels=[{"host": "box", "pid": 1, "transport": "P2P/IPC", "src_rank": 0, "dst_rank": 1}],
    )
    (finding,) = fire(tables, "TL101")
    assert finding.severity is Severity.INFO


def test_ib_missing_alone_is_a_warning_with_its_line_as_evidence():
    tables = tables_from(
        nccl_events=[{"host": "c1", "pid": 7, "kind": "ib_missing", "message": "NET/IB : No device found.", "line": 5}],
        nccl_net=[{"host": "c1", "pid": 7, "what": "ib_missing", "name": "no_device", "line": 5}],
    )
    (finding,) = fire(tables, "TL101")
    assert finding.severity is Severity.WARNING
    assert [(e.location, e.text) for e in finding.evidence] == [("t.log:5", "NET/IB : No device found.")]


def test_ib_disable_from_nccl_echo_and_from_launcher_config():
    tables = healthy(nccl_env=[{"host": "node02", "pid": 21, "name": "NCCL_IB_DISABLE", "value": "1."}])
    (finding,) = fire(tables, "TL102")
    assert finding.severity is Severity.CRITICAL  # IB HCAs are present in the run
    assert [f.rule_id for f in fire(tables, "TL101")] == ["TL101"]  # and the traffic is on sockets
    assert finding.hosts == ["node02"]
    launcher = tables_from(deepspeed_settings=[{"host": "n1", "key": "NCCL_NET", "value": "Socket", "source": "env"}])
    assert [f.rule_id for f in fire(launcher, "TL102")] == ["TL102"]
    disabled_zero = healthy(nccl_env=[{"host": "node02", "pid": 21, "name": "NCCL_IB_DISABLE", "value": "0."}])
    assert fire(disabled_zero, "TL102") == []


def test_mixed_transports_names_both_sides():
    tables = healthy(
        nccl_net=[{"host": "node03", "pid": 31, "what": "network", "name": "Socket"}],
        nccl_comms=[{"host": "node03", "pid": 31, "rank": 5, "nranks": 8}],
    )
    (finding,) = fire(tables, "TL103")
    assert "node03" in finding.summary and "IB" in finding.summary
    assert finding.ranks == [5]
    assert set(finding.hosts) == {"node01", "node02", "node03"}


def test_gdr_missing_on_ib_channels_and_gdr_level_setting():
    tables = healthy(
        nccl_channels=[
            {
                "host": "node02",
                "pid": 21,
                "transport": "NET",
                "net": "IB",
                "gdr": False,
                "src_rank": 4,
                "dst_rank": 3,
                "direction": "send",
            }
        ],
        nccl_env=[{"host": "node02", "pid": 21, "name": "NCCL_NET_GDR_LEVEL", "value": "0"}],
    )
    (finding,) = fire(tables, "TL104")
    assert "1 of 3 network channel connections without /GDRDMA" in finding.summary
    assert "NCCL_NET_GDR_LEVEL=0" in finding.summary
    # Socket channels never have GDR: they are TL101's business, not TL104's.
    sockets = healthy(nccl_channels=[{"host": "node02", "pid": 21, "transport": "NET", "net": "Socket", "gdr": False}])
    assert fire(sockets, "TL104") == []


def test_suspect_interfaces_but_only_the_bootstrap_interface_nccl_uses():
    listed = healthy(
        nccl_net=[
            {"host": "node03", "pid": 31, "what": "bootstrap_if", "name": "enp7s0", "address": "10.10.1.5", "line": 40},
            {
                "host": "node03",
                "pid": 31,
                "what": "bootstrap_if",
                "name": "virbr0",
                "address": "192.168.122.1",
                "line": 40,
            },
        ]
    )
    assert fire(listed, "TL105") == []  # NCCL 2.4-2.9 list every interface; the first is the one used
    docker = healthy(
        nccl_net=[{"host": "node03", "pid": 31, "what": "socket_if", "name": "docker0", "address": "172.17.0.1"}]
    )
    (finding,) = fire(docker, "TL105")
    assert "socket docker0:172.17.0.1" in finding.summary
    link_local = healthy(
        nccl_net=[
            {"host": "node03", "pid": 31, "what": "oob_if", "name": "ib1", "address": "fe80::966d:ae03:a2:8cf0%ib1"}
        ]
    )
    assert [f.rule_id for f in fire(link_local, "TL105")] == ["TL105"]


def test_version_skew_and_setting_skew():
    tables = healthy(
        nccl_events=[{"host": "node03", "pid": 31, "kind": "version", "message": "NCCL version 2.18.3+cuda12.2"}],
        nccl_env=[{"host": "node03", "pid": 31, "name": "NCCL_SOCKET_IFNAME", "value": "bond0"}],
    )
    findings = fire(tables, "TL106")
    assert [f.title for f in findings] == ["NCCL versions differ across the run", "NCCL settings differ across the run"]
    assert "2.18.3 on node03" in findings[0].summary and "2.21.5 on node01, node02" in findings[0].summary
    assert "NCCL_SOCKET_IFNAME = bond0 / eth0" in findings[1].summary


def test_a_setting_set_to_nothing_is_the_empty_value_in_the_skew():
    """`NCCL_TREE_THRESHOLD set by environment to` with no value gives a null value, which the setting
    skew's sentence writes as (empty)."""
    tables = healthy(nccl_env=[{"host": "node03", "pid": 31, "name": "NCCL_SOCKET_IFNAME", "value": None}])
    (finding,) = [f for f in fire(tables, "TL106") if "settings" in f.title]
    assert "NCCL_SOCKET_IFNAME = (empty) / eth0" in finding.summary


def test_ib_completion_errors_grouped_per_host_with_first_real_error():
    err = {"host": "node02", "pid": 21, "kind": "ib_completion", "peer": "10.0.0.1<4242>"}
    tables = healthy(
        nccl_errors=[
            {
                **err,
                "status": 12,
                "status_name": "IBV_WC_RETRY_EXC_ERR",
                "message": "NET/IB : Got completion from peer 10.0.0.1<4242> with status=12 ...",
            },
            {**err, "status": 5, "status_name": "IBV_WC_WR_FLUSH_ERR", "message": "... status=5 ..."},
            {**err, "status": 5, "status_name": "IBV_WC_WR_FLUSH_ERR", "message": "... status=5 ..."},
            {
                "host": "node01",
                "pid": 11,
                "kind": "ib_completion",
                "status": 12,
                "message": "NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
            },
        ]
    )
    findings = {f.hosts[0]: f for f in fire(tables, "TL107")}
    assert set(findings) == {"node01", "node02"}
    node02 = findings["node02"]
    assert "3 IB completion errors on node02 with peer 10.0.0.1<4242>" in node02.summary
    assert "2 x IBV_WC_WR_FLUSH_ERR (5), 1 x IBV_WC_RETRY_EXC_ERR (12)" in node02.summary
    assert "First non-flush error: IBV_WC_RETRY_EXC_ERR (12)" in node02.summary
    assert node02.ranks == [4]
    assert "NCCL_IB_TIMEOUT" in node02.fix and "NCCL_IB_RETRY_CNT" in node02.fix


def test_watchdog_timeouts_grouped_per_collective():
    wd = {"kind": "watchdog_timeout", "op_type": "ALLREDUCE", "seq": 1580, "timeout_ms": 600000}
    tables = healthy(
        nccl_errors=[
            {**wd, "host": "node01", "rank": 0, "ran_ms": 600060},
            {**wd, "host": "node02", "rank": 4, "ran_ms": 600067},
            {"kind": "watchdog_exception", "host": "node01", "rank": 0, "seq": 1580, "op_type": None},
            {
                "kind": "watchdog_timeout",
                "op_type": "BROADCAST",
                "seq": 7,
                "timeout_ms": 1800000,
                "rank": 2,
                "host": "node01",
            },
        ]
    )
    findings = fire(tables, "TL108")
    summaries = [f.summary for f in findings]
    assert len(findings) == 2  # the exception line joins the timeout of the same SeqNum
    assert any(
        (
            "ALLREDUCE SeqNum=1580 timed out after Timeout(ms)=600000 "
            "(ran up to 600067 ms), reported by 2 ranks (0 and 4) in 3 lines"
        )
        in s
        for s in summaries
    )
    assert any(s.startswith("BROADCAST SeqNum=7") for s in summaries)
    # which collective is in the title: several timeouts are told apart in the findings list
    assert sorted(f.title for f in findings) == [
        "Collective timed out: ALLREDUCE SeqNum=1580",
        "Collective timed out: BROADCAST SeqNum=7",
    ]
    assert all(f.severity is Severity.CRITICAL for f in findings)


def test_socket_and_bootstrap_failures_one_finding_per_kind():
    tables = healthy(
        nccl_errors=[
            {
                "kind": "socket",
                "host": "node01",
                "message": "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
            },
            {
                "kind": "socket",
                "host": "node02",
                "message": "socketProgress: Connection closed by remote peer node1<57557>",
            },
            {
                "kind": "bootstrap",
                "host": "node01",
                "message": "Bootstrap Root : mismatch in rank count from procs 8 : 16",
            },
            {"kind": "warn", "host": "node01", "message": "some other warning"},
        ]
    )
    findings = fire(tables, "TL109")
    assert sorted(f.title for f in findings) == ["NCCL bootstrap failures", "NCCL socket connection failures"]
    socket = [f for f in findings if "socket" in f.title][0]
    assert socket.summary.startswith(
        "2 socket connection failures on 2 hosts; first: socketStartConnect: Connect to 10.0.0.2<45763>"
    )


def test_watchdog_taking_the_process_down_without_details_is_still_a_timeout_finding():
    down = {"kind": "watchdog_abort", "message": "Some NCCL operations have failed or timed out. ..."}
    tables = healthy(nccl_errors=[{**down, "host": "node01"}, {**down, "host": "node02"}])
    (finding,) = fire(tables, "TL108")
    assert finding.title == "Collective failed or timed out"
    assert "took the process down after NCCL operations failed or timed out (2 lines)" in finding.summary


def test_socket_interface_list_alone_is_not_a_fallback():
    # NCCL 2.4 prints `NET/Socket : Using [0]ib0:...` before `NET/IB : Using [0]mlx5_0:1/IB` on IB runs.
    tables = tables_from(
        nccl_net=[{"host": "c1", "pid": 5, "what": "socket_if", "name": "ib0", "address": "192.168.11.1"}]
    )
    assert fire(tables, "TL101") == []


def test_an_error_pytorch_quotes_after_last_error_counts_once():
    text = "NET/IB : Got completion from peer 10.0.0.1<4242> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
    err = {"kind": "ib_completion", "status": 12, "peer": "10.0.0.1<4242>", "message": text, "host": "node02"}
    tables = healthy(nccl_errors=[{**err, "pid": 21}, {**err, "pid": None}])  # the WARN, and PyTorch's quote of it
    (finding,) = fire(tables, "TL107")
    assert finding.summary.startswith("1 IB completion error on node02")
    quoted_only = healthy(nccl_errors=[{**err, "pid": None}])  # NCCL_DEBUG unset: the quote is all there is
    assert [f.rule_id for f in fire(quoted_only, "TL107")] == ["TL107"]
