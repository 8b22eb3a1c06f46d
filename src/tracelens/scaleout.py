"""Scale-out: the same per-file and per-chunk ingest as Ray tasks, for runs that outgrow one machine.

`tracelens analyze RUN --ray auto|ADDRESS` (extra `tracelens[ray]`) connects to a Ray cluster
whose nodes see the run folder on shared storage. Each file is ingested by a task on some node,
which writes its tables as Parquet partitions into a folder beside the run (shared storage too)
and returns only the file's account; a big text file's chunks are parsed by further tasks (the
same `NcclParser.parse` the local worker threads run). This process then reads the partitions,
in file order, and runs the timeline and the rules on them, so the report is the one a local
run gives.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("--ray needs the Ray extra: pip install 'tracelens[ray]'") from exc
    return ray


class RayExecutor(Executor):
    """concurrent.futures' Executor over Ray tasks: `submit` runs the function on the cluster."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        return _remote(fn).remote(*args, **kwargs).future()


@cache
def _remote(fn: Callable) -> Any:
    return _ray().remote(fn)


def connect(address: str) -> int:
    """Join the cluster at `address` ("auto": the one this machine is part of) unless this process
    already runs Ray; the number of CPUs it offers."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    return max(int(ray.cluster_resources().get("CPU", 1)), 1)


@contextmanager
def shared_folder(target: Path) -> Iterator[Path]:
    """A folder beside the run, on the storage the cluster shares, removed afterwards: archive
    members are extracted and tables written there, where every node can read them."""
    base = target.resolve().parent
    folder = base / f".tracelens-{target.name}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_partitions(tables: dict[str, pl.DataFrame | pl.LazyFrame], folder: Path, index: int) -> dict[str, str]:
    """Each table of one file as `folder/TABLE/INDEX.parquet` (streamed from its spilled rows when
    lazy); table name -> path."""
    written = {}
    for name, frame in tables.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        path = folder / name / f"{index:06d}.parquet"
        if isinstance(frame, pl.LazyFrame):
            frame.sink_parquet(path)
        else:
            frame.write_parquet(path)
        written[name] = str(path)
    return written


def read_partitions(written: dict[str, str]) -> dict[str, pl.DataFrame]:
    return {name: pl.read_parquet(path) for name, path in written.items()}
