"""Find the inputs of a run: a folder, one file, or an archive, opened safely.

Formats are decided by content (the sniffers of tracelens.ingest), never by
file names. Archives (.tar, .tar.gz, .tgz, .zip) and single .gz files are
unpacked into a private temporary folder; members with absolute paths, `..`
components, links or device nodes are refused with a message, so nothing is
ever written outside that folder.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import stat
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tracelens.ingest import InputFile, sniff_format

HEAD_BYTES = 64 << 10
MAX_ARCHIVE_DEPTH = 3

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass
class Discovery:
    files: list[InputFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # refused members, unreadable files ...


def _read_head(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(HEAD_BYTES)


def _is_tar(path: Path, head: bytes) -> bool:
    if head.startswith(_GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as fh:
                inner = fh.read(512)
        except (OSError, EOFError):
            return False
        return len(inner) >= 262 and inner[257:262] == b"ustar"
    return len(head) >= 262 and head[257:262] == b"ustar"


def _member_problem(name: str) -> str | None:
    """Why an archive member name is unsafe, or None."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "'..' in path"
    return None


def _safe_target(dest: Path, name: str) -> Path:
    target = (dest / name).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ValueError("resolves outside the extraction folder")
    return target


def _keep_mtime(path: Path, mtime: float) -> None:
    """Give an extracted file its archived modification time: dumps without a timestamp are timed by it."""
    os.utime(path, (mtime, mtime))


def _extract_tar(archive: Path, label: str, dest: Path, notes: list[str]) -> None:
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            problem = _member_problem(member.name)
            if problem is None and (member.issym() or member.islnk()):
                problem = f"link to {member.linkname!r} (links are not followed)"
            if problem is None and not (member.isfile() or member.isdir()):
                problem = "special file"
            if problem:
                notes.append(f"{label}: refused member {member.name!r}: {problem}")
                continue
            if member.isdir():
                continue
            target = _safe_target(dest, member.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            _keep_mtime(target, member.mtime)


def _extract_zip(archive: Path, label: str, dest: Path, notes: list[str]) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            problem = _member_problem(info.filename)
            mode = info.external_attr >> 16
            if problem is None and stat.S_ISLNK(mode):
                problem = "link (links are not followed)"
            if problem:
                notes.append(f"{label}: refused member {info.filename!r}: {problem}")
                continue
            if info.is_dir():
                continue
            target = _safe_target(dest, info.filename)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            _keep_mtime(target, time.mktime((*info.date_time, 0, 0, -1)))


def _gunzip(path: Path, dest: Path) -> Path:
    target = dest / (path.name[:-3] if path.name.endswith(".gz") else path.name + ".out")
    dest.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "rb") as src, target.open("wb") as out:
        shutil.copyfileobj(src, out)
    _keep_mtime(target, path.stat().st_mtime)
    return target


_HOST_FOLDER = re.compile(r"^(?:[A-Za-z][\w-]*\d[\w-]*|(?:\d{1,3}\.){3}\d{1,3})$")
_HOST_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])((?:node|gpu|host|worker|compute|dgx|hgx)[-_]?\d+|ip-\d+-\d+-\d+-\d+|(?:\d{1,3}\.){3}\d{1,3})(?![0-9])",
    re.IGNORECASE,
)


def host_from_path(rel: PurePosixPath) -> str | None:
    """A host suggested by a file's path: the nearest node-like folder, else a node-like piece of the name."""
    for part in reversed(rel.parts[:-1]):
        if _HOST_FOLDER.match(part):
            return part
    found = _HOST_IN_NAME.search(rel.name)
    return found.group(1) if found else None


class _Walker:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.result = Discovery()
        self._count = 0

    def _scratch(self) -> Path:
        self._count += 1
        path = self.workdir / f"x{self._count}"
        path.mkdir(parents=True)
        return path

    def visit_file(self, path: Path, label: str, rel: PurePosixPath, depth: int) -> None:
        try:
            head = _read_head(path)
        except OSError as exc:
            self.result.notes.append(f"{label}: cannot be read: {exc.strerror or exc}")
            return
        if not head:
            fmt = "empty"
        elif depth < MAX_ARCHIVE_DEPTH and (head.startswith(_ZIP_MAGIC) or _is_tar(path, head)):
            self.visit_archive(path, label, rel, depth)
            return
        elif depth < MAX_ARCHIVE_DEPTH and head.startswith(_GZIP_MAGIC):
            try:
                inner = _gunzip(path, self._scratch())
            except (OSError, EOFError, zipfile.BadZipFile) as exc:
                self.result.notes.append(f"{label}: damaged gzip file: {exc}")
                return
            stem = rel.with_name(inner.name)
            self.visit_file(inner, f"{label}!{inner.name}", stem, depth + 1)
            return
        else:
            fmt = sniff_format(head)
        self.result.files.append(
            InputFile(path=path, name=label, format=fmt, host_hint=host_from_path(rel), size=path.stat().st_size)
        )

    def visit_archive(self, path: Path, label: str, rel: PurePosixPath, depth: int) -> None:
        dest = self._scratch()
        try:
            if zipfile.is_zipfile(path):
                _extract_zip(path, label, dest, self.result.notes)
            else:
                _extract_tar(path, label, dest, self.result.notes)
        except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            self.result.notes.append(f"{label}: damaged archive, read what could be extracted: {exc}")
        self.visit_tree(dest, f"{label}!", rel.parent, depth + 1)

    def visit_tree(self, root: Path, label_prefix: str, rel_base: PurePosixPath, depth: int) -> None:
        for path in sorted(p for p in root.rglob("*")):
            if path.is_symlink():
                self.result.notes.append(f"{label_prefix}{path.relative_to(root)}: symbolic link skipped")
                continue
            if not path.is_file():
                continue
            rel = path.relative_to(root)
            if any(part.startswith(".") for part in rel.parts):
                continue  # hidden files and folders (.git, .DS_Store ...)
            self.visit_file(path, f"{label_prefix}{rel.as_posix()}", rel_base / rel.as_posix(), depth)


def discover(target: Path, workdir: Path) -> Discovery:
    """List the inputs under `target` (folder, file or archive); archives unpack into `workdir`."""
    walker = _Walker(workdir)
    if target.is_dir():
        walker.visit_tree(target, "", PurePosixPath(), 0)
    elif target.is_file():
        walker.visit_file(target, target.name, PurePosixPath(target.name), 0)
    else:
        walker.result.notes.append(f"{target}: no such file or folder")
    return walker.result

