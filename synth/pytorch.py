"""PyTorch ProcessGroupNCCL error lines, in the `[rankN]:[EMMDD hh:mm:ss.nnnnnnnnn file:line]` form.

The nine-digit fraction comes from CLOCK_MONOTONIC in c10 logging, not from the
wall clock, so callers pass it separately from the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Work:
    """The collective a watchdog gave up on (PyTorch's WorkNCCL)."""

    seq: int
    op_type: str = "ALLREDUCE"
    numel: int = 0
    timeout_ms: int = 600_000

    def __str__(self) -> str:
        return (
            f"WorkNCCL(SeqNum={self.seq}, OpType={self.op_type}, NumelIn={self.numel}, "
            f"NumelOut={self.numel}, Timeout(ms)={self.timeout_ms})"
        )


def _prefix(rank: int, when: datetime, mono_ns: int, where: str) -> str:
    return f"[rank{rank}]:[E{when:%m%d %H:%M:%S}.{mono_ns:09d} {where}] "


def watchdog_timeout(rank: int, work: Work, ran_ms: int, when: datetime, mono_ns: int) -> list[str]:
    """The watchdog's timeout line and the exception report that follows it (PyTorch 2.3-2.5 wording)."""
    return [
        _prefix(rank, when, mono_ns, "ProcessGroupNCCL.cpp:607")
        + (
            f"[Rank {rank}] Watchdog caught collective operation timeout: "
            f"{work} ran for {ran_ms} milliseconds before timing out."
        ),
        _prefix(rank, when, mono_ns + 57_000, "ProcessGroupNCCL.cpp:1664")
        + f"[PG 0 Rank {rank}] Exception (either an error or timeout) detected by watchdog at work: {work.seq}, "
        f"last enqueued NCCL work: {work.seq + 2}, last completed NCCL work: {work.seq - 1}.",
    ]
