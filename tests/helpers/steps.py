"""Hand-built rows for the correlation and host rules: rank 0's steps with a slow stretch, and port
counters dumped every minute, on one clock from T0."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.helpers import tables_from
from tracelens.derived.flows import event_times
from tracelens.timeline import align

T0 = datetime(2024, 12, 6, 18, 30, tzinfo=timezone.utc)
STEP_S = 1.0
SLOW = range(100, 140)  # steps 3x as long


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def steps(
    count: int = 300,
    slow: range = range(0),
    factor: float = 3.0,
    first: int = 1,
    start: float = 0.0,
    file: str = "node01/train.log",
    step_s: float = STEP_S,
) -> list[dict]:
    """Rank 0's step lines, each printed when its step ends; `slow` steps take `factor` x as long."""
    rows, t = [], start
    for step in range(first, first + count):
        took = step_s * (factor if step in slow else 1.0) * (1 + 0.01 * (step % 3))
        t += took
        rows.append(
            {
                "file": file,
                "line": step,
                "host": "node01",
                "rank": 0,
                "engine": "0",
                "step": step,
                "iter_ms": took * 1000,
                "ts": at(t),
                "message": f"iteration {step}",
            }
        )
    return rows


def slow_span() -> tuple[datetime, datetime]:
    rows = steps(slow=SLOW)
    return rows[SLOW[0] - 2]["ts"], rows[SLOW[-1] - 1]["ts"]


def counters(host: str, ca: str, counter: str, values: list[int], every_s: float = 60.0) -> list[dict]:
    """A counter of one port dumped every `every_s` seconds from T0."""
    return [
        {
            "file": f"{host}/sysfs-{i}.txt",
            "line": 1,
            "host": host,
            "ts": at(i * every_s),
            "dump_ts": at(i * every_s),
            "ts_quality": "exact",
            "node": ca,
            "ca": ca,
            "port": 1,
            "counter": counter,
            "value": v,
            "source": "sysfs_counters",
            "bits": 64,
        }
        for i, v in enumerate(values)
    ]


def analysed(**rows):
    """Tables of these rows, aligned as the pipeline aligns them."""
    tables, _ = align(tables_from(**rows), capture_events=event_times)
    return tables
