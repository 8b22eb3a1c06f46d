"""TL201-TL206 on generated before/after dumps and the real corpus; counter deltas."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from synth.fabric import FabricPort
from synth.fabric import ethtool as ethtool_text
from synth.fabric import ibstat as ibstat_text
from tests.helpers import corpus_dir, fire, tables_from
from tests.helpers.fabric import T0, ingest_folder, two_nodes
from tracelens.derived.counters import counter_deltas
from tracelens.findings import Severity
from tracelens.ingest import InputFile
from tracelens.ingest.fabric import ethtool, ibstat, perfquery
from tracelens.tables import RunTables

FABRIC_RULES = ["TL201", "TL202", "TL203", "TL204", "TL205", "TL206"]


def findings(tables: RunTables, rules=FABRIC_RULES):
    return [f for r in rules for f in fire(tables, r)]


def nccl_ranks() -> dict[str, list[dict]]:
    """NCCL on node02: ranks 4-5 use mlx5_0, ranks 6-7 use mlx5_1 (as `NET/IB : Using [0]mlx5_x:1/IB`)."""
    net = [
        {"host": "node02", "pid": 100 + r, "what": "ib_device", "name": f"mlx5_{(r - 4) // 2}", "port": 1}
        for r in range(4, 8)
    ]
    comms = [{"host": "node02", "pid": 100 + r, "rank": r} for r in range(4, 8)]
    return {"nccl_net": net, "nccl_comms": comms}


def with_nccl(tables: RunTables) -> RunTables:
    for name, rows in nccl_ranks().items():
        tables.add(name, pl.DataFrame(rows))
    return tables


# --- TL201 physical-layer errors -------------------------------------------------------------


def test_rising_symbol_errors_fire_on_exactly_that_port_and_name_its_ranks(tmp_path):
    folder = two_nodes(tmp_path, {("node02", "mlx5_1"): {"SymbolErrorCounter": 0.05}})
    (finding,) = findings(with_nccl(ingest_folder(folder)))
    assert finding.rule_id == "TL201" and finding.severity == Severity.WARNING
    assert finding.summary.startswith("node02 mlx5_1 port 1 (Lid 21): SymbolErrorCounter +90 ")
    assert finding.hosts == ["node02"] and finding.ranks == [6, 7]
    assert finding.window == (T0, T0 + timedelta(minutes=30))
    assert [e.location for e in finding.evidence] == ["node02/perfquery-after.txt:43"]


def test_healthy_before_after_fires_nothing(tmp_path):
    assert findings(ingest_folder(two_nodes(tmp_path, {}))) == []


def test_old_static_errors_do_not_fire(tmp_path):
    folder = two_nodes(tmp_path, {}, base={("node01", "mlx5_0"): {"SymbolErrorCounter": 12, "LinkDownedCounter": 1}})
    assert findings(ingest_folder(folder)) == []


def test_saturated_basic_counter_is_reported_as_saturated_not_as_a_delta(tmp_path):
    # 16-bit SymbolErrorCounter: 0.05/s for 90 min stays below 65535, 20/s pins it.
    folder = two_nodes(tmp_path, {("node01", "mlx5_0"): {"SymbolErrorCounter": 20}}, extended=False)
    tables = ingest_folder(folder)
    row = (
        counter_deltas(tables)
        .filter((pl.col("counter") == "SymbolErrorCounter") & (pl.col("host") == "node01") & (pl.col("lid") == 10))
        .row(0, named=True)
    )
    assert (row["before"], row["after"], row["status"], row["delta"]) == (65535, 65535, "saturated", None)
    (finding,) = findings(tables, ["TL201"])
    assert "saturated at its 16-bit maximum 65535 (increase unknown)" in finding.summary
    assert finding.severity == Severity.WARNING


def test_saturated_32_bit_data_counter_is_saturated_not_a_delta(tmp_path):
    # Basic PortCounters hold PortXmitData in 32 bits: a 400 Gb/s port pins it within a second.
    folder = two_nodes(tmp_path, {}, extended=False)
    row = (
        counter_deltas(ingest_folder(folder))
        .filter((pl.col("counter") == "PortXmitData") & (pl.col("host") == "node01") & (pl.col("lid") == 10))
        .row(0, named=True)
    )
    assert (row["before"], row["after"], row["status"], row["delta"]) == (2**32 - 1, 2**32 - 1, "saturated", None)


# --- TL202 link down, TL203 drops and congestion: the real switch-port dumps -----------------------


def _corpus_tables(*names: str) -> RunTables:
    folder = corpus_dir("perfquery")
    tables = RunTables()
    for name in names:
        result = perfquery.ingest([InputFile(path=folder / name, name=name, format="perfquery")])
        for table, frame in result.tables.items():
            tables.add(table, frame)
    return tables


@pytest.mark.parametrize(
    "name",
    ["perfquery_x_treydock_0x506b4b03005c2740.out", "treydock-infiniband_exporter__perfquery__0x506b4b03005c2740.out"],
)
def test_real_switch_port_with_errors_fires_link_down_and_discards(name):
    found = {f.rule_id: f for f in findings(_corpus_tables(name))}
    assert set(found) == {"TL202", "TL203"}
    assert found["TL202"].summary.startswith("Lid 2052 port 1: LinkDownedCounter 1 since the last clear")
    assert "PortXmitDiscards 20046 since the last clear" in found["TL203"].summary
    assert all(f.severity == Severity.INFO for f in found.values())  # one dump: not tied to the run


@pytest.mark.parametrize(
    "name",
    [
        "treydock-infiniband_exporter__perfquery__0x7cfe9003003b4b96.out",
        "treydock-infiniband_exporter__perfquery__0x7cfe9003003b4bde.out",
        "treydock-infiniband_exporter__perfquery-rcv-error__0x506b4b03005c2740-1.out",
        "gh_ibsim_pr1_perfquery_basic_partial.txt",
    ],
)
def test_real_all_zero_dumps_fire_nothing(name):
    assert findings(_corpus_tables(name)) == []


def test_link_down_between_dumps_is_critical(tmp_path):
    folder = two_nodes(tmp_path, {("node02", "mlx5_0"): {"LinkDownedCounter": 1 / 900}})
    (finding,) = findings(with_nccl(ingest_folder(folder)))
    assert (finding.rule_id, finding.severity, finding.ranks) == ("TL202", Severity.CRITICAL, [4, 5])
    assert "LinkDownedCounter +2" in finding.summary


def test_xmit_wait_share_of_the_interval(tmp_path):
    # 2.5e7 ticks/s of 4 ns = 10% of the time blocked: a warning; 1e6 ticks/s = 0.4%: below notice.
    folder = two_nodes(
        tmp_path, {("node01", "mlx5_1"): {"PortXmitWait": 2.5e7}, ("node02", "mlx5_0"): {"PortXmitWait": 1e6}}
    )
    (finding,) = findings(ingest_folder(folder))
    assert finding.rule_id == "TL203" and finding.severity == Severity.WARNING
    assert finding.summary.startswith(
        "node01 mlx5_1 port 1 (Lid 11): PortXmitWait +45000000000 (10.0% of the time blocked)"
    )


def test_counter_cleared_between_dumps_is_a_reset():
    rows = [
        {
            "host": "n1",
            "source": "perfquery_x",
            "node": "Lid 3",
            "port": 1,
            "counter": "PortXmitDiscards",
            "value": v,
            "bits": 64,
            "dump_ts": T0 + timedelta(minutes=m),
        }
        for v, m in ((500, 0), (30, 10))
    ]
    (row,) = counter_deltas(tables_from(ib_counters=rows)).to_dicts()
    assert (row["status"], row["delta"], row["interval_s"]) == ("reset", 30, 600)


def test_data_words_become_bytes():
    rows = [
        {
            "host": "n1",
            "source": "perfquery_x",
            "node": "Lid 3",
            "port": 1,
            "counter": "PortXmitData",
            "value": v,
            "bits": 64,
            "dump_ts": T0 + timedelta(seconds=s),
        }
        for v, s in ((1000, 0), (3500, 10))
    ]
    (row,) = counter_deltas(tables_from(ib_counters=rows)).to_dicts()
    assert (row["delta"], row["delta_bytes"], row["rate_per_s"]) == (2500, 10000, 250)


# --- TL204 RDMA retransmissions -------------------------------------------------------------


def test_rdma_ack_timeouts_rising(tmp_path):
    for host, after in (("node01", 0), ("node02", 2705)):
        for label, value, ts in (("before", 0, "09:00:00"), ("after", after, "09:30:00")):
            path = tmp_path / host / f"hw_counters-{label}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_text(
                f"2024-03-05T{ts}Z\n"
                + "".join(
                    (
                        f"/sys/class/infiniband/mlx5_0/ports/1/hw_counters/{name}:"
                        f"{value if name == 'local_ack_timeout_err' else 0}\n"
                    )
                    for name in ("local_ack_timeout_err", "out_of_sequence", "np_cnp_sent")
                )
            )
    tables = with_nccl(ingest_folder(tmp_path))
    (finding,) = findings(tables)
    assert (finding.rule_id, finding.hosts, finding.ranks) == ("TL204", ["node02"], [4, 5])
    assert "local_ack_timeout_err +2705" in finding.summary


# --- TL205 ports --------------------------------------------------------------------------------


def test_port_trained_below_its_peers(tmp_path):
    ports = [FabricPort("mlx5_0", lid=1), FabricPort("mlx5_1", lid=2), FabricPort("mlx5_2", lid=3, rate=100)]
    (tmp_path / "node02").mkdir()
    (tmp_path / "node02" / "ibstat.txt").write_text(ibstat_text(ports))
    (finding,) = findings(ingest_folder(tmp_path))
    assert finding.rule_id == "TL205" and finding.severity == Severity.WARNING
    assert finding.summary == "node02 mlx5_2 port 1: rate 100 Gb/s where the other ports have 400 Gb/s."


def test_down_port_nccl_does_not_use_is_info(tmp_path):
    ports = [
        FabricPort("mlx5_0", lid=1),
        FabricPort("mlx5_1", lid=2),
        FabricPort("mlx5_2", state="Down", phys_state="Disabled"),
    ]
    (tmp_path / "node02").mkdir()
    (tmp_path / "node02" / "ibstat.txt").write_text(ibstat_text(ports))
    tables = ingest_folder(tmp_path)
    (finding,) = findings(tables)
    assert (finding.severity, finding.summary) == (Severity.WARNING, "node02 mlx5_2 port 1: state Down.")
    (finding,) = findings(with_nccl(tables))
    assert finding.severity == Severity.INFO and finding.summary.endswith("(NCCL does not use it).")


def test_real_port_dumps():
    folder = corpus_dir("perfquery")
    assert findings(ingest_folder_of(folder, "gh_nccl_issue1591_ibstat_ndr400.txt")) == []
    (finding,) = findings(ingest_folder_of(folder, "gh_mooncake_issue1999_ibstat_roce_ethernet.txt"))
    assert finding.summary == "mlx5_10 port 1: state Down."


def ingest_folder_of(folder: Path, name: str) -> RunTables:
    result = ibstat.ingest([InputFile(path=folder / name, name=name, format="ibstat")])
    tables = RunTables()
    tables.add("ib_ports", result.tables["ib_ports"])
    return tables


# --- TL206 RoCE priority ---------------------------------------------------------------------


def test_roce_on_priority_zero_while_others_use_priority_three(tmp_path):
    counters = {
        "node01": {"rx_prio0_bytes": 9000, "tx_prio0_bytes": 8000, "rx_prio3_bytes": 0, "rx_prio3_pause": 0},
        "node02": {"rx_prio0_bytes": 10, "tx_prio0_bytes": 10, "rx_prio3_bytes": 9000, "rx_prio3_pause": 4},
    }
    for host, after in counters.items():
        (tmp_path / host).mkdir()
        (tmp_path / host / "ethtool-before.txt").write_text(
            "2024-03-05T09:00:00Z\n" + ethtool_text({k: 0 for k in after})
        )
        (tmp_path / host / "ethtool-after.txt").write_text("2024-03-05T09:30:00Z\n" + ethtool_text(after))
    found = findings(ingest_folder(tmp_path))
    (prio,) = [f for f in found if f.rule_id == "TL206"]
    assert prio.hosts == ["node01"] and prio.summary.startswith("node01: 100% of 17000 bytes on priority 0")
    assert [f.rule_id for f in found if f.rule_id != "TL206"] == ["TL203"]  # node02's pause frames (info)


def test_real_prio_zero_dump_alone_fires_nothing():
    name = "gh_byteps_issue179_ethtool_S_grep_prio_before.txt"
    result = ethtool.ingest([InputFile(path=corpus_dir("perfquery") / name, name=name, format="ethtool")])
    tables = RunTables()
    tables.add("ib_counters", result.tables["ib_counters"])
    assert findings(tables) == []
