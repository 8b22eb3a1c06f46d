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
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl


class RayUnavailable(Exception):
    """Why `--ray` cannot run here (no extra, nothing at the address): said in one line, not as a crash."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("--ray needs the Ray extra: pip install 'tracelens[ray]'") from exc
    return ray


class RayExecutor(Executor):
    """concurrent.futures' Executor over Ray tasks: `submit` runs the function on the cluster."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        return _remote(fn).remote(*args, **kwargs).future()


@cache
def _remote(fn: Callable) -> Any:
    return _ray().remote(fn)


ANSWER_S = 5.0  # how long an address is given to accept a connection (Ray itself retries for minutes)


def connect(address: str) -> tuple[int, str | None]:
    """Join the cluster at `address` unless this process already runs Ray: the number of CPUs it offers,
    and a note for the report when this machine had none to join. "auto" is the cluster this machine
    joined, else a local Ray instance started here (what `ray.init()` does), so that `--ray auto` runs
    on a fresh install; an address where nothing answers is an error, said at once."""
    ray = _ray()
    started_here = False
    if not ray.is_initialized():
        if address == "auto":
            try:
                ray.init(address="auto", log_to_driver=False)
            except ConnectionError:  # "Could not find any running Ray instance"
                ray.init(include_dashboard=False, log_to_driver=False)
                started_here = True
        else:
            _answers(address)
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as exc:  # it answers, but it is no Ray head (Ray gives up after ~20 s)
                said = (str(exc).splitlines() or [""])[0]
                raise RayUnavailable(f"--ray {address}: {said}; is that the head's GCS address?") from None
    cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
    if not started_here:
        return cpus, None
    return cpus, (
        f"No Ray cluster was running on this machine: --ray auto started a local Ray instance ({cpus} CPUs). "
        "To ingest on a cluster, join it first (`ray start --address HEAD:6379`) or give --ray HEAD:6379."
    )


def _answers(address: str) -> None:
    """Raise RayUnavailable unless something accepts a connection at `address` (host:port, or ray://host:port)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"--ray {address!r} is not an address: give 'auto' or host:port (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ANSWER_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayUnavailable(
            f"--ray {address}: nothing answers there ({reason}); start the head with `ray start --head` "
            "and give the address it prints, or use --ray auto on a node of the cluster"
        ) from None


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
