"""A job whose step timers only some ranks print (DeepSpeed prints its timers and progress lines on
rank 0 only, the progress lines every steps_per_print steps, unless told otherwise). Synthetic timer
rows of four ranks on two hosts, kept as rank 0's log would print them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from tests.helpers import fire, tables_from
from tracelens.derived.hangs import last_steps
from tracelens.derived.step_times import STREAM, step_series
from tracelens.derived.stream_groups import StreamGroups

STEPS = 300
SLOW = range(150, 230)
PRINT_EVERY = 10
WORLD = [{"engine": "0", "key": "world_size", "value": "4", "source": "log"}]


def _rows(
    slow_rank: int | None, slow_steps: range = SLOW, steps: int = STEPS, slower: float = 3.0, busy_rank0: float = 1.0
) -> list[dict]:
    """Four ranks of a ZeRO-2 job with overlapped communication: forward 120 ms, backward 240 ms holding
    the all-reduce. In `slow_steps` `slow_rank` runs its forward `slower` x and the others wait for it in
    backward (rank 0's own forward `busy_rank0` x, waiting the less for it)."""
    rows, t = [], datetime(2026, 12, 5, 5, 0, tzinfo=timezone.utc)
    for step in range(1, steps + 1):
        late = 120.0 * (slower - 1) if step in slow_steps and slow_rank is not None else 0.0
        took = 0.0
        for rank in range(4):
            jitter = 1 + 0.04 * (((step * 7 + rank * 3) % 5) - 2) / 2
            slow = step in slow_steps and rank == slow_rank
            busy = busy_rank0 if step in slow_steps and rank == 0 else 1.0
            fwd = 120.0 * jitter * (slower if slow else busy)
            bwd = 240.0 * jitter + (0.0 if slow else late - 120.0 * (busy - 1))
            took = max(took, fwd + bwd + 20.0)
            host = f"node-{'ab'[rank // 2]}"
            rows.append(
                {"file": f"{host}/rank{rank}.log", "host": host, "rank": rank, "engine": "0", "step": step,
                 "fwd_ms": fwd, "bwd_ms": bwd, "step_ms": 20.0, "message": f"step={step}"}
            )  # fmt: skip
        t += timedelta(milliseconds=took)
        for row in rows[-4:]:
            row["ts"] = t
    return rows


def _rank0_printed(rows: list[dict]) -> list[dict]:
    """Rank 0's rows as its log places them: a time only on every PRINT_EVERY-th step's progress line;
    the timers between take the midpoint of the printed times around them, as the timeline gives a
    line without a time of its own."""
    mine = [dict(r) for r in rows if r["rank"] == 0]
    printed = [r for r in mine if r["step"] % PRINT_EVERY == 0]
    for r in mine:
        if r["step"] % PRINT_EVERY == 0:
            r["ts_quality"] = "exact"
            continue
        before = [p["ts"] for p in printed if p["step"] < r["step"]]
        after = [p["ts"] for p in printed if p["step"] > r["step"]]
        if before and after:
            r["ts"], r["ts_quality"] = before[-1] + (after[0] - before[-1]) / 2, "inferred"
        else:
            r["ts"], r["ts_quality"] = (before or after)[-1 if before else 0], "inferred"
    return mine


def test_steps_between_progress_lines_run_at_the_pace_the_lines_show():
    rows = _rank0_printed(_rows(slow_rank=None))
    series = step_series(tables_from(steps=rows)["steps"]).filter(pl.col("step").is_between(41, 49))
    gaps = series.sort(STREAM + ["step"])["ts"].diff().drop_nulls().dt.total_milliseconds()
    truth = {r["step"]: r["ts"] for r in _rows(slow_rank=None) if r["rank"] == 0}
    assert gaps.min() > 300  # evenly spread, not piled on the midpoint
    placed = dict(zip(series["step"].to_list(), series["ts"].to_list(), strict=True))
    assert all(abs((placed[s] - truth[s]).total_seconds()) < 0.05 for s in range(41, 50))


def _placed_off_ms(rows: list[dict], truth: list[dict], steps: range) -> list[float]:
    series = step_series(tables_from(steps=rows)["steps"])
    placed = dict(zip(series["step"].to_list(), series["ts"].to_list(), strict=True))
    true = {r["step"]: r["ts"] for r in truth if r["rank"] == 0}
    return [abs((placed[s] - true[s]).total_seconds()) * 1000 for s in steps]


def test_a_slowdown_between_progress_lines_starts_where_its_timers_rise():
    """Rank 2 slows at step 145, midway between the progress lines of steps 140 and 150: the steps
    before it ran at the old pace, as their timers say, not at the interval's mean pace."""
    truth = _rows(slow_rank=2, slow_steps=range(145, 230))
    assert max(_placed_off_ms(_rank0_printed(truth), truth, range(141, 150))) < 50


def test_steps_after_the_last_progress_line_are_dated_by_their_timers():
    """A job that hangs five steps after its last progress line: its last step is dated where it ended,
    not at that line (or the hang would be dated up to a print interval early)."""
    truth = _rows(slow_rank=None, steps=235)
    rows = _rank0_printed(truth)
    assert max(_placed_off_ms(rows, truth, range(231, 236))) < 50
    (last,) = last_steps(StreamGroups(STREAM, [step_series(tables_from(steps=rows)["steps"])])).to_dicts()
    assert last["last_step"] == 235 and abs((last["last_ts"] - truth[-4]["ts"]).total_seconds()) < 0.05


def test_a_rank_without_timers_slowing_is_not_called_slower_collectives():
    """Rank 2 is slow; only rank 0 prints timers: rank 0 waited longer with its own work flat, which a
    slow rank it cannot see and slower collectives both explain."""
    rows = _rank0_printed(_rows(slow_rank=2))
    (verdict,) = fire(tables_from(steps=rows, deepspeed_settings=WORLD), "TL410")
    assert (
        verdict.severity.label == "info" and "undetermined" in verdict.title and "log no step timers" in verdict.title
    )
    assert verdict.verdict.cause is None and "slower collectives on" not in verdict.title
    assert any("3 other ranks" in line or "of the job's 4 ranks" in line for line in verdict.verdict.not_available)


def test_rank0_busy_too_but_waiting_longer_is_not_called_the_straggler():
    """Rank 2 is slow and rank 0's own forward rose a little too (a busy machine): rank 0 waited longer
    still at the collectives, so someone came later than it did; with the others' timers unseen, no
    rank is named."""
    rows = _rank0_printed(_rows(slow_rank=2, slower=8.0, busy_rank0=2.0))
    (verdict,) = fire(tables_from(steps=rows, deepspeed_settings=WORLD), "TL410")
    assert verdict.verdict.cause is None and "undetermined" in verdict.title and verdict.ranks == []
    assert "so it waited for someone" in verdict.title


def test_every_rank_printing_timers_names_the_slow_one():
    everyone = _rows(slow_rank=2)
    (verdict,) = [
        f for f in fire(tables_from(steps=everyone, deepspeed_settings=WORLD), "TL410") if f.severity.label != "info"
    ]
    assert "straggler" in verdict.title and verdict.ranks == [2]
