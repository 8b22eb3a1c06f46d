"""TL410-TL412 on small hand-built tables: each fires on its evidence, names the right host,
port, rank and window, and stays quiet on a healthy run."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.helpers import fire
from tests.helpers.steps import SLOW, T0, analysed, at, counters, slow_span, steps
from tracelens.analyze import run_rules
from tracelens.derived import RunContext
from tracelens.derived.window_signals import Signal
from tracelens.findings.causes import Candidate, candidates
from tracelens.rules import select_rules
from tracelens.rules.correlate import _evidence_window

# -- TL410 ----------------------------------------------------------------------------------------


def test_a_slow_window_is_blamed_on_the_port_whose_errors_rose_in_it():
    t = analysed(
        steps=steps(slow=SLOW),
        # node02 mlx5_1 counts symbol errors only in the dump intervals around steps 100-140 (about 100-225 s)
        ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 3000, 6000, 6000, 6000, 6000])
        + counters("node01", "mlx5_1", "SymbolErrorCounter", [5] * 7),
        nccl_errors=[
            {
                "file": "node01/train.log",
                "line": 1000,
                "host": "node01",
                "kind": "ib_completion",
                "status": 12,
                "status_name": "IBV_WC_RETRY_EXC_ERR",
                "peer": "node02",
                "ts": at(150),
                "ts_quality": "exact",
                "message": "NET/IB : Got completion from peer node02 with status=12",
            }
        ],
    )
    (finding,) = fire(t, "TL410")
    assert finding.hosts == ["node02"] and finding.ports == ["mlx5_1:1"]
    assert "mlx5_1 port 1" in finding.title and "bad link" in finding.title
    assert finding.verdict.cause == "link"
    assert any(
        r.startswith("node02 mlx5_1 port 1: SymbolErrorCounter") and r.endswith("95% confidence)")
        for r in finding.verdict.because
    )
    assert not any("node01" in r for r in finding.verdict.because)  # its counter stood still at 5
    begin, end = slow_span()
    assert abs(finding.window[0] - begin) < timedelta(seconds=4) and finding.window[1] == end
    assert finding.cost_seconds > 70 and finding.score >= 1  # one source rose: the counters
    assert any(e.text.startswith("SymbolErrorCounter") for e in finding.evidence)


def test_the_joined_root_cause_ranks_above_its_symptoms():
    t = analysed(
        steps=steps(slow=SLOW),
        ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 3000, 6000, 6000, 6000, 6000]),
    )
    findings = run_rules(RunContext(t), select_rules(["TL2", "TL4"])).findings
    assert [f.rule_id for f in findings][:2] == ["TL410", "TL401"]


def test_congestion_at_both_ends_of_a_link_names_both_hosts():
    wait = [0, 0, 10**9, 2 * 10**9, 2 * 10**9, 2 * 10**9, 2 * 10**9]  # PortXmitWait ticks: 6% of a minute blocked
    t = analysed(
        steps=steps(slow=SLOW),
        ib_counters=counters("node01", "mlx5_0", "PortXmitWait", wait)
        + counters("node02", "mlx5_0", "PortXmitWait", wait),
    )
    (finding,) = fire(t, "TL410")
    assert finding.hosts == ["node01", "node02"] and finding.ports == ["mlx5_0:1"] and "congestion" in finding.title


def test_a_slow_window_without_network_evidence_says_what_to_collect():
    (finding,) = fire(analysed(steps=steps(slow=SLOW)), "TL410")
    assert "cause undetermined" in finding.title and finding.verdict.cause is None and finding.severity.label == "info"
    for advice in ("NCCL_DEBUG_TIMESTAMP_LEVELS=ALL", "perfquery -x", "udp dst port 4791"):
        assert advice in finding.summary


def test_errors_outside_the_window_do_not_explain_it():
    t = analysed(
        steps=steps(slow=SLOW),
        ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0, 0, 0, 0, 0, 0, 0, 500], every_s=60),
    )
    (finding,) = fire(t, "TL410")
    assert "cause undetermined" in finding.title  # the rise between 360 s and 420 s is long after the window
    assert any("SymbolErrorCounter" in r and r.endswith("no rise") for r in finding.verdict.against)


def test_a_window_where_one_hosts_compute_grew_is_blamed_on_that_straggler():
    def timers(host: str, rank: int, slow_compute: bool) -> list[dict]:
        rows = []
        for r in steps(slow=SLOW, file=f"{host}/train.log"):
            inside = r["step"] in SLOW
            compute = 600.0 * (3.0 if inside and slow_compute else 1.0)
            allreduce = 100.0 + (1200.0 if inside and not slow_compute else 0.0)
            rows.append(
                {
                    **r,
                    "host": host,
                    "rank": rank,
                    "iter_ms": None,
                    "fwd_ms": compute / 3,
                    "bwd_ms": 2 * compute / 3 + allreduce,
                    "bwd_allreduce_ms": allreduce,
                    "step_ms": 300.0,
                }
            )
        return rows

    (finding,) = fire(analysed(steps=timers("node01", 0, False) + timers("node02", 4, True)), "TL410")
    assert finding.hosts == ["node02"] and finding.ranks == [4] and "straggler" in finding.title


def _timers(host: str, rank: int, slow_compute: bool, compute_factor: float = 3.0, waits_every: int = 1) -> list[dict]:
    """Per-rank DeepSpeed timers of a synchronous step: inside SLOW (steps 3x as long) the slow rank's
    forward, backward and optimizer step take `compute_factor` x as long; the other ranks' compute
    stays flat and their all-reduce waits for as long as the slow steps last beyond theirs, on every
    step (a straggler, a rate limit) or on one step in `waits_every` (random loss: the steps that
    lost a segment)."""
    rows = []
    for r in steps(slow=SLOW, file=f"{host}/train.log"):
        inside = r["step"] in SLOW
        grow = compute_factor if inside and slow_compute else 1.0
        waits = inside and not slow_compute and r["step"] % waits_every == 0
        allreduce = 100.0 + (1800.0 * waits_every if waits else 0.0)
        rows.append(
            {
                **r,
                "host": host,
                "rank": rank,
                "iter_ms": None,
                "fwd_ms": 200.0 * grow,
                "bwd_ms": 400.0 * grow + allreduce,
                "bwd_allreduce_ms": allreduce,
                "step_ms": 300.0 * grow,
            }
        )
    return rows


def _steady_retransmissions(per_s: float, lower_in_window: bool) -> list[dict]:
    """A TCP flow 10.99.0.1 -> 10.99.0.2 over the whole run: a segment every 10 ms, and a
    loss-driven retransmission (an earlier segment resent) `per_s` times a second, a little less
    often inside the slow window (as on the real contended-rank run of issue 10)."""
    begin, end = (t - T0 for t in slow_span())
    rows, seq, frame, t, next_retx = [], 1000, 0, 0.0, 0.0
    while t < 330:
        frame += 1
        rows.append(
            {
                "file": "link.pcap",
                "frame": frame,
                "ts": at(t),
                "src": "10.99.0.1",
                "dst": "10.99.0.2",
                "proto": "tcp",
                "sport": 40000,
                "dport": 29500,
                "seq": seq,
                "ack": 1,
                "flags": 0x18,
                "payload": 1000,
                "length": 1054,
            }
        )
        seq += 1000
        if t >= next_retx:
            frame += 1
            rows.append({**rows[-1], "frame": frame, "ts": at(t + 0.005), "seq": seq - 50_000})
            slower = lower_in_window and begin.total_seconds() <= t <= end.total_seconds()
            next_retx = t + 1 / (per_s * (0.8 if slower else 1.0))
        t += 0.01
    return rows


def test_a_contended_rank_is_the_straggler_even_with_retransmissions_in_the_window():
    """Issue 10's real run: retransmissions about 4.5/s all run long (slightly fewer in the window), one
    rank's fwd and optimizer step 3x in the window, the other rank's compute flat and its all-reduce waiting."""
    t = analysed(
        steps=_timers("node01", 0, False) + _timers("node02", 1, True), packets=_steady_retransmissions(4.5, True)
    )
    (finding,) = fire(t, "TL410")
    v = finding.verdict
    assert v.cause == "straggler" and finding.ranks == [1] and finding.hosts == ["node02"], v.headline
    assert v.confidence == "high" and "seen in the logs of 2 ranks" in finding.summary
    assert any(
        r.startswith("rank 1 (node02): own work") and "forward 3.0x" in r and "step 3.0x)" in r for r in v.because
    )
    assert any(r.startswith("rank 0 (node01): time in phases that wait") and "(it waited)" in r for r in v.because)
    loss = [r for r in v.against if "loss-driven TCP retransmissions" in r]
    assert loss and loss[0].endswith("no rise") and "/s before" in loss[0] and "/s after" in loss[0]
    assert "bad link" not in finding.title and "loss" not in v.fix


def test_the_rank_that_waited_for_the_straggler_is_not_blamed_on_the_network():
    t = analysed(steps=_timers("node01", 0, False) + _timers("node02", 1, True))
    assert fire(t, "TL402") == []  # rank 0's all-reduce surged with its compute flat: it waited for rank 1
    (slow,) = fire(t, "TL401")  # one slow stretch of the job, not one per log
    assert "seen in the logs of 2 ranks" in slow.summary and slow.ranks == [0, 1]


def test_an_all_reduce_surge_with_every_ranks_compute_flat_is_still_the_network():
    (surge, *_) = fire(analysed(steps=_timers("node01", 0, False) + _timers("node02", 1, False)), "TL402")
    assert "the network slowed down" in surge.summary


def _retransmission_burst() -> list[dict]:
    """Retransmissions 0.5/s all run long, and 10x that in the slow window."""
    begin, end = slow_span()
    steady = _steady_retransmissions(0.5, False)
    burst = [
        {**r, "frame": 10_000 + i, "ts": r["ts"] + timedelta(milliseconds=7), "seq": r["seq"] - 20_000}
        for i, r in enumerate(steady[::20])
        if begin <= r["ts"] <= end
    ]
    return [{**r, "frame": i + 1} for i, r in enumerate(sorted(steady + burst, key=lambda r: r["ts"]))]


def test_the_same_retransmissions_rising_in_the_window_blame_the_link():
    """The contrast: compute flat on both ranks, the all-reduces of the steps that lost a segment
    waiting (random loss spares the others: lab-loss), and retransmissions 10x their rate outside
    the window: a bad link between the two hosts."""
    steps = _timers("node01", 0, False, waits_every=3) + _timers("node02", 1, False, waits_every=3)
    (finding,) = fire(analysed(steps=steps, packets=_retransmission_burst()), "TL410")
    assert finding.verdict.cause == "link" and finding.hosts == ["10.99.0.1", "10.99.0.2"], finding.verdict.headline
    assert any("loss-driven TCP retransmissions" in r and "rose (at least" in r for r in finding.verdict.because)


def test_drops_with_every_transfer_slowed_are_a_ceiling_not_a_bad_link():
    """lab-bandwidth's pattern: the same retransmissions, but every step's all-reduce on every rank
    slowed to one steady pace with compute flat: the path carried less than the job sent (a rate
    limit or congestion), and the drops are its tail drops."""
    steps = _timers("node01", 0, False) + _timers("node02", 1, False)
    (finding,) = fire(analysed(steps=steps, packets=_retransmission_burst()), "TL410")
    assert finding.verdict.cause == "congestion" and "bandwidth limit" in finding.title, finding.verdict.headline
    assert any("every transfer slowed" in r for r in finding.verdict.because)
    assert not any(c.startswith("runner-up: a bad link") for c in finding.verdict.against)


def test_every_rank_slower_is_contention_not_a_straggler():
    t = analysed(steps=_timers("node01", 0, True) + _timers("node02", 1, True))
    (finding,) = fire(t, "TL410")
    assert finding.verdict.cause == "contention" and finding.ranks == []


def test_a_steady_run_has_no_slow_window():
    t = analysed(steps=steps(), ib_counters=counters("node02", "mlx5_1", "SymbolErrorCounter", [0] * 7))
    assert fire(t, "TL410") == []


# -- TL411 ----------------------------------------------------------------------------------------


def _comms(world: int = 8) -> list[dict]:
    return [
        {"host": "node01" if r < 4 else "node02", "pid": 100 + r, "rank": r, "nranks": world, "event": "init_complete"}
        for r in range(world)
    ]


def _timeouts(ranks: list[int], started: float = 100.0) -> list[dict]:
    return [
        {
            "file": f"node0{1 + r // 4}/train.log",
            "line": 500 + r,
            "host": "node01" if r < 4 else "node02",
            "rank": r,
            "kind": "watchdog_timeout",
            "seq": 412,
            "op_type": "ALLREDUCE",
            "timeout_ms": 600_000,
            "ran_ms": 600_040 + r,
            "ts": at(started + 600.04 + r / 1000),
            "ts_quality": "exact",
            "message": f"[Rank {r}] Watchdog caught ...",
        }
        for r in ranks
    ]


def test_a_hang_names_the_rank_that_never_joined_the_collective():
    t = analysed(nccl_comms=_comms(), nccl_errors=_timeouts([0, 1, 2, 3, 4, 6, 7]))
    (finding,) = fire(t, "TL411")
    assert finding.ranks == [5] and finding.hosts == ["node02"]
    assert abs(finding.window[0] - at(100)) < timedelta(seconds=0.1) and finding.window[1] > at(700)
    assert "rank 5 never reported it" in finding.summary and finding.cost_seconds > 599
    (many,) = fire(analysed(nccl_comms=_comms(), nccl_errors=_timeouts([0, 1])), "TL411")
    assert many.ranks == [2, 3, 4, 5, 6, 7] and "ranks 2-7 never reported it" in many.summary
    assert "; ranks 2-7 on node01, node02 stopped first" in many.title


def test_a_hang_in_one_ranks_log_names_no_rank_for_the_logs_not_collected():
    """Only rank 1's log (its init line in the 64-rank communicator, its watchdog): the 63 others left no
    line here, which says nothing about whether they joined the collective (corpus: 'ranks 0 and 2-63
    stopped first' from one rank's log)."""
    comms = [{"host": "node01", "pid": 101, "rank": 1, "nranks": 64, "event": "init_complete"}]
    t = analysed(nccl_comms=comms, nccl_errors=_timeouts([1]))
    (finding,) = fire(t, "TL411")
    assert finding.ranks == [] and "stopped first" not in finding.title
    assert "63 ranks of the 64-rank job left no lines here" in finding.summary


def test_when_every_rank_reported_the_one_whose_steps_stopped_first_is_named():
    last_steps = [
        {
            "file": f"r{r}.log",
            "line": 1,
            "host": "node01" if r < 4 else "node02",
            "rank": r,
            "step": 50 if r == 6 else 51,
            "ts": at(95 if r == 6 else 99.5),
            "message": "timers",
        }
        for r in range(8)
    ]
    t = analysed(nccl_comms=_comms(), nccl_errors=_timeouts(list(range(8))), steps=last_steps)
    (finding,) = fire(t, "TL411")
    assert finding.ranks == [6] and finding.hosts == ["node02"]


def test_a_silent_stretch_in_every_log_of_a_host_is_a_stall():
    lines = [
        {
            "file": "node01/train.log",
            "line": i,
            "host": "node01",
            "ts": at(i if i < 100 else i + 900),
            "level": "INFO",
            "message": "x",
        }
        for i in range(1, 200)
    ]
    (finding,) = fire(analysed(nccl_events=lines), "TL411")
    assert finding.hosts == ["node01"] and "silent" in finding.title
    assert finding.window == (at(99), at(1000)) and finding.cost_seconds == 901


def test_a_run_that_logs_steadily_and_completes_has_no_stall():
    lines = [
        {"file": "node01/train.log", "line": i, "host": "node01", "ts": at(i * 3), "level": "INFO", "message": "x"}
        for i in range(1, 300)
    ]
    assert fire(analysed(nccl_events=lines, nccl_comms=_comms()), "TL411") == []


# -- TL412 ----------------------------------------------------------------------------------------


def _socket_choice(ts: datetime) -> list[dict]:
    return [
        {
            "file": "node02/train-2.log",
            "line": 3,
            "host": "node02",
            "pid": 7,
            "what": "network",
            "name": "Socket",
            "ts": ts,
            "ts_quality": "exact",
        }
    ]


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
    t = analysed(
        steps=steps(count=80) + steps(count=100, first=61, start=175, file="node01/train-2.log"),
        nccl_net=_socket_choice(at(170)),
    )
    assert fire(t, "TL412") == []


def _level(cause: str, rank: int, change: float, rose: bool | None = None) -> Signal:
    """One rank's step level in a window: `change` ms per step more than outside it."""
    rose = change > 50 if rose is None else rose
    return Signal(
        "steps",
        cause,
        cause,
        f"rank {rank}",
        rose,
        True,
        f"rank {rank} {cause} +{change:.0f} ms",
        (f"h{rank // 2}",),
        rank=rank,
        ratio=None,
        change=change,
    )


def _zero3(own: float, wait: dict[int, float], coll: dict[int, float], late: dict[int, float]) -> list[Signal]:
    """Four ranks under ZeRO-3: own work is the optimizer step alone, forward and backward are waiting."""
    signals = []
    for rank in range(4):
        signals += [_level("own", rank, own), _level("wait", rank, wait[rank]), _level("between", rank, 0.0)]
        signals += [_level("coll", rank, coll[rank]), _level("late", rank, late[rank], rose=False)]
    return signals


def test_under_zero3_the_rank_that_returned_late_from_its_calls_is_the_straggler():
    """Rank 2's forward ran 400 ms longer; the others waited for it in their asynchronous all-gathers
    (outside any timed call). It issued its calls last and returned from them 400 ms late."""
    signals = _zero3(0.0, {0: 400, 1: 400, 2: 410, 3: 390}, dict.fromkeys(range(4), 5.0), {0: 0, 1: 0, 2: 400, 3: -5})
    best = candidates(signals)[0]
    assert (best.cause, best.ranks) == ("straggler", [2])


def test_under_zero3_every_rank_slower_between_its_calls_is_contention():
    """Every rank's forward and backward rose 600 ms, 100 ms of it inside the collective calls, and no
    rank returned late: every rank computed slower."""
    signals = _zero3(0.0, dict.fromkeys(range(4), 600.0), dict.fromkeys(range(4), 100.0), dict.fromkeys(range(4), 0.0))
    assert candidates(signals)[0].cause == "contention"


def test_under_zero3_every_rank_slower_inside_its_calls_is_the_collectives():
    signals = _zero3(0.0, dict.fromkeys(range(4), 600.0), dict.fromkeys(range(4), 500.0), dict.fromkeys(range(4), 0.0))
    assert candidates(signals)[0].cause == "comm"


def test_a_late_rank_on_a_lossy_hop_is_the_link_not_a_straggler():
    """The same late arrival with no rank's own work risen, but a capture shows loss-driven retransmissions
    rose in the window: both ends of a lossy hop reach their next collective late, so the link is named
    and the late rank is at most the runner-up."""
    signals = _zero3(0.0, {0: 400, 1: 400, 2: 410, 3: 390}, dict.fromkeys(range(4), 5.0), {0: 0, 1: 0, 2: 400, 3: -5})
    lossy = Signal("packets", "link", "retransmissions", "h0 ↔ h1", True, True, "loss-driven retransmissions rose")
    ranked = candidates([*signals, lossy])
    assert ranked[0].cause == "link"
    assert all(c.score < ranked[0].score for c in ranked if c.cause == "straggler")


def test_under_zero3_a_rise_outside_the_calls_with_packets_lost_is_the_link():
    """Every rank's waiting rose outside its collective calls, as contention would, but an asynchronous
    call's wait sits outside it too: with loss-driven retransmissions risen in a capture, the link wins."""
    signals = _zero3(0.0, dict.fromkeys(range(4), 600.0), dict.fromkeys(range(4), 100.0), dict.fromkeys(range(4), 0.0))
    lossy = Signal("packets", "link", "retransmissions", "h0 ↔ h1", True, True, "loss-driven retransmissions rose")
    assert candidates([*signals, lossy])[0].cause == "link"


def _stalled_between(world: int) -> list[Signal]:
    """Rank 0 alone prints timers (DeepSpeed's default): its own work and waiting flat, the time between
    its steps up 200 ms per step."""
    return [_level("own", 0, 0.0, rose=False), _level("wait", 0, 5.0, rose=False), _level("between", 0, 200.0)]


def test_time_between_steps_alone_is_the_input():
    assert candidates(_stalled_between(world=4), world=4)[0].cause == "input"


def test_time_between_steps_with_packets_lost_is_the_link():
    """The loop's own collectives outside the timers (an all-reduce of the loss, a barrier) stall on lost
    packets too: with loss-driven retransmissions risen in a capture, the link wins."""
    lossy = Signal("packets", "link", "retransmissions", "h0 ↔ h1", True, True, "loss-driven retransmissions rose")
    ranked = candidates([*_stalled_between(world=4), lossy], world=4)
    assert ranked[0].cause == "link" and all(c.score < ranked[0].score for c in ranked if c.cause == "input")


def test_a_network_causes_window_is_its_events_not_the_ranks_waiting():
    # loss for 30 s: the capture's resends ran with it, every rank's waiting peaked in its middle 9 s
    def risen(source: str, cause: str, where: str, first: float, last: float) -> Signal:
        extent = (T0 + timedelta(seconds=first), T0 + timedelta(seconds=last))
        return Signal(source, cause, cause, where, True, True, "", extent=extent)

    resends = risen("packets", "link", "a ↔ b", 38.0, 68.0)
    waits = [risen("steps", "wait", f"rank {r}", 50.0, 59.0) for r in range(8)]
    link = Candidate("link", 2.0, [], ["a", "b"], [], [])
    begin, end = T0 + timedelta(seconds=38.5), T0 + timedelta(seconds=69.5)
    assert _evidence_window([resends, *waits], link, begin, end) == resends.extent
    assert _evidence_window(waits, link, begin, end) == waits[0].extent  # the waiting where nothing else is
