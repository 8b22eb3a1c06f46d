"""TL410-TL412 on small hand-built tables: each fires on its evidence, names the right host,
port, rank and window, and stays quiet on a healthy run."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.conftest import fire, tables_from
from tracelens.analyze import run_rules
from tracelens.rules import select_rules
from tracelens.timeline import align

T0 = datetime(2024, 12, 6, 18, 30, tzinfo=timezone.utc)
STEP_S = 1.0
SLOW = range(100, 140)  # steps 3x as long


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def steps(count: int = 300, slow: range = range(0), factor: float = 3.0, first: int = 1, start: float = 0.0,
          file: str = "node01/train.log", step_s: float = STEP_S) -> list[dict]:
    """Rank 0's step lines, each printed when its step ends; `slow` steps take `factor` x as long."""
    rows, t = [], start
    for step in range(first, first + count):
        took = step_s * (factor if step in slow else 1.0) * (1 + 0.01 * (step % 3))
        t += took
        rows.append({"file": file, "line": step, "host": "node01", "rank": 0, "engine": "0", "step": step,
                     "iter_ms": took * 1000, "ts": at(t), "message": f"iteration {step}"})
    return rows


def slow_span() -> tuple[datetime, datetime]:
    rows = steps(slow=SLOW)
    return rows[SLOW[0] - 2]["ts"], rows[SLOW[-1] - 1]["ts"]


def counters(host: str, ca: str, counter: str, values: list[int], every_s: float = 60.0) -> list[dict]:
    """A counter of one port dumped every `every_s` seconds from T0."""
    return [{"file": f"{host}/sysfs-{i}.txt", "line": 1, "host": host, "ts": at(i * every_s), "dump_ts": at(i * every_s),
             "ts_quality": "exact", "node": ca, "ca": ca, "port": 1, "counter": counter, "value": v,
             "source": "sysfs_counters", "bits": 64} for i, v in enumerate(values)]


def analysed(**rows):
    tables = tables_from(**rows)
    align(tables)
    return tables


# -- TL410 ----------------------------------------------------------------------------------------


def test_a_slow_window_is_blamed_on_the_port_whose_errors_rose_in_it():
    t = analysed(
        steps=steps(slow=SLOW),
        # node02 mlx5_1 counts symbol errors only in the dump intervals around steps 100-140 (about 100-225 s)
        ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 3000, 6000, 6000, 6000, 6000])
        + counters("node01", "mlx5_1", "SymbolErrorCounter", [5] * 7),
        nccl_errors=[{"file": "node01/train.log", "line": 1000, "host": "node01", "kind": "ib_completion", "status": 12,
                      "status_name": "IBV_WC_RETRY_EXC_ERR", "peer": "node02", "ts": at(150), "ts_quality": "exact",
                      "message": "NET/IB : Got completion from peer node02 with status=12"}],
    )
    (finding,) = fire(t, "TL410")
    assert finding.hosts == ["node02"] and finding.ports == ["mlx5_1:1"]
    assert "mlx5_1 port 1" in finding.title and "bad link" in finding.title
    assert "SymbolErrorCounter rose by 6,000" in finding.summary and "IB completion (IBV_WC_RETRY_EXC_ERR)" in finding.summary
    begin, end = slow_span()
    assert abs(finding.window[0] - begin) < timedelta(seconds=4) and finding.window[1] == end
    assert finding.cost_seconds > 70 and finding.score >= 2
    assert any(e.text.startswith("SymbolErrorCounter") for e in finding.evidence)


def test_the_joined_root_cause_ranks_above_its_symptoms():
    t = analysed(steps=steps(slow=SLOW), ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 3000, 6000, 6000, 6000, 6000]))
    findings = run_rules(t, select_rules(["TL2", "TL4"]))
    assert [f.rule_id for f in findings][:2] == ["TL410", "TL401"]


def test_congestion_at_both_ends_of_a_link_names_both_hosts():
    wait = [0, 0, 10**9, 2 * 10**9, 2 * 10**9, 2 * 10**9, 2 * 10**9]  # PortXmitWait ticks: 6% of a minute blocked
    t = analysed(steps=steps(slow=SLOW), ib_counters=counters("node01", "mlx5_0", "PortXmitWait", wait)
                 + counters("node02", "mlx5_0", "PortXmitWait", wait))
    (finding,) = fire(t, "TL410")
    assert finding.hosts == ["node01", "node02"] and finding.ports == ["mlx5_0:1"] and "congestion" in finding.title


def test_a_slow_window_without_network_evidence_says_what_to_collect():
    (finding,) = fire(analysed(steps=steps(slow=SLOW)), "TL410")
    assert "no network event" in finding.title
    for advice in ("NCCL_DEBUG_TIMESTAMP_LEVELS=ALL", "perfquery -x", "udp dst port 4791"):
        assert advice in finding.summary


def test_errors_outside_the_window_do_not_explain_it():
    t = analysed(steps=steps(slow=SLOW), ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 0, 0, 0, 0, 0, 500], every_s=60))
    (finding,) = fire(t, "TL410")
    assert "no network event" in finding.title  # the rise between 360 s and 420 s is long after the window


def test_a_window_where_one_hosts_compute_grew_is_blamed_on_that_straggler():
    def timers(host: str, rank: int, slow_compute: bool) -> list[dict]:
        rows = []
        for r in steps(slow=SLOW, file=f"{host}/train.log"):
            inside = r["step"] in SLOW
            compute = 600.0 * (3.0 if inside and slow_compute else 1.0)
            allreduce = 100.0 + (1200.0 if inside and not slow_compute else 0.0)
            rows.append({**r, "host": host, "rank": rank, "iter_ms": None, "fwd_ms": compute / 3, "bwd_ms": 2 * compute / 3 + allreduce,
                         "bwd_allreduce_ms": allreduce, "step_ms": 300.0})
        return rows

    (finding,) = fire(analysed(steps=timers("node01", 0, False) + timers("node02", 4, True)), "TL410")
    assert finding.hosts == ["node02"] and finding.ranks == [4] and "straggler" in finding.title


def test_a_steady_run_has_no_slow_window():
    t = analysed(steps=steps(), ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0] * 7))
    assert fire(t, "TL410") == []


# -- TL411 ----------------------------------------------------------------------------------------


def _comms(world: int = 8) -> list[dict]:
    return [{"host": "node01" if r < 4 else "node02", "pid": 100 + r, "rank": r, "nranks": world, "event": "init_complete"}
            for r in range(world)]


def _timeouts(ranks: list[int], started: float = 100.0) -> list[dict]:
    return [{"file": f"node0{1 + r // 4}/train.log", "line": 500 + r, "host": "node01" if r < 4 else "node02", "rank": r,
             "kind": "watchdog_timeout", "seq": 412, "op_type": "ALLREDUCE", "timeout_ms": 600_000, "ran_ms": 600_040 + r,
             "ts": at(started + 600.04 + r / 1000), "ts_quality": "exact", "message": f"[Rank {r}] Watchdog caught ..."}
            for r in ranks]


def test_a_hang_names_the_rank_that_never_joined_the_collective():
    t = analysed(nccl_comms=_comms(), nccl_errors=_timeouts([0, 1, 2, 3, 4, 6, 7]))
    (finding,) = fire(t, "TL411")
    assert finding.ranks == [5] and finding.hosts == ["node02"]
    assert abs(finding.window[0] - at(100)) < timedelta(seconds=0.1) and finding.window[1] > at(700)
    assert "rank 5 never reported it" in finding.summary and finding.cost_seconds > 599


def test_when_every_rank_reported_the_one_whose_steps_stopped_first_is_named():
    last_steps = [{"file": f"r{r}.log", "line": 1, "host": "node01" if r < 4 else "node02", "rank": r, "step": 50 if r == 6 else 51,
                   "ts": at(95 if r == 6 else 99.5), "message": "timers"} for r in range(8)]
    t = analysed(nccl_comms=_comms(), nccl_errors=_timeouts(list(range(8))), steps=last_steps)
    (finding,) = fire(t, "TL411")
    assert finding.ranks == [6] and finding.hosts == ["node02"]


def test_a_silent_stretch_in_every_log_of_a_host_is_a_stall():
    lines = [{"file": "node01/train.log", "line": i, "host": "node01", "ts": at(i if i < 100 else i + 900), "level": "INFO",
              "message": "x"} for i in range(1, 200)]
    (finding,) = fire(analysed(nccl_events=lines), "TL411")
    assert finding.hosts == ["node01"] and "silent" in finding.title
    assert finding.window == (at(99), at(1000)) and finding.cost_seconds == 901


def test_a_run_that_logs_steadily_and_completes_has_no_stall():
    lines = [{"file": "node01/train.log", "line": i, "host": "node01", "ts": at(i * 3), "level": "INFO", "message": "x"} for i in range(1, 300)]
    assert fire(analysed(nccl_events=lines, nccl_comms=_comms()), "TL411") == []


# -- TL412 ----------------------------------------------------------------------------------------


def _socket_choice(ts: datetime) -> list[dict]:
    return [{"file": "node02/train-2.log", "line": 3, "host": "node02", "pid": 7, "what": "network", "name": "Socket", "ts": ts,
             "ts_quality": "exact"}]


def test_a_socket_fallback_costs_the_slowdown_against_the_jobs_ib_steps():
    ib = steps(count=80)  # 80 s on IB
    relaunch = at(170)
    on_socket = steps(count=100, first=61, start=175, file="node01/train-2.log", step_s=1.9)
    t = analysed(steps=ib + on_socket, nccl_net=_socket_choice(relaunch))
    (finding,) = fire(t, "TL412")
    assert finding.hosts == ["node02"] and "1.9x" in finding.summary
    assert 80 < finding.cost_seconds < 100  # 100 steps, 0.9 s extra each
    assert abs(finding.window[0] - at(175)) < timedelta(seconds=3) and finding.window[1] == on_socket[-1]["ts"]


def test_a_run_on_sockets_from_the_start_has_nothing_to_compare_with():
    t = analysed(steps=steps(count=100, start=10, step_s=1.9), nccl_net=_socket_choice(at(0)))
    assert fire(t, "TL412") == []


def test_a_socket_fallback_that_costs_nothing_is_not_reported():
    t = analysed(steps=steps(count=80) + steps(count=100, first=61, start=175, file="node01/train-2.log"),
                 nccl_net=_socket_choice(at(170)))
    assert fire(t, "TL412") == []
