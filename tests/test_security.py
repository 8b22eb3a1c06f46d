"""Untrusted files are never executed: no parser cache is unpickled from a place others can write,
and the private extraction folder goes away when the run is killed."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

from tracelens.private_cache import cache_file

REPO = Path(__file__).resolve().parents[1]


class _Plant:
    """A pickle that, when loaded, writes a marker file: proof that it was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# Build the grammar exactly as tracelens did before (lark's cache=True) to learn the cache file name
# lark uses in the temporary folder; then plant a malicious pickle under that very name.
_OLD_CACHE = """
import re, tempfile, glob
from lark import Lark
from tracelens.resources import grammar_text
text = grammar_text("nccl")
kinds = [k.strip() for k in re.search(r"^\\?message:(.*?)\\n\\n", text, re.S | re.M).group(1).split("|")]
Lark(text, parser="lalr", start=kinds, cache=True)
print(glob.glob(tempfile.gettempdir() + "/.lark_cache_*")[0])
"""

_PARSE = """
from tracelens.ingest.nccl.log import parse_body
print(parse_body("NET/IB : No device found.")[0])
"""


def test_a_pickle_planted_at_larks_shared_cache_path_is_never_loaded(tmp_path: Path):
    shared_tmp, private = tmp_path / "shared-tmp", tmp_path / "home-cache"
    shared_tmp.mkdir()
    env = {"TMPDIR": str(shared_tmp), "XDG_CACHE_HOME": str(private)}
    made = _python(_OLD_CACHE, env)
    assert made.returncode == 0, made.stderr
    planted = Path(made.stdout.strip())
    assert planted.parent == shared_tmp
    marker = tmp_path / "executed"
    planted.write_bytes(b"x\n" + pickle.dumps(_Plant(marker)))
    run = _python(_PARSE, env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ib_no_device"
    assert not marker.exists(), "the planted pickle was executed"
    assert sorted(p.name for p in shared_tmp.iterdir()) == [planted.name]  # nothing new written to the shared folder
    assert list((private / "tracelens").glob("nccl-grammar-*.lark"))  # the cache lives in the private folder


def test_a_cache_file_writable_by_others_or_a_folder_not_private_is_not_used(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    entry = cache_file("x.lark")
    assert entry == str(tmp_path / "tracelens" / "x.lark")
    assert (tmp_path / "tracelens").stat().st_mode & 0o777 == 0o700
    Path(entry).write_bytes(b"planted")
    os.chmod(entry, 0o666)
    assert cache_file("x.lark") is None  # group/other writable: not trusted
    os.chmod(entry, 0o600)
    assert cache_file("x.lark") == entry
    (tmp_path / "tracelens" / "link.lark").symlink_to(entry)
    assert cache_file("link.lark") is None  # a link is not a private regular file
    os.chmod(tmp_path / "tracelens", 0o777)
    assert cache_file("x.lark") is None  # the folder itself is open to others


def test_a_planted_pickle_in_a_loose_private_folder_is_never_loaded(tmp_path: Path):
    cache = tmp_path / "cache"
    (cache / "tracelens").mkdir(parents=True)
    os.chmod(cache / "tracelens", 0o777)  # someone else could have written here
    env = {"XDG_CACHE_HOME": str(cache)}
    key = _python(
        (
            "from tracelens.ingest.nccl.log import _cache_path; "
            "print(_cache_path(__import__('tracelens.resources').resources.grammar_text('nccl')))"
        ),
        {"XDG_CACHE_HOME": str(tmp_path / "probe")},
    )
    name = Path(key.stdout.strip()).name
    marker = tmp_path / "executed"
    (cache / "tracelens" / name).write_bytes(b"x\n" + pickle.dumps(_Plant(marker)))
    run = _python(_PARSE, env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ib_no_device"
    assert not marker.exists()
