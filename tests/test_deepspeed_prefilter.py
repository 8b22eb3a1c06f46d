"""The DeepSpeed parser's candidate prefilter changes speed only: the same claims and tables as reading every line."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.helpers import CORPUS, FIXTURES
from tracelens.ingest import IngestResult, InputFile
from tracelens.ingest.deepspeed import DeepSpeedParser
from tracelens.ingest.lines import chunk_spans, read_chunks

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
