"""Discovery under hostile or broken inputs: every damaged member, cap and odd file gets a one-line
error naming it, the rest is still read, and no message shows the private extraction folder."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from tracelens.discover import Limits, discover

LINE = b"node01:100:100 [0] NCCL INFO Using network IB\n"


def _errors(found) -> dict[str, str]:
    return {f.name: f.error for f in found.files if f.error}


def _readable(found) -> list[str]:
    return sorted(f.name for f in found.files if not f.error)


def _no_private_path(found, work: Path) -> None:
    text = "\n".join([*found.notes, *(f.error or "" for f in found.files)])
    assert str(work) not in text and "/x1" not in text


def _zip_with(tmp_path: Path, corrupt: bytes, method=zipfile.ZIP_DEFLATED) -> Path:
    """A zip whose second member's compressed data is overwritten with `corrupt`."""
    path = tmp_path / "run.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.log", LINE)
        zf.writestr(zipfile.ZipInfo("b.log"), LINE * 50, compress_type=method)
        zf.writestr("c.log", LINE)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("b.log")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start : start + len(corrupt)] = corrupt
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "method, corrupt, reason",
    [
        (zipfile.ZIP_DEFLATED, b"\xff\xff\xff\xff", "corrupt compressed data"),
        (zipfile.ZIP_LZMA, b"\x09\x14\x05\x00\xff\xff\xff\xff\xff", ""),
        (zipfile.ZIP_BZIP2, b"BZh9\xff\xff", ""),
    ],
)
def test_corrupt_member_data_is_one_error_and_the_other_members_are_read(tmp_path: Path, method, corrupt, reason):
    work = tmp_path / "work"
    found = discover(_zip_with(tmp_path, corrupt, method), work)
    assert _readable(found) == ["run.zip!a.log", "run.zip!c.log"]
    ((name, error),) = _errors(found).items()
    assert name == "run.zip!b.log" and error.startswith("not extracted: ") and reason in error
    _no_private_path(found, work)


def test_encrypted_member_and_unsupported_method_are_named(tmp_path: Path):
    path = tmp_path / "run.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.log", LINE)
        zf.writestr("secret.log", LINE)
        zf.writestr("odd.log", LINE)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        secret, odd = zf.getinfo("secret.log"), zf.getinfo("odd.log")
    for info in (secret,):  # the encryption flag, in the local header and the central directory
        data[info.header_offset + 6] |= 1
    cd = data.find(b"PK\x01\x02")
    while cd >= 0:
        name_len = int.from_bytes(data[cd + 28 : cd + 30], "little")
        name = bytes(data[cd + 46 : cd + 46 + name_len])
        if name == b"secret.log":
            data[cd + 8] |= 1
        if name == b"odd.log":
            data[cd + 10 : cd + 12] = (99).to_bytes(2, "little")  # AES / an unknown method
        cd = data.find(b"PK\x01\x02", cd + 4)
    data[odd.header_offset + 8 : odd.header_offset + 10] = (99).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    found = discover(path, tmp_path / "w")
    assert _readable(found) == ["run.zip!a.log"]
    errors = _errors(found)
    assert "encrypted" in errors["run.zip!secret.log"]
    assert "unsupported compression" in errors["run.zip!odd.log"]


def test_corrupt_gzip_with_nothing_readable_is_an_error_naming_the_file(tmp_path: Path):
    path = tmp_path / "nccl.log.gz"
    good = gzip.compress(LINE * 100)
    path.write_bytes(good[:10] + b"\x00\xff" * 20 + good[50:])
    work = tmp_path / "w"
    found = discover(path, work)
    assert list(_errors(found)) == ["nccl.log.gz"] and "damaged gzip" in _errors(found)["nccl.log.gz"]
    _no_private_path(found, work)


def test_tar_member_mtime_out_of_range_or_nan_keeps_every_member(tmp_path: Path):
    path = tmp_path / "run.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, mtime in (("a.log", "1e20"), ("b.log", "nan"), ("c.log", "-1e19"), ("d.log", "1700000000")):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(LINE), {"mtime": mtime}
            tar.addfile(info, io.BytesIO(LINE))
    found = discover(path, tmp_path / "w")
    assert _readable(found) == [f"run.tar!{n}.log" for n in "abcd"]
    assert not _errors(found)


def test_total_size_cap_stops_extraction_and_names_the_cap(tmp_path: Path):
    path = tmp_path / "big.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for i in range(5):
            data = os.urandom(300_000)
            info = tarfile.TarInfo(f"f{i}.log")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    work = tmp_path / "w"
    found = discover(path, work, Limits(total_bytes=1_000_000))
    error = _errors(found)["big.tar.gz"]
    assert "total size cap" in error and "TRACELENS_MAX_EXTRACT_GB" in error
    assert len(_readable(found)) == 3  # the members before the cap are read
    assert sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) <= 1_000_000
    _no_private_path(found, work)


def test_ratio_cap_drops_the_bomb_member_and_reads_the_rest(tmp_path: Path):
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("bomb.log", b"\0" * (8 << 20))
        zf.writestr("real.log", LINE)
    found = discover(path, tmp_path / "w", Limits(ratio_after=1 << 20))
    assert _readable(found) == ["bomb.zip!real.log"]
    assert "expansion ratio cap" in _errors(found)["bomb.zip!bomb.log"]


def test_member_count_cap_is_named(tmp_path: Path):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(12):
            zf.writestr(f"f{i:02}.log", LINE)
    found = discover(path, tmp_path / "w", Limits(members=10))
    assert len(_readable(found)) == 10
    assert "member cap" in _errors(found)["many.zip"]


def test_nesting_depth_cap_is_named(tmp_path: Path):
    payload, name = LINE, "n.log"
    for level in range(4):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(name, payload)
        payload, name = buf.getvalue(), f"level{level}.zip"
    (tmp_path / "top.zip").write_bytes(payload)
    found = discover(tmp_path / "top.zip", tmp_path / "w")
    ((name, error),) = _errors(found).items()
    assert name == "top.zip!level2.zip!level1.zip!level0.zip" and "nesting depth cap" in error


def test_links_in_a_users_folder_are_followed_and_a_loop_detected(tmp_path: Path):
    shared = tmp_path / "shared-storage"
    shared.mkdir()
    (shared / "node02.log").write_bytes(LINE)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run-123.log").write_bytes(LINE)
    (run / "latest.log").symlink_to("run-123.log")
    (run / "remote").symlink_to(shared)
    (run / "loop").symlink_to(run)
    (run / "broken.log").symlink_to(tmp_path / "gone.log")
    (run / "self.log").symlink_to("self.log")
    os.mkfifo(run / "pipe")
    found = discover(run, tmp_path / "w")
    assert _readable(found) == ["latest.log", "remote/node02.log", "run-123.log"]
    errors = _errors(found)
    assert "symbolic link loop" in errors["loop"]
    assert "broken symbolic link" in errors["broken.log"]
    assert "symbolic link loop" in errors["self.log"]
    assert "a FIFO" in errors["pipe"]  # skipped, never opened (opening would block)


def test_a_fifo_given_as_target_is_not_opened(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe")
    found = discover(tmp_path / "pipe", tmp_path / "w")
    assert "a FIFO" in _errors(found)["pipe"]


def _written(work: Path) -> int:
    return sum(p.stat().st_size for p in work.rglob("*") if p.is_file())


def test_a_zip_of_many_members_each_under_the_member_ratio_is_refused_before_writing(tmp_path: Path):
    """Many members each too small for the per-member ratio check (which starts at 64 MiB) still add
    up to a bomb: extraction stops at the archive's overall expansion cap, long before the whole is
    written. Scaled down: 64 members of 1 MiB zeros, the member check from 4 MiB."""
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(64):
            zf.writestr(f"m{i:02}.log", b"\0" * (1 << 20))
    work = tmp_path / "w"
    found = discover(path, work, Limits(ratio_after=4 << 20))
    error = _errors(found)["bomb.zip"]
    assert error.startswith("not extracted:") and "overall expansion ratio cap" in error and "64 MiB" in error
    assert _readable(found) == [] and _written(work) == 0
    _no_private_path(found, work)


def test_a_compressed_tar_of_many_members_stops_once_it_expands_past_the_ratio(tmp_path: Path):
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for i in range(64):
            info = tarfile.TarInfo(f"m{i:02}.log")
            info.size = 1 << 20
            tar.addfile(info, io.BytesIO(b"\0" * info.size))
    work = tmp_path / "w"
    found = discover(path, work, Limits(ratio_after=4 << 20))
    error = _errors(found)["bomb.tar.gz"]
    assert error.startswith("extraction stopped:") and "overall expansion ratio cap" in error
    assert _written(work) <= 250 * path.stat().st_size < 32 << 20  # stopped at the cap, not after all 64 MiB


def test_a_member_larger_than_the_size_left_is_refused_before_it_is_written(tmp_path: Path):
    path = tmp_path / "big.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a.log", LINE)
        zf.writestr("b.log", os.urandom(600_000))
    work = tmp_path / "w"
    found = discover(path, work, Limits(total_bytes=500_000))
    assert _readable(found) == ["big.zip!a.log"] and "total size cap" in _errors(found)["big.zip"]
    assert _written(work) == len(LINE)
