"""derived.window_signals.level_extent: when a cause's own per-step level (a rank's compute time, the
time between steps) ran high, which is the window a verdict gives rather than the slow steps' blurred edges."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from tracelens.derived.window_signals import level_extent

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

