"""How long tracelens takes on the Flight Recorder dumps of a large job: 256 ranks x 2000
entries (TORCH_FR_BUFFER_SIZE=2000) of synthetic NCCL JSON dumps, rank 77 two collectives
behind. Prints the analyze() time and the hang findings.

    python benchmarks/bench_flight_recorder.py
"""

import json
import tempfile
import time
from pathlib import Path

from tracelens.analyze import analyze

tmp = Path(tempfile.mkdtemp())
t0 = 1_733_510_000_000_000_000
for rank in range(256):
    entries = [
        {
            "record_id": s,
            "pg_id": s % 2,
            "process_group": [str(s % 2), "default_pg" if s % 2 == 0 else "undefined"],
            "collective_seq_id": s // 2 + 1,
            "p2p_seq_id": 0,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": t0 + s * 10**7,
            "input_sizes": [[4096]],
            "output_sizes": [[4096]],
            "input_dtypes": ["Float"],
            "state": "completed",
            "frames": [],
        }
        for s in range(2000 if rank != 77 else 1998)
    ]
    entries[-1]["state"] = "started"
    (tmp / f"nccl_trace_rank_{rank}.json").write_text(
        json.dumps({"version": "2.4", "pg_config": {}, "entries": entries})
    )
t = time.perf_counter()
a = analyze(tmp)
dt = time.perf_counter() - t
print(
    f"256 ranks x 2000 entries: analyze {dt:.1f} s; findings",
    [(f.rule_id, f.ranks[:3]) for f in a.findings if f.rule_id.startswith("TL42")],
)
