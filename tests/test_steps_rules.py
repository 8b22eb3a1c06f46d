"""TL401-TL404 on generated DeepSpeed runs and on small tables: each fires where it should and not on a healthy run."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import polars as pl
import pytest

from synth.deepspeed import DeepSpeedTraining, DsConfig, Phases
from synth.runs import Scenario, write
from synth.scenarios import pair
from tests.helpers import FIXTURES, fire, tables_from
from tracelens.analyze import analyze
from tracelens.derived.step_times import _ordinary, slow_windows, step_series
from tracelens.findings import Severity


def findings(tmp_path, training: DeepSpeedTraining, prefix: str = "TL4"):
    folder = write(Scenario(name="run", description="generated", rules=(), hosts=pair(), story=(training,)), tmp_path)
    return [f for f in analyze(folder).findings if f.rule_id.startswith(prefix)]


def test_slow_window_fires_with_its_edges_and_cost(analysis_of):
    (window,) = [f for f in analysis_of("ds-slow-window").findings if f.rule_id == "TL401"]
    assert "steps 120-159" in window.title and "3.0x" in window.title
    assert window.cost_seconds == pytest.approx(40 * 2 * 0.42, rel=0.1)  # 40 steps, 2x the 420 ms baseline extra
    assert window.window is not None and window.window[0] < window.window[1]
    assert window.evidence[0].text.startswith("time (ms) | fwd: ")


@pytest.mark.parametrize("first,last", [(40, 71), (200, 250)])
def test_spike_rule_finds_other_windows_within_two_steps(tmp_path, first, last):
    (f,) = [f for f in findings(tmp_path, DeepSpeedTraining(slow=(first, last, 3.0))) if f.rule_id == "TL401"]
    lo, hi = (int(x) for x in f.title.split("steps ")[1].split(" ")[0].split("-"))
    assert abs(lo - first) <= 2 and abs(hi - last) <= 2


def test_the_baseline_is_robust_not_a_fixed_threshold(tmp_path):
    # a slow run is slow everywhere: no spike; the same 3x steps in a 3x slower run are spikes again
    assert findings(tmp_path / "a", DeepSpeedTraining(phases=Phases(fwd=900.0, bwd_inner=1800.0))) == []
    slow = findings(
        tmp_path / "b",
        DeepSpeedTraining(phases=Phases(fwd=900.0, bwd_inner=1800.0), slow=(100, 130, 3.0)),
        prefix="TL40",
    )
    assert [f.rule_id for f in slow] == ["TL401", "TL402"]


def test_healthy_fixture_fires_nothing(analysis_of):
    assert analysis_of("ds-healthy-steps").findings == []


def test_comm_surge_blames_the_network_only_when_every_rank_is_timed(analysis_of):
    # rank 0's timers of an 8-rank job: the rank it waited for may be one of the seven without timers
    (partial,) = [f for f in analysis_of("ds-slow-window").findings if f.rule_id == "TL402"]
    assert "steps 120-159" in partial.title and "stayed at 1.00x" in partial.summary
    assert "7 other ranks of the job log no timers" in partial.summary and "network slowed down" not in partial.summary
    run = FIXTURES / "lab-matrix" / "ds4z2ov-02-loss-8"  # real: every rank's timers, 8% loss
    if not run.exists():
        pytest.skip("no lab matrix in fixtures/")
    (whole,) = [f for f in analysis_of(run).findings if f.rule_id == "TL402"]
    assert "seen in the logs of 4 ranks: the network slowed down" in whole.summary


def test_comm_bound_throughout(tmp_path):
    bound = findings(tmp_path, DeepSpeedTraining(phases=Phases(bwd_allreduce=300.0)), prefix="TL")
    assert sorted(f.rule_id for f in bound) == ["TL402", "TL504"]  # and no accumulation to spread it
    (tl402,) = [f for f in bound if f.rule_id == "TL402"]
    assert "49%" in tl402.title
    accumulating = findings(
        tmp_path / "gas",
        DeepSpeedTraining(phases=Phases(bwd_allreduce=300.0), config=DsConfig(gradient_accumulation_steps=4)),
        prefix="TL",
    )
    assert [f.rule_id for f in accumulating] == ["TL402"]


def _throughput_rows(values: list[float], skipped: list[int] | None = None) -> list[dict]:
    start = datetime(2024, 1, 1)
    return [
        {
            "host": "n1",
            "engine": "0",
            "rank": 0,
            "step": i * 10,
            "samples_per_sec": v,
            "skipped": (skipped or [0] * len(values))[i],
            "ts": start + timedelta(seconds=i),
        }
        for i, v in enumerate(values)
    ]


def test_throughput_drop():
    (f,) = fire(tables_from(steps=_throughput_rows([100.0] * 30 + [70.0] * 30)), "TL403")
    assert "from a steady 100.0 to 70.0" in f.summary and f.window is not None
    assert fire(tables_from(steps=_throughput_rows([100.0] * 30 + [95.0] * 30)), "TL403") == []


def test_throughput_leaves_out_overflow_skips_and_says_so():
    values = [100.0] * 30 + [70.0] * 30
    skipped = [0] * 10 + [3] * 50
    (f,) = fire(tables_from(steps=_throughput_rows(values, skipped)), "TL403")
    assert "3 steps were skipped for fp16 overflow" in f.summary and "not the network" in f.summary
    spikes_only = [100.0] * 60
    spikes_only[20] = 5.0  # the skipped step itself reports odd throughput
    assert fire(tables_from(steps=_throughput_rows(spikes_only, [0] * 20 + [1] * 40)), "TL403") == []


def test_straggler_rank(tmp_path):
    (f,) = findings(tmp_path, DeepSpeedTraining(steps=60, straggler=((3,), 1.3)))
    assert f.rule_id == "TL404" and f.ranks == [3] and "1.30x" in f.title
    assert findings(tmp_path / "even", DeepSpeedTraining(steps=60, straggler=((3,), 1.0))) == []


def test_straggler_table_from_the_comms_logger():
    row = {"kind": "straggler", "op": "all_reduce", "msg_bytes": 1 << 20, "count": 10}
    waiting = tables_from(comm_ops=[row | {"total_ms": 100.0, "straggler_total_ms": 80.0}])
    (f,) = fire(waiting, "TL404")
    assert "80%" in f.summary
    assert fire(tables_from(comm_ops=[row | {"total_ms": 100.0, "straggler_total_ms": 5.0}]), "TL404") == []


def test_windows_are_shared_with_the_report():
    from tracelens.analyze import analyze as run

    series = step_series(run(FIXTURES / "ds-slow-window").tables["steps"])
    (w,) = slow_windows(series)
    assert (w.first_step, w.last_step, w.rows, w.basis) == (120, 159, 40, "timers")
    assert w.comm_ratio > 10 and w.compute_ratio == pytest.approx(1.0, abs=0.05)


def _timer_rows(host: str, file: str, ranks: range, factor: float, steps: int = 40) -> list[dict]:
    """wall_clock_breakdown timer rows of each rank of one host, compute scaled by `factor`."""
    return [
        {
            "file": file,
            "line": step * 10 + rank,
            "host": host,
            "rank": rank,
            "engine": "0",
            "step": step,
            "fwd_ms": 100.0 * factor,
            "bwd_ms": 200.0 * factor + 50.0,
            "bwd_inner_ms": 200.0 * factor,
            "bwd_allreduce_ms": 50.0,
            "step_ms": 20.0,
        }
        for step in range(1, steps + 1)
        for rank in ranks
    ]


def _steps_tables(rows: list[dict]):
    from tracelens.tables import RunTables

    t = RunTables()
    t.add("steps", pl.DataFrame(rows))
    return t


def test_a_slow_host_is_found_when_each_host_logs_to_its_own_file():
    # node02's four ranks compute 1.3x slower; half the ranks are slow, so a median over all ranks
    # would sit between the two groups; and per-node files must still be compared with each other.
    rows = _timer_rows("node01", "node01/train.log", range(0, 4), 1.0) + _timer_rows(
        "node02", "node02/train.log", range(4, 8), 1.3
    )
    (f,) = fire(_steps_tables(rows), "TL404")
    assert f.hosts == ["node02"] and f.ranks == [4, 5, 6, 7]
    assert {e.file for e in f.evidence} == {"node02/train.log"}
    even = _timer_rows("node01", "node01/train.log", range(0, 4), 1.0) + _timer_rows(
        "node02", "node02/train.log", range(4, 8), 1.03
    )
    assert fire(_steps_tables(even), "TL404") == []


def _wall_rows(times_ms: list[float]) -> list[dict]:
    """One rank's step lines, each printed when its step ends, timed only by their timestamps."""
    t, rows = datetime(2024, 1, 1), []
    for step, ms in enumerate(times_ms, start=1):
        t += timedelta(milliseconds=ms)
        rows.append(
            {
                "file": "train.log",
                "line": step,
                "host": "n1",
                "rank": 0,
                "engine": "0",
                "step": step,
                "ts": t,
                "message": f"step={step}",
            }
        )
    return rows


def _noisy(slow: dict[range, float]) -> list[float]:
    """400 steps of about 200 ms with +-10% jitter; the steps in each range of `slow` take that factor."""
    return [
        200.0 * (1 + 0.1 * ((i * 7) % 5 - 2) / 2) * next((f for r, f in slow.items() if i in r), 1.0)
        for i in range(400)
    ]


def test_a_stretch_warns_only_when_it_stands_out_from_the_run():
    (alone,) = fire(tables_from(steps=_wall_rows(_noisy({range(200, 240): 2.5}))), "TL401")
    assert alone.severity >= Severity.WARNING and "Not a warning" not in alone.summary
    # the same stretch in a run that often wanders that slow is its noise: told, not warned of
    wandering = {range(a, a + 40): 2.5 for a in (20, 100, 180, 260, 340)}
    slow = fire(tables_from(steps=_wall_rows(_noisy(wandering))), "TL401")
    assert slow and all(f.severity == Severity.INFO for f in slow)
    assert any("within the run's own variability" in f.summary for f in slow)


def test_a_brief_burst_is_told_a_sustained_stretch_or_a_stall_warned_of():
    """Three steps at 3.5x (2 s) are as short as a busy machine's burst; forty (28 s) are not, and one step
    that stalled for 6 s is an event of its own however few its steps."""
    (brief,) = fire(tables_from(steps=_wall_rows(_noisy({range(200, 203): 3.5}))), "TL401")
    assert brief.severity == Severity.INFO and "brief: 3 steps" in brief.summary
    (sustained,) = fire(tables_from(steps=_wall_rows(_noisy({range(200, 240): 3.5}))), "TL401")
    assert sustained.severity >= Severity.WARNING
    times = _noisy({range(200, 201): 30.0})
    stream = pl.DataFrame(_wall_rows(times)).with_columns(
        time_ms=pl.Series(times), start=pl.col("ts") - pl.duration(milliseconds=pl.Series(times))
    )
    begin, end = stream["start"][200], stream["ts"][200]
    assert _ordinary(stream, begin, end, stall=True) == ("", False)
    assert _ordinary(stream, begin, end, stall=False)[0].startswith("brief: 1 steps")


def test_brief_is_counted_in_seconds_not_steps():
    """Twenty fast steps at 2x (8 s) are as short as a busy machine's burst however many steps fit in them."""
    (burst,) = fire(tables_from(steps=_wall_rows(_noisy({range(200, 220): 2.0}))), "TL401")
    assert burst.severity == Severity.INFO and "brief: 20 steps" in burst.summary


def test_a_fault_that_comes_and_goes_is_one_stretch():
    """Two 20 s stretches parted by a 6 s lull are one fault that eased for a while (random loss stalls
    some steps, not all): one finding over both. Parted by 40 s, they are two."""
    (once,) = fire(tables_from(steps=_wall_rows(_noisy({range(150, 190): 2.5, range(220, 260): 2.5}))), "TL401")
    assert once.window and 44 < (once.window[1] - once.window[0]).total_seconds() < 48, once.window
    twice = fire(tables_from(steps=_wall_rows(_noisy({range(60, 100): 2.5, range(300, 340): 2.5}))), "TL401")
    assert len([f for f in twice if "isolated" not in f.title]) == 2
    # the run's start-up is its own, however short the lull after it
    start, fault = fire(tables_from(steps=_wall_rows(_noisy({range(0, 30): 2.5, range(60, 100): 2.5}))), "TL401")[:2]
    assert {"start-up" in start.summary, "start-up" in fault.summary} == {True, False}


def test_a_slow_start_is_the_run_start_up_not_a_warning():
    (start,) = fire(tables_from(steps=_wall_rows(_noisy({range(0, 60): 2.5}))), "TL401")
    assert start.severity == Severity.INFO and "start-up" in start.summary


def test_a_zero_usual_pace_is_no_baseline():
    """A logger that prints whole seconds (`%H:%M:%S`) and three 333 ms steps a second: two steps in three
    show 0 ms between their lines, the third 1,000 ms, and a stretch of 1.5 s steps is unbroken. The
    usual pace measured so, 0 ms, is no baseline to be slow against: it made that stretch "infx the
    usual 0 ms per step". Nothing is claimed against it."""
    times = [0.0, 0.0, 1000.0] * 100 + [1500.0] * 30 + [0.0, 0.0, 1000.0] * 30
    assert fire(tables_from(steps=_wall_rows(times)), "TL401") == []


def _spiky(within: range, at: set[int]) -> list[float]:
    """_noisy steps; in `within`, the steps at `at` (modulo 10) 1.35x (a short stall), two of them
    2.5x (a retransmission timeout), 45 steps apart."""
    big = {within.start + 8, within.start + 48}
    slow = {i for i in within if i % 10 in at}
    return [t * (2.5 if i in big else 1.35 if i in slow else 1.0) for i, t in enumerate(_noisy({}))]


def test_spikes_that_come_densely_are_one_stretch():
    """Packet loss stalls four steps in ten for 60 steps, two of them for a timeout, in clusters too far
    apart to be one run of slow steps, each too cheap alone: yet one stretch, first spike to last."""
    (stretch,) = [
        f for f in fire(tables_from(steps=_wall_rows(_spiky(range(200, 260), {0, 1, 7, 8}))), "TL401") if f.window
    ]
    first, last = map(int, re.search(r"steps (\d+)-(\d+)", stretch.title).groups())
    assert 200 <= first <= 210 and 250 <= last <= 260  # the edges: within a cluster of spikes


def test_spikes_spread_over_the_run_or_a_drift_are_no_stretch():
    spread = fire(tables_from(steps=_wall_rows(_spiky(range(2, 400), {0}))), "TL401")
    assert not any(f.window for f in spread)
    drift = [t * (1.3 if 200 <= i < 260 and i % 2 else 1.0) for i, t in enumerate(_noisy({}))]  # no spike
    assert not any(f.window for f in fire(tables_from(steps=_wall_rows(drift)), "TL401"))


def _iteration_rows(rank: int, times_ms: list[float]) -> list[dict]:
    """One rank's Megatron-style iteration lines, each with the iteration time it reports."""
    t, rows = datetime(2024, 1, 1), []
    for step, ms in enumerate(times_ms, start=1):
        t += timedelta(milliseconds=ms)
        rows.append(
            {"file": f"rank{rank}.log", "line": step, "host": f"n{rank // 4}", "rank": rank, "engine": "0"}
            | {"step": step, "ts": t + timedelta(milliseconds=rank), "iter_ms": ms, "message": f"iteration {step}"}
        )
    return rows


def test_a_spike_every_rank_waited_on_counts_once():
    """In a synchronous job every rank's iteration time shows the same slow step: the job lost it once.
    Eight logs of the same 12 spikes cost what one log's do (under the warning share), where summing
    them per log would make a clean run's noise cost 8x and warn."""
    times = [300.0] * 300
    for i in range(10, 300, 25):
        times[i] = 1500.0  # 12 single slow steps, 14 s of 90 s: just under a warning's 15% once
    rows = [r for rank in range(8) for r in _iteration_rows(rank, times)]
    (spikes,) = fire(tables_from(steps=rows), "TL401")
    assert spikes.title == "12 isolated step-time spikes" and "read from 8 logs" in spikes.summary
    assert spikes.cost_seconds == pytest.approx(12 * 1.2, rel=0.05)
    assert spikes.severity == Severity.INFO
    (alone,) = fire(tables_from(steps=_iteration_rows(0, times)), "TL401")
    assert alone.cost_seconds == pytest.approx(spikes.cost_seconds, rel=0.01)
