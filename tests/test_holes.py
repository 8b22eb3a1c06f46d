"""Runs of zero bytes cost what the data around them costs (ingest/text/holes.py): a sparse file's holes
are jumped over, a gzip file's zero padding is skipped a block at a time. Fuzz finds: a log with
a hole of a terabyte after its text, and a .gz followed by a hole, ran past the campaign's CPU limit."""

from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path

import polars as pl
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


def _hole_first(path: Path, zeros: int, text: bytes) -> Path:
    with path.open("wb") as fh:
        fh.seek(zeros)
        fh.write(text)
    return path


def test_the_reader_starts_after_the_zeros_a_log_begins_with(tmp_path: Path):
    """A log truncated while its writer kept its offset (logrotate's copytruncate) begins with a hole
    up to where the writer went on: the text after it is the file's, line 1 as an editor shows it
    (the zeros hold no newline), read at once, and no long line is made of the zeros."""
    path = _hole_first(tmp_path / "rank0.log", 1 << 40, TEXT)
    started = time.process_time()
    lines = [text for chunk in read_chunks(path) for text in chunk["text"].to_list()]
    assert lines == TEXT.decode().splitlines() and long_lines(path) == []
    assert time.process_time() - started < 10


@pytest.mark.parametrize("zeros", [8192, 1 << 30], ids=["written", "hole"])
@pytest.mark.parametrize("many", [False, True], ids=["alone", "small-files-batch"])
def test_a_log_that_begins_with_zeros_is_read_after_them_and_says_so(tmp_path: Path, zeros: int, many: bool):
    run = tmp_path / "run"
    run.mkdir()
    text = TEXT[: len(TEXT) // 50] if zeros < 1 << 20 else TEXT  # a small file, or one past the 64 KiB a sniffer reads
    if zeros < 1 << 20:
        (run / "rank0.log").write_bytes(bytes(zeros) + text)
    else:
        _hole_first(run / "rank0.log", zeros, text)
    for i in range(1, 3 if many else 1):  # small logs beside it are read as one batch
        (run / f"rank{i}.log").write_bytes(text)
    analysis = analyze(run)
    row = analysis.tables["inputs"].filter(pl.col("file") == "rank0.log").row(0, named=True)
    want = text.count(b"\n")
    assert (row["lines"], row["parsed"], row["errors"]) == (want, want, [])
    assert row["notes"] == [
        f"begins with {zeros:,} zero bytes (a hole: a log truncated while its writer kept its offset, or space "
        "never written); read from the text after them, as line 1"
    ]
    nccl = analysis.tables["nccl_versions"] if "nccl_versions" in analysis.tables else None
    assert nccl is None or nccl.height


@pytest.mark.parametrize("content, error", [
    (bytes(100_000), "holds only 100,000 zero bytes"),
    (bytes(70_000) + b'{"traceEvents": [], "distributedInfo": {"rank": 0}}',
     "begins with 70,000 zero bytes (a hole: a log truncated while its writer kept its offset, or space never "
     "written) before a kineto file, read only from its first byte"),
    (bytes(70_000) + b"\x01\x00\x00\x00" * 4000, "binary content of no format tracelens reads"),
], ids=["only-zeros", "json-after-zeros", "binary-after-zeros"])  # fmt: skip
def test_zeros_before_no_text_say_what_the_file_is(tmp_path: Path, content: bytes, error: str):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x.log").write_bytes(content)
    (row,) = analyze(tmp_path / "run").tables["inputs"].to_dicts()
    assert row["lines"] == 0 and len(row["errors"]) == 1 and error in row["errors"][0]
