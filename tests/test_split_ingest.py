"""One big text file on both cores: chunks parsed side by side by workers give what one reader gives."""

from __future__ import annotations

import polars as pl

from tests.helpers import FIXTURES
from tracelens.ingest import InputFile
from tracelens.ingest.textlog import ingest
from tracelens.tables import RunTables, conform, with_text


def test_chunks_in_worker_threads_equal_one_reader():
    path = FIXTURES / "scenario-congestion" / "node01" / "train.log"  # NCCL and DeepSpeed lines
    source = InputFile(path, path.name, "log", size=path.stat().st_size)
    alone = ingest(source, jobs=1, chunk_bytes=16 << 10)
    split = ingest(source, jobs=2, chunk_bytes=16 << 10)
    assert source.size > 8 * (16 << 10), "the file must span many chunks"
    assert alone.account == split.account
    assert alone.account.parsed > 1000
    assert sorted(alone.tables) == sorted(split.tables)
    assert {"nccl_events", "nccl_comms", "steps"} <= set(alone.tables)
    for name, frame in alone.tables.items():
        assert frame.equals(split.tables[name]), name


def test_rows_spilled_chunk_by_chunk_equal_rows_kept_in_memory(tmp_path):
    """A file of many chunks with a spill folder: its NCCL tables, and the text of its DeepSpeed step lines,
    are written to Parquet chunk by chunk and come back as lazy scans, with the same rows as when every
    record stays in memory until the end."""
    path = tmp_path / "train.log"  # a job restarted three times: NCCL inits all through the file, many chunks apart
    path.write_bytes(4 * (FIXTURES / "scenario-congestion" / "node01" / "train.log").read_bytes())
    kept = InputFile(path, path.name, "log", size=path.stat().st_size)
    for jobs in (1, 2):
        spilled = InputFile(path, path.name, "log", size=path.stat().st_size, spill=tmp_path / f"spill-{jobs}")
        memory = ingest(kept, jobs=jobs, chunk_bytes=16 << 10)
        disk = ingest(spilled, jobs=jobs, chunk_bytes=16 << 10)
        assert memory.account == disk.account
        assert sorted(memory.tables) == sorted(disk.tables)
        lazy = {name for name, frame in disk.tables.items() if isinstance(frame, pl.LazyFrame)}
        assert {"nccl_events", "nccl_comms", "nccl_channels", "steps"} <= lazy
        assert len(list((tmp_path / f"spill-{jobs}").rglob("nccl_events-*.parquet"))) >= 4, "a part per chunk with records"
        for name, frame in memory.tables.items():
            assert conform(name, frame).equals(conform(name, disk.tables[name].lazy().collect())), name
    assert memory.tables["steps"]["message"].null_count() == 0  # each step row's text, joined back from the spilled lines
    tables = RunTables()  # what `tracelens tables` writes: streamed from the parts, counted without reading them
    for name, frame in disk.tables.items():
        tables.add(name, frame)
    tables.write_parquet(tmp_path / "out")
    for name, frame in memory.tables.items():
        assert tables.height(name) == frame.height > 0
        assert pl.read_parquet(tmp_path / "out" / f"{name}.parquet").equals(with_text(conform(name, frame))), name
    whole = ingest(InputFile(path, path.name, "log", size=path.stat().st_size, spill=tmp_path / "whole"), jobs=2)
    assert not any(isinstance(frame, pl.LazyFrame) for frame in whole.tables.values()), "a one-chunk file stays in memory"
