"""Stretches where one rank's forward pass rose against the other ranks' at the same steps.

In synchronous data parallelism every rank's step lasts as long as the slowest rank's, so a slow
rank raises the job's step time only as much as it is late, and a machine whose own load moves at
the same time can hide that in the step times. The ranks' forward times at the same step are
compared instead (docs/timing-model.md, "A slow rank the step times hide"): a load every rank shares
(the network, a busy machine) moves them together; a straggler's moves alone.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import polars as pl

from tracelens.derived.step_times import BRIEF, STREAM, WARMUP_ROWS, Window, runs_of, window_of
from tracelens.derived.stream_groups import StreamGroups

PEERS = ["engine", "step"]  # the ranks' same step
SIGMAS = 6.0  # an excess this many robust standard deviations above the rank's usual excess rose
STEP_SHARE = 0.1  # and at least this share of the rank's usual step: less does not slow the job
MIN_ROWS = 20  # steps a rank needs logged to have a usual excess
COLUMNS = [*STREAM, "step", "line", "ts", "basis", "time_ms", "baseline_ms", "steps_covered", "comm_ms", "compute_ms"]


def peers_usual(series: StreamGroups, column: str) -> pl.DataFrame:
    """Per engine and step, the ranks' usual `column`: the fastest host's median where several hosts
    log it (a whole slow host does not drag it up to meet it), else its one host's median. Per host
    and step first, a host's rows at a time, then per step; steps only one rank logs are left out."""
    ranked = pl.col(column).is_not_null() & (pl.col("rank") >= 0)
    hosts = pl.concat(
        frame.filter(ranked)
        .group_by(*PEERS, "host")
        .agg(pl.col(column).median().alias("usual"), low=pl.col("rank").min(), high=pl.col("rank").max())
        for frame in series.by(["host"], [*PEERS, "host", "rank", column])
    )
    return (
        hosts.group_by(PEERS)
        .agg(pl.col("usual").min(), pl.col("low").min(), pl.col("high").max())
        .filter(pl.col("low") != pl.col("high"))
        .select(*PEERS, "usual")
    )


def peers_pace(series: StreamGroups) -> pl.DataFrame:
    """Per engine and step, `peer_pace`: the ranks' usual forward time at that step over its median over
    the run: what the whole job's pace did (a busy machine, a slower network under ZeRO-3), which a
    rank's forward divided by it no longer holds."""
    usual = peers_usual(series, "fwd_ms")
    return usual.select(*PEERS, "usual", peer_pace=pl.col("usual") / pl.col("usual").median().over("engine"))


def imbalance_windows(series: StreamGroups, peers: pl.DataFrame) -> list[Window]:
    """Per rank, the stretches where its forward time exceeded its peers' usual forward at the same steps
    (`peers`: peers_pace) by more than it usually does (SIGMAS robust deviations and STEP_SHARE of its
    step), for BRIEF or longer: Windows marked `imbalance`, whose cost is the excess the other ranks
    waited for."""
    usual = peers.select(*PEERS, "usual")
    if usual.height == 0:
        return []
    found: list[Window] = []
    for frame in series.frames([*COLUMNS, "fwd_ms"]):
        ranked = frame.filter(pl.col("rank") >= 0).join(usual, on=PEERS, maintain_order="left")
        ranked = ranked.with_columns(excess=pl.col("fwd_ms") - pl.col("usual"))
        for key, stream in ranked.group_by(STREAM, maintain_order=True):
            found += _stretches(key, stream)
    return sorted(found, key=lambda w: -w.cost_s)


def _stretches(key: tuple, stream: pl.DataFrame) -> list[Window]:
    steady = stream.slice(WARMUP_ROWS).filter(pl.col("excess").is_not_null(), pl.col("ts").is_not_null())
    if steady.height < MIN_ROWS:
        return []
    excess = steady["excess"]
    base = float(excess.median())  # type: ignore[arg-type]
    # the step-to-step jitter, not the spread about the median: a stretch that is a third of the run
    # would widen that spread until the stretch fits in it, but moves the jitter by two steps only
    spread = 1.4826 * float(excess.diff().abs().median() or 0.0) / 2**0.5
    step_ms = float(steady["time_ms"].median() or 0.0)
    above = steady.with_row_index("i").filter(pl.col("excess") - base > max(SIGMAS * spread, STEP_SHARE * step_ms))
    windows = []
    for first, last in runs_of(above["i"].to_list()):
        inside = above.filter(pl.col("i").is_between(first, last)).drop("i")
        took = timedelta(milliseconds=float(inside["time_ms"][0] or 0.0))
        if inside.height < 3 or inside["ts"][-1] - inside["ts"][0] + took < BRIEF:
            continue
        waited = float((inside["excess"] - base).sum()) / 1000
        windows.append(replace(window_of(key, steady, inside), cost_s=waited, imbalance=True))
    return windows
