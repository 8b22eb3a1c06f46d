"""Mutation fuzzing of every input format (tests/helpers/fuzz.py): 120 cases in CI, each made
from the head of a fixture file (TRACELENS_FUZZ_SOURCE_BYTES, 0 for whole files); set
TRACELENS_FUZZ_CASES (and TRACELENS_FUZZ_SEED) for more. Each batch of cases is one run
folder analysed end to end and rendered: no exception, no file lost to an internal error,
every line accounted for, the HTML balanced and the JSON strict."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.helpers import fuzz
from tracelens.analyze import analyze
from tracelens.report.html import render
from tracelens.report.summary import to_json

CASES = int(os.environ.get("TRACELENS_FUZZ_CASES", "120"))
SEED = int(os.environ.get("TRACELENS_FUZZ_SEED", "11"))
BATCH = 40
HUGE = int(os.environ.get("TRACELENS_FUZZ_HUGE", str(256 << 10)))  # bytes of the huge-line mutation
SOURCE_BYTES = int(os.environ.get("TRACELENS_FUZZ_SOURCE_BYTES", str(64 << 10)))  # of each fixture file mutated


@pytest.mark.parametrize("batch", range((CASES + BATCH - 1) // BATCH))
def test_mutated_inputs_never_crash_and_every_line_is_accounted_for(tmp_path: Path, batch: int):
    rng = random.Random(SEED * 100_003 + batch)
    pool = fuzz.sources(SOURCE_BYTES)
    files = {}
    for i in range(min(BATCH, CASES - batch * BATCH)):
        name, data = fuzz.case(rng, pool, HUGE)
        rel = f"node{i:02d}/{name}"
        (tmp_path / "run" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "run" / rel).write_bytes(data)
        files[rel] = data
    analysis = analyze(tmp_path / "run")
    problems = fuzz.check_run(analysis, files, render(analysis), to_json(analysis))
    assert not problems, f"seed {SEED} batch {batch}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name, data", fuzz.hostile(), ids=lambda v: Path(v).name if isinstance(v, str) else "")
def test_each_hostile_seed_is_read_whole_and_fast(tmp_path: Path, name: str, data: bytes):
    """The seeds an outside campaign broke tracelens with (exit 3, quadratic lines, escapes, a bomb),
    each as it is; mutated, they are in every batch's pool too."""
    rel = Path(name).name
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / rel).write_bytes(data)
    started = time.perf_counter()
    analysis = analyze(tmp_path / "run")
    problems = fuzz.check_run(analysis, {rel: data}, render(analysis), to_json(analysis))
    assert not problems and time.perf_counter() - started < 60


def _fr_entry(seq: int, **values) -> dict:
    return {
        "record_id": seq,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "state": "completed",
        "retired": True,
        "duration_ms": 1.5,
        "timeout_ms": 600000,
        **values,
    }


# A JSON dump with one infinite value, or one integer out of 64 bits, loses that entry, not the dump.
@pytest.mark.parametrize("bad", [
    {"timeout_ms": float("-inf")}, {"duration_ms": float("inf")}, {"time_created_ns": 2**64}, {"record_id": 2**64},
    {"collective_seq_id": -(2**63) - 1}, {"pg_id": 1e400}, {"profiling_name": ["nccl:all_reduce"]}, {"retired": "yes"},
])  # fmt: skip
def test_a_flight_recorder_value_out_of_range_loses_only_its_entry(tmp_path: Path, bad: dict):
    import json

    dump = {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": [_fr_entry(1), _fr_entry(2, **bad), _fr_entry(3)],
    }
    data = json.dumps(dump).encode()  # Python writes Infinity and 2^64 as json.dumps does
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "fr_trace_rank_0.json").write_bytes(data)
    analysis = analyze(tmp_path / "run")
    assert not fuzz.check_run(analysis, {"fr_trace_rank_0.json": data}, render(analysis), to_json(analysis))
    (row,) = analysis.tables["inputs"].to_dicts()
    assert (row["lines"], row["parsed"], row["unrecognized"], row["errors"]) == (3, 2, 1, [])
    assert [s["line"] for s in row["samples"]] == [2] and row["samples"][0]["text"].startswith("entry 2: ")
    assert analysis.tables["fr_entries"]["collective_seq_id"].to_list() == [1, 3]
    assert analysis.tables["fr_groups"]["ranks"].to_list() == [[0, 1]]
