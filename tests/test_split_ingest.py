"""One big text file on both cores: chunks parsed side by side by workers give what one reader gives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from tests.helpers import CORPUS, FIXTURES
from tracelens.ingest import IngestResult, InputFile
from tracelens.ingest.deepspeed import assemble
from tracelens.ingest.textlog import ingest
from tracelens.tables import RunTables, conform, with_ts_text
from tracelens.timeline import align


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


# The chunks of the big logs below: a few hundred lines each, so that a fixture's log spans many
# (7 for the straggler's, 23 for the restarted job's); each chunk costs the parsers' set-up again.
BIG_CHUNK = 32 << 10


@dataclass
class BigLog:
    """A file of many chunks read with the rows kept in memory (one reader) and spilled to Parquet
    chunk by chunk (`spilled[jobs]`, one reader or chunks in worker threads)."""

    path: Path
    memory: IngestResult
    spilled: dict[int, IngestResult]
    spill: Callable[[int], Path]


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> BigLog:
    """Read once for the module's tests (one work unit under xdist, see conftest): the readings are costly
    and the spill and alignment tests compare the same ones."""
    folder = tmp_path_factory.mktemp("big-log")
    path = folder / "train.log"  # a job restarted three times: NCCL inits all through the file, many chunks apart
    path.write_bytes(4 * (FIXTURES / "scenario-congestion" / "node01" / "train.log").read_bytes())
    size = path.stat().st_size

    def spill(jobs: int) -> Path:
        return folder / f"spill-{jobs}"

    memory = ingest(InputFile(path, path.name, "log", size=size), jobs=1, chunk_bytes=BIG_CHUNK)
    spilled = {
        jobs: ingest(InputFile(path, path.name, "log", size=size, spill=spill(jobs)), jobs=jobs, chunk_bytes=BIG_CHUNK)
        for jobs in (1, 2)
    }
    return BigLog(path, memory, spilled, spill)


def test_rows_spilled_chunk_by_chunk_equal_rows_kept_in_memory(big_log, tmp_path):
    """A file of many chunks with a spill folder: its NCCL tables, and the text of its DeepSpeed step lines,
    are written to Parquet chunk by chunk and come back as lazy scans, with the same rows as when every
    record stays in memory until the end (read by one reader, which the chunks in worker threads equal:
    test_chunks_in_worker_threads_equal_one_reader)."""
    memory = big_log.memory
    for jobs, disk in big_log.spilled.items():
        assert memory.account == disk.account
        assert sorted(memory.tables) == sorted(disk.tables)
        lazy = {name for name, frame in disk.tables.items() if isinstance(frame, pl.LazyFrame)}
        assert {"nccl_events", "nccl_comms", "nccl_channels", "steps"} <= lazy
        assert len(list(big_log.spill(jobs).rglob("nccl_events-*.parquet"))) >= 4, "a part per chunk with records"
        for name, frame in memory.tables.items():
            assert conform(name, frame).equals(conform(name, disk.tables[name].lazy().collect())), (name, jobs)
    # each step row's text, joined back from the spilled lines
    assert memory.tables["steps"]["message"].null_count() == 0
    disk = big_log.spilled[2]
    tables = RunTables()  # what `tracelens tables` writes: streamed from the parts, counted without reading them
    for name, frame in disk.tables.items():
        tables.add(name, frame)
    tables.write_parquet(tmp_path / "out")
    for name, frame in memory.tables.items():
        assert tables.height(name) == frame.height > 0
        assert pl.read_parquet(tmp_path / "out" / f"{name}.parquet").equals(with_ts_text(conform(name, frame))), name
    path = big_log.path
    whole = ingest(InputFile(path, path.name, "log", size=path.stat().st_size, spill=tmp_path / "whole"), jobs=2)
    assert not any(isinstance(frame, pl.LazyFrame) for frame in whole.tables.values()), (
        "a one-chunk file stays in memory"
    )


def test_spilled_tables_aligned_lazily_stream_what_the_tables_aligned_in_memory_give(big_log, tmp_path, monkeypatch):
    """`tracelens tables` on a big log: the spilled tables stay lazy scans through the alignment (inferred
    times placed and joined a range of lines at a time, zone applied lazily) and are streamed to Parquet;
    the files equal those of the same rows aligned in memory, for a given zone and for the zone the time
    model decides on its own."""
    memory, disk = big_log.memory, big_log.spilled[1]  # the alignment reads the spilled parts, never changes them
    kept, spilled = RunTables(), RunTables()
    for name in memory.tables:
        kept.add(name, memory.tables[name])
        spilled.add(name, disk.tables[name])
    inferred = kept["nccl_events"].filter(pl.col("ts").is_null()).height
    assert inferred > 100, "NCCL lines without a time of their own, whose time alignment infers"
    for tz in ("Europe/Berlin", None):
        in_memory, _ = align(kept, tz)
        monkeypatch.setattr("tracelens.inferred.RANGE_LINES", 1000)  # the file's 4,180 lines in five ranges
        streamed, _ = align(spilled, tz, workdir=tmp_path / f"align-{tz}")
        monkeypatch.undo()
        assert {"nccl_events", "nccl_comms", "steps"} <= {
            n for n in memory.tables if isinstance(streamed.frame(n), pl.LazyFrame)
        }
        in_memory.write_parquet(tmp_path / f"memory-{tz}")
        streamed.write_parquet(tmp_path / f"streamed-{tz}")
        for name in memory.tables:
            written = pl.read_parquet(tmp_path / f"streamed-{tz}" / f"{name}.parquet")
            assert written.equals(pl.read_parquet(tmp_path / f"memory-{tz}" / f"{name}.parquet"), null_equal=True), (
                name,
                tz,
            )
        events = pl.read_parquet(tmp_path / f"streamed-{tz}" / "nccl_events.parquet")
        assert events["ts"].null_count() < inferred and (events["ts_quality"] == "inferred").sum() > 100
        # an inferred time was printed nowhere: no text; a spilled part keeps the printed text as memory does
        assert events.filter(pl.col("ts_quality") == "inferred")["ts_text"].null_count() > 100
        assert events.filter(pl.col("ts_quality") == "inferred")["ts_text"].drop_nulls().len() == 0
    shifted = pl.read_parquet(tmp_path / "streamed-Europe/Berlin" / "steps.parquet")
    printed = shifted["ts_text"].str.to_datetime("%Y-%m-%d %H:%M:%S,%3f", time_unit="ns", time_zone="UTC")
    assert ((printed - shifted["ts"]).dt.total_hours().is_in([1, 2])).all()  # read in Berlin, written in UTC


STRAGGLER_LOG = FIXTURES / "scenario-straggler" / "node01" / "train.log"  # 8 ranks' timer lines, interleaved
DS_LOGS = [  # step lines of every kind, and what their steps take from lines far before them
    CORPUS
    / "deepspeed"
    / "DeepSpeedExamples__step3_rlhf_finetuning__actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log",
    CORPUS / "deepspeed" / "DeepSpeedExamples__step2_dpo_finetuning__opt-350M_globalBatchSize-32.log",
    CORPUS / "deepspeed" / "gh_deepspeed_issue255_2020_forward_microstep.log",
]


def every_carry_log(path: Path) -> Path:
    """A synthetic two-host log (the formats of docs/formats/deepspeed.md) of streams whose steps depend on lines
    far before them, many chunks apart: two engines printing the same step numbers (rank 0), timer lines
    before the first progress line (rank 1, counted back from it), timer lines and no progress line
    (rank 2, counted), micro-step timers only (rank 3), ZeRO optimizer lines, and Megatron iterations whose
    skipped counts are summed per host (rank 4)."""
    logger = "[2023-06-21 07:39:{:02d},625] [INFO] [logging.py:96:log_dist] [Rank {}] "
    timers = "time (ms) | fwd: {0}.00 | bwd: 2.00 | bwd_inner: 1.50 | bwd_allreduce: 0.50 | step: 3.00"
    micro = "time (ms) | fwd_microstep: {0}.00 | bwd_microstep: 2.00 | step_microstep: 1.00"
    zero = "time (ms) | optimizer_allgather: 0.{0} | optimizer_gradients: 0.20 | optimizer_step: 0.30"
    iteration = (
        " iteration {0:8d}/  317892 | consumed samples: {1:12d} | elapsed time per iteration (ms): 258{0}.1"
        " | learning rate: 1.500E-04 | global batch size:    96 | lm loss: 1.085E+01 | loss scale: 1.0"
        " | number of skipped iterations: {2:3d} | samples per second: 3.714 |"
    )
    lines = []
    for host in ("node1", "node2"):
        lines += [f"{host}: " + logger.format(0, 1) + timers.format(n) for n in range(1, 40)]
    for n in range(1, 300):
        for host in ("node1", "node2"):
            log = f"{host}: " + logger.format(n % 60, "{}")
            for engine in (0, 1):
                lines += [
                    log.format(0) + f"step={n}, skipped={engine}, lr=[0.1], mom=[0.9]",
                    log.format(0) + timers.format(engine + n),
                ]
            lines += [
                log.format(1) + f"step={n}, skipped=0, lr=[0.1], mom=[0.9]",
                log.format(1) + timers.format(n),
                log.format(1) + zero.format(n),
            ]
            lines += [log.format(2) + timers.format(n), log.format(3) + micro.format(n)]
            lines.append(log.format(4) + iteration.format(n, 96 * n, n % 3).lstrip())
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("log", [STRAGGLER_LOG, *DS_LOGS, "every-carry"], ids=lambda log: Path(log).stem[:40])
@pytest.mark.parametrize("piece_rows", [1, 300, 1 << 19])
def test_steps_of_a_big_file_assembled_a_piece_at_a_time_equal_the_whole_file(tmp_path, monkeypatch, log, piece_rows):
    """A big file's step records are spilled chunk by chunk and assembled a range of lines at a time, each
    piece starting where the last left its streams, merged back in line order: the steps equal one
    assembly over the whole file in memory, with pieces of one part (a chunk's records of a kind), of a
    few hundred records, and of all of them."""
    path = every_carry_log(tmp_path / "train.log") if log == "every-carry" else Path(log)
    if not path.exists():
        pytest.skip(f"corpus not found: {path}")
    chunk = max(256, path.stat().st_size // 20)  # some 20 chunks, whatever the log
    memory = ingest(InputFile(path, path.name, "log", size=path.stat().st_size), jobs=1, chunk_bytes=chunk)
    expected = conform("steps", memory.tables["steps"])
    monkeypatch.setattr(assemble, "PIECE_ROWS", piece_rows)
    spilled = InputFile(path, path.name, "log", size=path.stat().st_size, spill=tmp_path / "spill")
    disk = ingest(spilled, jobs=1, chunk_bytes=chunk)
    assert isinstance(disk.tables["steps"], pl.LazyFrame)
    assert conform("steps", disk.tables["steps"].collect()).equals(expected, null_equal=True)
    assert expected["message"].null_count() == 0 and expected.height > 8
    pieces = len(list((tmp_path / "spill").rglob("steps-*.parquet")))
    assert pieces == 1 if piece_rows == 1 << 19 else pieces > (3 if piece_rows == 1 else 0)
    if log == "every-carry":  # the log is what its docstring says: each case is in the steps
        engines = expected.filter(pl.col("rank") == 0).group_by("host", "step").agg(pl.col("engine").n_unique())
        assert (engines["engine"] == 2).sum() >= 2 * 299
        counted_back = expected.filter((pl.col("rank") == 1) & (pl.col("step") <= 0))
        assert counted_back.height == 2 * 39 and counted_back["step"].min() == -38
        counted = expected.filter(pl.col("rank") == 2)
        assert counted["step"].to_list()[:3] == [1, 1, 2] and counted["step"].max() == 299
        assert expected.filter(pl.col("rank") == 3)["fwd_ms"].drop_nulls().len() == 2 * 299
        megatron = expected.filter(pl.col("iter_ms").is_not_null() & (pl.col("host") == "node2"))
        assert megatron["skipped"].max() == sum(n % 3 for n in range(1, 300))
