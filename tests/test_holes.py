"""Runs of zero bytes cost what the data around them costs (ingest/text/holes.py): a sparse file's holes
are jumped over, a gzip file's zero padding is skipped a block at a time. Fuzz finds: a log with
a hole of a terabyte after its text, and a .gz followed by a hole, ran past the campaign's CPU limit."""

from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path

import pytest

from tracelens.analyze import analyze
from tracelens.ingest.text.holes import GzipMembers
from tracelens.ingest.text.lines import long_lines, read_chunks

TEXT = b"node01:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" * 2000  # past the 64 KiB a sniffer reads


def _sparse(path: Path, head: bytes, size: int, tail: bytes = b"") -> Path:
    with path.open("wb") as fh:
        fh.write(head)
        fh.truncate(size)
        fh.seek(size)
        fh.write(tail)
    return path


def test_a_terabyte_hole_after_a_log_is_one_long_line_read_at_once(tmp_path: Path):
    path = _sparse(tmp_path / "rank0.log", TEXT, 1 << 40, b"\nnode01:1:1 [0] NCCL INFO last line\n")
    started = time.process_time()
    lines = [text for chunk in read_chunks(path) for text in chunk["text"].to_list()]
    assert lines[:2000] == [TEXT.decode().splitlines()[0]] * 2000
    assert len(lines[2000]) == 1 << 20 and lines[2001:] == ["node01:1:1 [0] NCCL INFO last line"]
    assert long_lines(path) == [(2001, (1 << 40) - len(TEXT))]
    assert time.process_time() - started < 20  # scanning the hole's zeros would take many minutes


def test_a_hole_to_the_end_of_the_file(tmp_path: Path):
    path = _sparse(tmp_path / "rank0.log", TEXT, 1 << 40)
    assert sum(chunk.height for chunk in read_chunks(path)) == 2001
    assert long_lines(path) == [(2001, (1 << 40) - len(TEXT))]


def _read_all(reader) -> tuple[bytes, str | None]:
    out = []
    try:
        while block := reader.read(1 << 20):
            out.append(block)
    except (OSError, EOFError, zlib.error) as exc:
        return b"".join(out), type(exc).__name__
    return b"".join(out), None


MEMBER, OTHER = gzip.compress(b"hello\n" * 1000), gzip.compress(bytes(range(256)) * 2000)


@pytest.mark.parametrize("data", [
    MEMBER, MEMBER + OTHER, gzip.compress(b"") + MEMBER, MEMBER + bytes(5000) + OTHER, MEMBER + bytes(3 << 20),
], ids=["one", "two", "empty-first", "padding-between", "padding-after"])  # fmt: skip
def test_members_read_as_gzip_reads_them(tmp_path: Path, data: bytes):
    path = tmp_path / "x.gz"
    path.write_bytes(data)
    with gzip.open(path) as theirs, GzipMembers(path) as ours:
        assert _read_all(ours) == _read_all(theirs)


@pytest.mark.parametrize("data, error", [
    (OTHER[:-5], "EOFError"), (MEMBER[:-8] + b"\0\0\0\0" + MEMBER[-4:], "error"), (MEMBER + b"\0\0zz", "BadGzipFile"),
], ids=["cut", "crc", "garbage-after"])  # fmt: skip
def test_damage_is_raised_after_what_came_before_it(tmp_path: Path, data: bytes, error: str):
    path = tmp_path / "x.gz"
    path.write_bytes(data)
    with GzipMembers(path) as ours:
        got, raised = _read_all(ours)
    assert raised == error
    assert (gzip.decompress(MEMBER) if data.startswith(MEMBER) else gzip.decompress(OTHER)).startswith(got)
    if error == "BadGzipFile":  # the member before the garbage is kept whole
        assert got == gzip.decompress(MEMBER)


def test_a_gzip_log_before_a_hole_is_read_whole_and_fast(tmp_path: Path):
    (tmp_path / "run").mkdir()
    _sparse(tmp_path / "run" / "rank0.log.gz", gzip.compress(TEXT), 1 << 40)
    started = time.process_time()
    analysis = analyze(tmp_path / "run")
    (row,) = analysis.tables["inputs"].to_dicts()
    assert (row["file"], row["lines"], row["parsed"], row["errors"]) == ("rank0.log.gz!rank0.log", 2000, 2000, [])
    assert time.process_time() - started < 30  # Python's gzip reads zero padding a byte per call


def test_a_member_cut_short_before_a_hole_ends_at_the_hole(tmp_path: Path):
    """Deflate can read zeros as data: a member cut short and a terabyte hole after it decompressed
    on, a byte of output per input bit pattern, until the run's CPU limit."""
    data = gzip.compress(bytes(range(256)) * 4000, mtime=0)
    path = _sparse(tmp_path / "x.gz", data[: len(data) // 2], 1 << 40)
    started = time.process_time()
    with GzipMembers(path) as ours:
        got, raised = _read_all(ours)
    assert raised == "EOFError" and (bytes(range(256)) * 4000).startswith(got)
    assert time.process_time() - started < 5
