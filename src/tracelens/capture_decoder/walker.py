"""The record walk of a big capture, in a process of its own.

The walk (CaptureReader.walk) is Python from record to record and holds the
interpreter all along; the chunks already walked are decoded meanwhile in
threads, whose numpy calls each wait for the interpreter when they return (up
to its switch interval, 5 ms): beside a walk in the same process they spend most
of their time waiting for it. Apart, the walk takes a core's share and the decoders
the rest. The child sends each chunk's Walked (where its records start, the
section's interfaces, what the walk noted) down a pipe and stops when the pipe
is full: it walks at most a chunk ahead.
"""

from __future__ import annotations

import json
import mmap
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple
from pathlib import Path
from typing import IO

import numpy as np

import tracelens
from tracelens.capture_decoder import records
from tracelens.capture_decoder.records import CaptureReader, Interface, Walked

_HEADER = struct.Struct("<II")  # bytes of the message's description (JSON), then of its arrays


@contextmanager
def walked(path: Path) -> Iterator[Iterator[Walked]]:
    """The walk of the capture at `path`, chunk by chunk, done by a child process (stopped on leaving)."""
    root = str(Path(tracelens.__file__).resolve().parents[1])  # the child runs this very tracelens
    start = f"import sys; sys.path.insert(0, {root!r}); from tracelens.capture_decoder.walker import main; main()"
    # -I: no current folder or PYTHON* variables on the child's import path, only this tracelens'
    chunks = [str(records.CHUNK_RECORDS), str(records.CHUNK_BYTES)]  # chunks as walked here
    argv = [sys.executable, "-I", "-c", start, str(path), *chunks]
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert child.stdout is not None
    try:
        yield _messages(child.stdout)
    finally:
        child.kill()
        child.stdout.close()
        child.wait()


def _messages(stream: IO[bytes]) -> Iterator[Walked]:
    while True:
        head = stream.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise RuntimeError("the record walk ended before the end of the capture (its process failed)")
        described, size = _HEADER.unpack(head)
        about = json.loads(stream.read(described))
        if about.get("end"):
            return
        arrays = np.frombuffer(stream.read(size), np.uint8)
        count = about["count"]
        starts = arrays[: 8 * count].view(np.int64)
        kinds = arrays[8 * count :].view(np.int8)
        interfaces = [Interface(*i) for i in about["interfaces"]]
        yield Walked(starts, kinds, about["before"], about["order"], interfaces, about["notes"], about["padding"])


def main() -> None:
    """The child: walk the capture named on the command line in chunks of the records and bytes given,
    write each chunk to stdout."""
    records.CHUNK_RECORDS, records.CHUNK_BYTES = int(sys.argv[2]), int(sys.argv[3])
    mapped = records.mapped(Path(sys.argv[1]))
    reader = CaptureReader(np.frombuffer(mapped, np.uint8), Path(sys.argv[1]))
    out = sys.stdout.buffer
    for chunk in reader.walk():
        about = {
            "count": len(chunk.starts),
            "before": chunk.before,
            "order": chunk.order,
            "interfaces": [astuple(i) for i in chunk.interfaces],
            "notes": chunk.notes,
            "padding": chunk.padding,
        }
        _send(out, about, chunk.starts.astype(np.int64).tobytes() + chunk.kinds.astype(np.int8).tobytes())
        if len(chunk.starts):  # the pages walked leave this process (the page cache keeps them)
            mapped.madvise(mmap.MADV_DONTNEED, 0, int(chunk.starts[-1]) // mmap.PAGESIZE * mmap.PAGESIZE)
    _send(out, {"end": True}, b"")
    out.flush()


def _send(out: IO[bytes], about: dict, arrays: bytes) -> None:
    described = json.dumps(about).encode()
    out.write(_HEADER.pack(len(described), len(arrays)) + described + arrays)
