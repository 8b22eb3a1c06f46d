"""Flight Recorder entries for the hang rules' tests."""

from __future__ import annotations

from datetime import datetime, timedelta


def stuck_entries(t0: datetime) -> list[dict]:
    """One all-reduce group of two ranks: rank 0 created seq 1-3, rank 1 stopped after seq 2 (at
    t0 + 2 s); seq 1-2 completed, seq 3 started and never finished."""
    return [
        {
            "rank": r,
            "pg_name": "0",
            "pg_id": 0,
            "pg_desc": "default_pg",
            "collective_seq_id": s,
            "op": "all_reduce",
            "profiling_name": "nccl:all_reduce",
            "is_p2p": False,
            "status": "completed" if s < 3 else "started",
            "input_sizes": "[[8]]",
            "ts": t0 + timedelta(seconds=s),
            "encoding": "pickle",
            "record_id": s,
            "frames": [],
        }
        for r in range(2)
        for s in range(1, 4 if r == 0 else 3)
    ]
