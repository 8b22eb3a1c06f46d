"""derived.window_signals.level_extent and dense_extent: when a cause's own per-step level (a rank's
compute time, the time between steps) or its events (retransmissions) ran high, which is the window a
verdict gives rather than the slow steps' blurred edges; count_signal: a count's rise against the
run's ordinary time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from tracelens.derived.window_signals import (
    _best_of,
    _overlapping_runs,
    blind_edge,
    count_signal,
    dense_extent,
    level_extent,
)

T0 = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)


def _stream(values: list[float], step_s: float = 0.2) -> pl.DataFrame:
    """One rank's steps, each `step_s` apart: `start` and `ts` are its wall edges, `level` the timer."""
    ts = [T0 + timedelta(seconds=step_s * (i + 1)) for i in range(len(values))]
    return pl.DataFrame({"start": [T0, *ts[:-1]], "ts": ts, "level": values})


def _noise(n: int, level: float = 100.0) -> list[float]:
    return [level * (1 + 0.3 * (((i * 7) % 11) - 5) / 5) for i in range(n)]  # +-30%, like a shared machine


def test_one_long_pause_between_steps_is_its_own_window():
    values = _noise(300, 10.0)
    values[150] = 25_000.0  # a 25 s checkpoint between steps 150 and 151
    stream = _stream(values)
    begin, end = stream["start"][100], stream["ts"][200]  # the slow steps' window, blurred by noise around it
    assert level_extent(stream, "level", begin, end) == (stream["start"][150], stream["ts"][150])


def test_contention_that_builds_up_began_when_its_ramp_did():
    values = _noise(100) + [250.0] * 25 + [600.0] * 150 + _noise(100)  # 2.5x for 5 s, then 6x
    stream = _stream(values)
    first, last = level_extent(stream, "level", stream["start"][110], stream["ts"][260])
    assert abs(first - stream["start"][100]) <= timedelta(seconds=1.0) and last == stream["ts"][274]


def test_noise_next_to_the_window_does_not_join_it():
    values = _noise(100) + [150.0] * 8 + _noise(30) + [700.0] * 150 + _noise(100)  # a 1.5x blip 6 s before
    stream = _stream(values)
    first, last = level_extent(stream, "level", stream["start"][100], stream["ts"][300])
    assert first == stream["start"][138] and last == stream["ts"][287]


def test_a_long_series_finds_its_pause_and_its_plateau_by_bins(monkeypatch):
    """Past EXTENT_STEPS steps near a window the runs are scored over bins (every run of 30,000 steps
    is 450 million of them): a one-step pause is still its own run, a plateau's edges still its steps."""
    from tracelens.derived import window_signals

    assert window_signals.EXTENT_STEPS < 30_000
    pause = _noise(30_000, 10.0)
    pause[17_001] = 25_000.0
    stream = _stream(pause)
    assert level_extent(stream, "level", stream["start"][12_000], stream["ts"][20_000]) == (
        stream["start"][17_001],
        stream["ts"][17_001],
    )
    plateau = _stream(_noise(10_000) + [600.0] * 10_003 + _noise(10_000))
    assert level_extent(plateau, "level", plateau["start"][9_000], plateau["ts"][21_000]) == (
        plateau["start"][10_000],
        plateau["ts"][20_002],
    )
    # the three shapes above, searched by bins of two to four steps, end where the exact search ends
    monkeypatch.setattr(window_signals, "EXTENT_STEPS", 100)
    test_one_long_pause_between_steps_is_its_own_window()
    test_contention_that_builds_up_began_when_its_ramp_did()
    test_noise_next_to_the_window_does_not_join_it()


WINDOWS = [(1, 0, 0), (3, 0, 2), (50, 49, 49), (587, 259, 371), (1000, 0, 5), (1000, 0, 999)]  # steps, window


@pytest.mark.parametrize("n, first, last", WINDOWS)
def test_the_runs_over_a_window_are_those_of_every_run_that_overlap_it_in_the_same_order(n, first, last):
    """The exact search scores only the runs that overlap the window: the same runs, in the order of
    np.triu_indices, so the best run (the first of the highest scores) is the one all runs give,
    ties included (steps of equal times)."""
    every_i, every_j = np.triu_indices(n)
    overlap = (every_i <= last) & (every_j >= first)
    i, j = _overlapping_runs(n, first, last)
    assert i.tolist() == every_i[overlap].tolist() and j.tolist() == every_j[overlap].tolist()
    rng = np.random.default_rng(n)
    for values in (rng.random(n) * 100, rng.integers(0, 3, n) * 10.0):  # ties, then none
        ones = np.ones(n)
        assert _best_of(values, ones, i, j, first, last) == _best_of(values, ones, every_i, every_j, first, last)


def _times(seconds: list[float]) -> pl.Series:
    return pl.Series([T0 + timedelta(seconds=x) for x in seconds], dtype=pl.Datetime("us", "UTC"))


def test_sparse_loss_on_slow_steps_is_one_stretch_not_its_densest_seconds():
    # lab-loss-2's shape: 4% loss for 35 s, none before or after; on its slow steps the resends of the
    # first 22 s come in small bursts a few seconds apart (41 of them), then 69 in the last 13 s. The
    # stretch is all of it, not the dense last 13 s.
    sparse = [100.0 + 2.75 * b + 0.001 * i for b in range(8) for i in range(5)] + [121.9]
    dense = [122.0 + 13.0 * i / 68 for i in range(69)]
    times = _times(sparse + dense)
    first, last = dense_extent(times, T0 + timedelta(seconds=80), T0 + timedelta(seconds=130))
    assert (first, last) == (times.min(), times.max())


def test_a_fault_that_slowed_two_stretches_is_not_its_own_baseline():
    # random loss for 40 s (resends at 0.5/s before and after it): its first 8 s stalled the steps at
    # 12/s, its next 10 s barely at 3/s, its last 22 s at 6/s; the first and last stretches were found
    # slow, and the last is judged against the capture's time outside both
    quiet = [10.5 + 2.0 * i for i in range(5)]  # 10-20 s
    worst = [20.0 + i / 12.5 for i in range(100)]
    lull = [28.0 + i / 3 for i in range(30)]
    last = [38.0 + i / 6 for i in range(132)]
    after = [61.0 + 2.0 * i for i in range(5)]
    times, span = _times(quiet + worst + lull + last + after), (T0 + timedelta(seconds=10), T0 + timedelta(seconds=70))
    window = (T0 + timedelta(seconds=38), T0 + timedelta(seconds=60))
    first_stretch = (T0 + timedelta(seconds=20), T0 + timedelta(seconds=28))

    def judged(apart):
        return count_signal("packets", "link", "resends", "a ↔ b", times, span, *window, apart=apart)

    assert not judged(()).rose  # against 20-38 s of the same loss the window is no rise
    risen = judged([first_stretch])
    assert risen.rose and "(132)" in risen.text
    none = count_signal("packets", "link", "resends", "a ↔ b", times.clear(), span, *window, apart=[first_stretch])
    assert none.comparable and not none.rose


def test_a_trickle_outside_the_stretch_does_not_join_it():
    background = [float(x) for x in range(7, 300, 15)]  # one resend every 15 s all run long
    loss = [150.0 + 0.5 * i for i in range(60)]  # 2/s for 30 s
    first, last = dense_extent(
        _times(sorted(background + loss)), T0 + timedelta(seconds=140), T0 + timedelta(seconds=190)
    )
    assert (first, last) == (T0 + timedelta(seconds=150), T0 + timedelta(seconds=179.5))


def test_a_capture_sampled_in_bursts_cannot_see_a_stretchs_edges():
    sampled = _times([10.0 * b + 0.01 * i for b in range(30) for i in range(50)])  # 0.5 s of packets every 10 s
    steady = _times([0.05 * i for i in range(6000)])
    edge = T0 + timedelta(seconds=100)
    assert blind_edge(sampled, edge, -1) and blind_edge(sampled, edge + timedelta(seconds=0.49), 1)
    assert not blind_edge(steady, edge, -1) and not blind_edge(steady, edge, 1)


def test_a_dozen_records_in_minutes_cannot_place_a_stretchs_edges():
    records = [60.0 + 8.0 * i for i in range(12)]  # a kernel logging a link down every 8 s, for a minute and a half
    assert dense_extent(_times(records), T0 + timedelta(seconds=50), T0 + timedelta(seconds=200)) is None
    busy = [60.0 + 0.5 * i for i in range(180)]  # the same stretch with resends every half second places them
    assert dense_extent(_times(busy), T0 + timedelta(seconds=50), T0 + timedelta(seconds=200)) == (
        T0 + timedelta(seconds=60),
        T0 + timedelta(seconds=149.5),
    )


def test_a_stall_of_one_step_has_a_level_when_even_that_step_stayed_at_it():
    """A window of one stalled step has too few steps for a median; its own work is judged flat when
    even its slowest step stayed at the level outside (so a dead link's stall is not a slow rank),
    and left unjudged when that step rose."""
    from tracelens.derived.baseline import Baseline
    from tracelens.derived.window_signals import _level

    outside = pl.Series(_noise(60))
    flat = _level(pl.Series([104.0]), outside, Baseline())
    assert flat.comparable and not flat.rose
    risen = _level(pl.Series([400.0]), outside, Baseline())
    assert not risen.comparable and not risen.rose


def test_collective_times_difference_running_totals_and_measure_who_returned_late():
    """The comms logger prints a running total per op name: each call's time is its difference. A
    call belongs to the step whose line follows it; the rank that issued its calls later than the
    others returns later from them, by about what the others waited."""
    from tests.helpers import tables_from
    from tracelens.derived.window_signals import collective_times

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    steps, ops = [], []
    for rank in (0, 1):
        file, line, total = f"rank{rank}.log", 0, 0.0
        for step in (1, 2, 3):
            start = t0 + timedelta(seconds=step)
            late = timedelta(milliseconds=300 if rank == 1 and step == 2 else 0)
            for call in range(3):
                line += 1
                total += 10.0 + call
                at = start + late + timedelta(milliseconds=20 * call)
                ops.append({"file": file, "line": line, "rank": rank, "ts": at, "kind": "op", "op": "all_gather"})
                ops[-1]["total_ms"] = total
            line += 1
            steps.append(
                {"file": file, "line": line, "rank": rank, "step": step, "ts": start + timedelta(milliseconds=900)}
            )
    tables = tables_from()
    tables.add("comm_ops", pl.DataFrame(ops))
    tables.add("steps", pl.DataFrame(steps))
    got = collective_times(tables).sort("rank", "step")
    assert got["coll_ms"].to_list() == [33.0] * 6  # 10 + 11 + 12 per step, not the running totals
    late = dict(zip(zip(got["rank"], got["step"]), got["late_ms"]))
    assert late[1, 2] == pytest.approx(3 * 150.0) and late[0, 2] == pytest.approx(-3 * 150.0)
    assert late[1, 1] == pytest.approx(0.0) and late[0, 3] == pytest.approx(0.0)
