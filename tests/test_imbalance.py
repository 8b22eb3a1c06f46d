"""A slow rank the step times hide (derived/imbalance.py): its forward rose against its peers' at the
same steps while the whole job's pace moved too. Synthetic timer rows of four ranks on two hosts."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.helpers import fire, tables_from
from tracelens.derived.imbalance import imbalance_windows, peers_pace
from tracelens.derived.step_times import STREAM, step_series
from tracelens.derived.stream_groups import StreamGroups

STEPS = 300
SLOW = range(150, 230)  # 80 steps of about 0.6 s: 45 s


def _rows(slow_ranks: tuple[int, ...], busy_from: int = 190) -> list[dict]:
    """Four ranks (two per host) of a ZeRO-2 job with overlapped communication: forward 120 ms, backward
    240 ms holding the all-reduce. In SLOW each rank of `slow_ranks` runs its forward 3x and waits
    least, the others wait for it in backward; from `busy_from` on the machine's own load makes every
    rank's work 1.3x slower for the rest of the run, so the step times after the window stay high."""
    rows, t = [], datetime(2026, 12, 5, 5, 0)
    for step in range(1, STEPS + 1):
        busy = 1.3 if step >= busy_from else 1.0
        late = 240.0 if step in SLOW and slow_ranks else 0.0  # how much later the slow ranks arrive
        took = 0.0
        for rank in range(4):
            jitter = 1 + 0.04 * (((step * 7 + rank * 3) % 5) - 2) / 2
            slow = step in SLOW and rank in slow_ranks
            fwd = 120.0 * busy * jitter * (3.0 if slow else 1.0)
            bwd = 240.0 * busy * jitter + (0.0 if slow else late)
            took = max(took, fwd + bwd + 20.0)
            rows.append(
                {
                    "file": f"node-{'ab'[rank // 2]}/rank{rank}.log",
                    "line": step,
                    "host": f"node-{'ab'[rank // 2]}",
                    "rank": rank,
                    "engine": "0",
                    "step": step,
                    "fwd_ms": fwd,
                    "bwd_ms": bwd,
                    "step_ms": 20.0,
                    "message": f"step={step}",
                }
            )
        t += timedelta(milliseconds=took)
        for row in rows[-4:]:
            row["ts"] = t
    return rows


def _windows(rows: list[dict]):
    series = StreamGroups(STREAM, [step_series(tables_from(steps=rows)["steps"])])
    return imbalance_windows(series, peers_pace(series))


def test_a_rank_whose_forward_rose_alone_is_found_whatever_the_job_pace_did():
    (w,) = _windows(_rows(slow_ranks=(2,)))
    assert (w.rank, w.host, w.imbalance) == (2, "node-b", True)
    assert abs(w.first_step - SLOW[0]) <= 2 and abs(w.last_step - SLOW[-1]) <= 2
    assert w.cost_s > 0


def test_every_rank_slower_together_is_no_imbalance():
    everyone = _rows(slow_ranks=(0, 1, 2, 3))
    assert _windows(everyone) == []
    assert _windows(_rows(slow_ranks=())) == []


def test_the_verdict_names_the_rank_the_step_times_hide():
    """Under ZeRO-3 forward all-gathers the parameters, so no timer holds a rank's own work but its
    optimizer step: only its forward against the job's pace shows it rose."""
    zero3 = [{"engine": "0", "key": "zero_optimization.stage", "value": "3", "source": "ds_config.json"}]
    findings = fire(tables_from(steps=_rows(slow_ranks=(2,)), deepspeed_settings=zero3), "TL410")
    (verdict,) = [f for f in findings if f.severity.label != "info"]
    assert "straggler" in verdict.title and verdict.ranks == [2] and verdict.hosts == ["node-b"]
