"""The DeepSpeed parser's candidate prefilter changes speed only: the same claims and tables as reading every line."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.helpers import CORPUS, FIXTURES
from tracelens.ingest import IngestResult, InputFile
from tracelens.ingest.deepspeed.log import DeepSpeedParser
from tracelens.ingest.text.lines import chunk_spans, read_chunks

FILES = (
    sorted((CORPUS / "deepspeed").glob("*.log"))
    + sorted(FIXTURES.glob("*/*/train.log"))
    + sorted((CORPUS / "nccl").glob("07*.log"))
)


def _run(path: Path, prefilter: bool, chunk_bytes: int) -> tuple[list[int], dict[str, pl.DataFrame]]:
    parser = DeepSpeedParser(InputFile(path=path, name=path.name, format="log"))
    feed = parser.feed if prefilter else parser._feed
    status = [code for chunk in read_chunks(path, chunk_bytes=chunk_bytes) for code in feed(chunk).to_list()]
    result = IngestResult()
    parser.finish(result)
    return status, result.tables


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:50])
def test_prefilter_gives_the_same_claims_and_tables(path: Path):
    checked: list[list[tuple[int, int, int]]] = []
    for chunk_bytes in (1 << 20, 16384):  # small chunks also cut multi-line records
        spans = list(chunk_spans(path, chunk_bytes))
        if spans in checked:
            continue  # a file of one small chunk: the same chunks, already compared
        checked.append(spans)
        fast_status, fast_tables = _run(path, True, chunk_bytes)
        full_status, full_tables = _run(path, False, chunk_bytes)
        assert fast_status == full_status
        assert fast_tables.keys() == full_tables.keys()
        for name, frame in full_tables.items():
            assert fast_tables[name].equals(frame), name


def test_the_corpus_is_there_or_the_fixtures_cover_it():
    assert FILES, "no DeepSpeed logs found in the corpus or fixtures"


def _corpus_and_mangled_lines() -> list[str]:
    """Every line of the real corpus and the fixtures' logs, the same lines pasted (quoted, escaped,
    with an envelope after junk) and mutated by the fuzzer."""
    import random

    from tests.helpers.fuzz import SYNTHETIC, mutate

    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.suffix in (".log", ".txt", ".out")) + sorted(
        FIXTURES.glob("*/*/*.log")
    )
    blocks = [p.read_bytes() for p in files] + [t.encode() for t in SYNTHETIC.values()]
    rng = random.Random(12)
    mutated = [mutate(rng, rng.choice(blocks), blocks, 4096) for _ in range(300)]
    lines = [line for block in blocks + mutated for line in block.decode("utf-8", "replace").split("\n")]
    junk = [f"{pre}{line}" for line in lines[::7] for pre in ("> ", "\r 45%|####   | ", "[default3]:", "x")]
    return lines + junk


def test_candidate_lines_equal_the_candidate_regex():
    """deepspeed.candidate_lines (the envelope searched anywhere only in lines with a time stamp and
    without it after the tag) claims exactly the lines CANDIDATE matches."""
    from tracelens.ingest.deepspeed.log import CANDIDATE, candidate_lines

    text = pl.Series(_corpus_and_mangled_lines())
    expected = text.str.contains(CANDIDATE)
    assert expected.sum() > 1000 and (~expected).sum() > 1000  # both kinds of line are there
    assert candidate_lines(text).to_list() == expected.to_list()
    mid_line = pl.Series(["node1: 12%|## | [2024-01-02 03:04:05,678] [INFO] [logging.py:96:log_dist] [Rank 0] step=1"])
    assert candidate_lines(mid_line).to_list() == [True]  # found after junk, not only after the tag
