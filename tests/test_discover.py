"""Discovery: folders, single files, archives opened safely, formats by content."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tracelens.discover import discover, host_from_path

NCCL_LINE = b"node01:100:100 [0] NCCL INFO Using network IB\n"
PCAP_HEAD = bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000")


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def test_folder_formats_are_sniffed_by_content_not_name(tmp_path: Path):
    run = tmp_path / "run"
    (run / "node01").mkdir(parents=True)
    (run / "node01" / "capture.log").write_bytes(PCAP_HEAD)  # a pcap with a misleading name
    (run / "node01" / "train.pcap").write_bytes(NCCL_LINE)  # and a log named like a capture
    (run / "empty.txt").write_bytes(b"")
    (run / ".hidden").write_bytes(b"x")
    found = discover(run, tmp_path / "work")
    by_name = {f.name: f for f in found.files}
    assert by_name["node01/train.pcap"].format == "log"
    assert by_name["node01/capture.log"].format != "log"
    assert by_name["empty.txt"].format == "empty"
    assert ".hidden" not in by_name
    assert by_name["node01/train.pcap"].host_hint == "node01"


def test_tar_gz_members_are_read_and_unsafe_members_refused(tmp_path: Path):
    archive = tmp_path / "run42.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "run42/node01/nccl.log", NCCL_LINE, mtime=1_700_000_000)
        _add(tar, "../evil.log", NCCL_LINE)
        _add(tar, "/etc/evil.log", NCCL_LINE)
        _add(tar, "run42/link", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        _add(tar, "run42/hard", type=tarfile.LNKTYPE, linkname="../../outside")
    work = tmp_path / "work"
    found = discover(archive, work)
    assert [f.name for f in found.files] == ["run42.tar.gz!run42/node01/nccl.log"]
    assert found.files[0].path.stat().st_mtime == 1_700_000_000  # archived time kept: dumps are ordered by it
    assert found.files[0].host_hint == "node01"
    refused = "\n".join(found.notes)
    for member, reason in [
        ("../evil.log", "'..'"),
        ("/etc/evil.log", "absolute path"),
        ("run42/link", "link"),
        ("run42/hard", "link"),
    ]:
        assert f"refused member {member!r}: " in refused and reason in refused
    assert not (tmp_path / "evil.log").exists()
    written = [p for p in work.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(work.resolve()) for p in written)


def test_zip_and_single_gz_and_nested_archive(tmp_path: Path):
    inner = tmp_path / "inner.tar"
    with tarfile.open(inner, "w") as tar:
        _add(tar, "node02/nccl.log", NCCL_LINE)
    archive = tmp_path / "run.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("node01/train.log", NCCL_LINE)
        zf.writestr("../escape.log", NCCL_LINE)
        zf.write(inner, "nested/inner.tar")
    single = tmp_path / "nccl.node03.123.gz"
    single.write_bytes(gzip.compress(NCCL_LINE))
    found = discover(archive, tmp_path / "w1")
    names = sorted(f.name for f in found.files)
    assert names == ["run.zip!nested/inner.tar!node02/nccl.log", "run.zip!node01/train.log"]
    assert any("'../escape.log'" in n for n in found.notes)
    gz = discover(single, tmp_path / "w2").files
    assert [(f.name, f.format, f.host_hint) for f in gz] == [("nccl.node03.123.gz!nccl.node03.123", "log", "node03")]


def test_a_gzip_file_named_at_the_length_limit_is_read(tmp_path: Path):
    """Fuzz find (exit 3): the decompressed copy's name, the input's own plus `.out`, passed the
    file system's 255-byte limit."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ("x" * 251 + ".log")).write_bytes(gzip.compress(NCCL_LINE))
    (found,) = discover(tmp_path / "run", tmp_path / "w").files
    assert found.name == "x" * 251 + ".log!" + "x" * 60 + ".out" and found.format == "log"
    assert found.path.read_bytes() == NCCL_LINE


def test_file_names_that_are_not_utf8_are_shown_with_replacement_characters(tmp_path: Path):
    """Fuzz find (exit 3): a file named with bytes that are not UTF-8 reached the inputs table as lone
    surrogates, which polars cannot encode."""
    import os

    from tracelens.analyze import analyze

    (tmp_path / "run").mkdir()
    for name in (b"\xff\xfe-rank0.log", b"\x9b31m.log"):
        with open(os.path.join(os.fsencode(tmp_path / "run"), name), "wb") as fh:
            fh.write(NCCL_LINE)
    analysis = analyze(tmp_path / "run")
    assert sorted(analysis.tables["inputs"]["file"]) == ["\ufffd31m.log", "\ufffd\ufffd-rank0.log"]
    assert analysis.tables["inputs"]["parsed"].to_list() == [1, 1]


def test_damaged_archive_is_an_input_error_and_missing_path_a_note(tmp_path: Path):
    broken = tmp_path / "broken.tar.gz"
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        _add(tar, "a.log", NCCL_LINE * 100)
    broken.write_bytes(data.getvalue()[:40])
    found = discover(broken, tmp_path / "w")
    (bad,) = found.files
    assert bad.name == "broken.tar.gz" and bad.format == "unreadable" and "damaged gzip file" in bad.error
    missing = discover(tmp_path / "nope", tmp_path / "w3")
    assert missing.files == [] and "no such file or folder" in missing.notes[0]


@pytest.mark.parametrize(
    "path, host",
    [
        ("node01/train.log", "node01"),
        ("logs/gpu-dev006/x.txt", "gpu-dev006"),
        ("capture-node03.pcap", "node03"),
        ("nccl.worker-7.1234", "worker-7"),
        ("10.0.143.177/stdout.log", "10.0.143.177"),
        ("001_nccl147_v23_ib.log", None),
        ("perfquery-0900.txt", None),
        ("rank3/train.log", None),
        ("node-a/logs/rank3.log", None),
        ("2024-05-01/train.log", None),
    ],
)
def test_host_from_path(path: str, host: str | None):
    assert host_from_path(PurePosixPath(path)) == host


@pytest.mark.parametrize(
    "layout, hosts",
    [
        ({"node-a/rank0.log", "node-b/rank2.log"}, {"node-a", "node-b"}),
        ({"master/logs/a.log", "worker-b/logs/b.log", "pcap/c.log"}, {"master", "worker-b", None}),
        ({"run/node-a/a.log", "run/node-b/b.log"}, {"node-a", "node-b"}),
        ({"logs/a.log", "pcap/b.log"}, {None}),  # folders that say what is inside them, not where it came from
        ({"trainer/a.log"}, {None}),  # a lone folder without a digit does not split the run by host
        ({"rank0/a.log", "rank1/b.log"}, {None}),  # a folder per rank is not a host
    ],
)
def test_sibling_folders_split_a_run_by_host_whatever_their_names(tmp_path: Path, layout: set[str], hosts: set):
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(NCCL_LINE)
    assert {f.host_hint for f in discover(tmp_path, tmp_path / ".w").files} == hosts


@pytest.mark.parametrize("apart", [1, 10_000])
def test_formats_sniffed_after_listing_equal_those_sniffed_as_each_file_is_met(tmp_path, monkeypatch, apart):
    """`analyze` has its worker processes sniff a folder of many files once all are listed: every fixture
    run and corpus folder gives the same files, formats, names, hosts and errors as sniffing each file as it
    is met (`apart` 1: every folder by the many-files path; 10,000: the few-files path), and a file that
    vanishes before its sniff is an unreadable input, not a crash."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from tests.helpers import CORPUS, FIXTURES
    from tracelens import discover as discovery

    monkeypatch.setattr(discovery, "SNIFF_APART", apart)
    runs = [p for p in sorted(FIXTURES.iterdir()) if p.is_dir()]
    runs += [p for p in sorted(CORPUS.iterdir()) if p.is_dir()] if CORPUS.is_dir() else []  # real logs, pastes
    assert len(runs) > 30
    strip = lambda f: (f.name, f.format, f.host_hint, f.size, f.error)  # noqa: E731
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for i, run in enumerate(runs):
            inline = discover(run, tmp_path / f"a{i}").files
            deferred = discover(
                run, tmp_path / f"b{i}", sniff_many=lambda paths: pool.map(discovery.sniff_file, paths)
            ).files
            assert [strip(f) for f in deferred] == [strip(f) for f in inline], run.name
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "train.log").write_text("[2024-12-06 18:30:00,423] [INFO] [engine.py:1] step=1\n")

    def vanished(paths):
        for p in paths:
            p.unlink()
        return map(discovery.sniff_file, paths)

    monkeypatch.setattr(discovery, "SNIFF_APART", 1)
    (gone,) = discover(tmp_path / "gone", tmp_path / "c", sniff_many=vanished).files
    assert gone.format == "unreadable" and gone.error.startswith("cannot be read:") and gone.name == "train.log"
