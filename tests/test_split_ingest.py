"""One big text file on both cores: chunks parsed side by side by workers give what one reader gives."""

from __future__ import annotations

from tracelens.ingest import InputFile
from tracelens.ingest.textlog import ingest

from tests.helpers import FIXTURES


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
