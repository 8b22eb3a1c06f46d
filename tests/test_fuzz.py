"""Mutation fuzzing of every input format (tests/fuzz.py): a few hundred cases in CI; set
TRACELENS_FUZZ_CASES (and TRACELENS_FUZZ_SEED) for more. Each batch of cases is one run
folder analysed end to end and rendered: no exception, no file lost to an internal error,
every line accounted for, the HTML balanced and the JSON strict."""

from __future__ import annotations

import os
import random
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


@pytest.mark.parametrize("batch", range((CASES + BATCH - 1) // BATCH))
def test_mutated_inputs_never_crash_and_every_line_is_accounted_for(tmp_path: Path, batch: int):
    rng = random.Random(SEED * 100_003 + batch)
    pool = fuzz.sources()
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
