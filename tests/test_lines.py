"""The shared line reader: editor line numbers whatever the bytes, chunk boundaries included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.ingest.lines import _csv_lines, _split_lines, read_chunks

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
