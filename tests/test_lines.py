"""The shared line reader: editor line numbers whatever the bytes, chunk boundaries included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.ingest.text.lines import CHUNK_LINES, _blocks, _csv_lines, _frame, _split_lines, read_chunks, read_span

TRICKY = [
    b"plain\nlines\n",
    b"a\n\nb\n  c  \n\xff\xfe not utf-8\n\n",
    b'# comment\n"quoted, with comma\n\ttab\n',
    b"crlf\r\nlone\rcr\n",
    b"nul\x00byte\nafter\n",
    b"no newline at end",
    b"",
]


@pytest.mark.parametrize("data", TRICKY)
def test_lines_match_a_plain_split_on_newline(tmp_path: Path, data: bytes):
    path = tmp_path / "x.log"
    path.write_bytes(data)
    for chunk_bytes in (4, 7, 1 << 20):  # tiny chunks put boundaries everywhere
        frames = list(read_chunks(path, chunk_bytes=chunk_bytes))
        lines = [t for f in frames for t in f["text"].to_list()]
        numbers = [n for f in frames for n in f["line"].to_list()]
        expected = data.decode("utf-8", errors="replace").split("\n") if data else []
        if data.endswith(b"\n"):
            expected = expected[:-1]
        expected = [line.removesuffix("\r").replace("\r", " ") for line in expected]
        assert lines == expected
        assert numbers == list(range(1, len(expected) + 1))


def test_fast_csv_path_is_used_on_plain_text_and_agrees_with_the_split():
    block = b'node01:1:1 [0] NCCL INFO a\n"odd, quote\n\nlast'
    fast = _csv_lines(block)
    assert fast is not None
    assert fast.to_list() == _split_lines(block).to_list()
    assert _csv_lines(b"nul\x00here") is None


def test_spans_read_back_the_chunks_the_reader_keeps(tmp_path: Path):
    """chunk_spans' pass keeps no bytes (_blocks with keep=False): each span, read back with read_span,
    is the chunk the reader keeps there, on lines far longer than a chunk and than the line cap."""
    import random

    rng = random.Random(5)
    pieces = [b"x" * 3000, b"\n", b"\r\n", b"abc\n" * 40, b"y" * 40]
    path = tmp_path / "long.log"
    path.write_bytes(b"".join(rng.choice(pieces) for _ in range(120)))
    for chunk_bytes, max_line in ((256, 100), (1000, 2500), (4096, 1 << 20)):
        kept = list(_blocks(path, chunk_bytes, max_line))
        spans = list(_blocks(path, chunk_bytes, max_line, keep=False))
        assert [(o, n, line) for o, n, line, _ in kept] == [(o, n, line) for o, n, line, _ in spans]
        assert all(block is not None and len(block) == n for _, n, _, block in kept)
        for (offset, n, line, block), _ in zip(kept, spans):
            assert read_span(path, offset, n, line).equals(_frame(block, line))
        assert any(n == max_line for _, n, _, _ in kept) == (max_line < 3000)  # a capped line when it can be


@pytest.mark.parametrize("data", TRICKY + [b"a\n" * 5000 + b"end", b"\n" * 300, b"x" * 600 + b"\n" + b"y\n" * 700])
def test_a_chunk_holds_at_most_max_lines_and_the_lines_are_the_same(tmp_path: Path, data: bytes):
    """A chunk is cut by its lines as well as its bytes (millions of tiny lines cost memory per line):
    the lines and their numbers are those of a read by bytes alone, and each span reads back its chunk."""
    path = tmp_path / "x.log"
    path.write_bytes(data)
    whole = [(n, t) for f in read_chunks(path) for n, t in f.iter_rows()]
    for chunk_bytes, max_lines in ((1 << 20, 1), (1 << 20, 7), (64, 3), (1 << 20, 1000), (300, 500)):
        kept = list(_blocks(path, chunk_bytes, max_lines=max_lines))
        frames = [_frame(block, line) for _, _, line, block in kept]  # type: ignore[arg-type]
        assert all(f.height <= max_lines for f in frames)
        assert [(n, t) for f in frames for n, t in f.iter_rows()] == whole
        spans = list(_blocks(path, chunk_bytes, keep=False, max_lines=max_lines))
        assert [(o, n, line) for o, n, line, _ in kept] == [(o, n, line) for o, n, line, _ in spans]
    assert max((f.height for f in read_chunks(path)), default=0) <= CHUNK_LINES
