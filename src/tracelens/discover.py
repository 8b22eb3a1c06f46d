"""Find the inputs of a run: a folder, one file, or an archive, opened safely.

Formats are decided by content (the sniffers of tracelens.ingest), never by
file names, with one exception: at the top of a run folder, `tracelens.toml` and a
`pyproject.toml` with a [tool.tracelens] table are the run's config file
(tracelens.config_file), listed as format "config" and not read as inputs. Archives (.tar,
.tar.gz, .tgz, .zip) and single .gz files are unpacked into a private temporary folder;
members with absolute paths, `..` components, links or device nodes are refused with a
message, so nothing is ever written outside that folder. Extraction is capped (total bytes, expansion
ratio, member count, nesting depth; see Limits) so an archive bomb cannot fill
the disk, and one damaged member does not stop the rest. In a folder the user
assembled, symbolic links are followed (a loop is detected); FIFOs, sockets and
devices are skipped, never opened, so nothing waits on them.
"""

from __future__ import annotations

import errno
import lzma
import math
import os
import re
import stat
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tracelens.ingest import InputFile, sniff_format
from tracelens.ingest.text.holes import GzipMembers

HEAD_BYTES = 64 << 10
_COPY_BLOCK = 1 << 20
_GIB = 1 << 30

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"

# What can go wrong decompressing untrusted bytes: corrupt deflate/LZMA/gzip data, encryption,
# an unsupported method, a bad CRC, a truncated stream, an out-of-range header field.
_MEMBER_ERRORS = (
    OSError, EOFError, RuntimeError, NotImplementedError, ValueError, OverflowError,
    zlib.error, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError,
)  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """Caps on what archives may unpack. Environment overrides: TRACELENS_MAX_EXTRACT_GB,
    TRACELENS_MAX_MEMBERS (for the rare honest run that is bigger)."""

    total_bytes: int = 16 * _GIB  # everything extracted from one target
    members: int = 100_000  # archive members, over all archives
    ratio: int = 250  # expanded/compressed size of a member, a compressed stream or a whole archive ...
    ratio_after: int = 64 << 20  # ... once it has expanded past this many bytes
    depth: int = 3  # archives inside archives

    @classmethod
    def from_env(cls) -> Limits:
        def number(name: str, default: float) -> float:
            try:
                value = float(os.environ.get(name, default))
            except ValueError:
                return default
            return value if math.isfinite(value) and value > 0 else default

        return cls(
            total_bytes=int(number("TRACELENS_MAX_EXTRACT_GB", cls.total_bytes / _GIB) * _GIB),
            members=int(number("TRACELENS_MAX_MEMBERS", cls.members)),
        )


class CapReached(Exception):
    """Extraction stopped at a cap; the message names it."""


CONFIG_FILES = ("tracelens.toml", "pyproject.toml")  # in this order, the config a run folder holds
_TOOL_TABLE = re.compile(rb"^[ \t]*\[[ \t]*tool[ \t]*\.[ \t]*tracelens[ \t]*[\].]", re.M)


def is_config(name: str, head: bytes) -> bool:
    """Whether a file named `name` starting with `head` is a config file: a tracelens.toml, or a
    pyproject.toml with a [tool.tracelens] table."""
    return name == CONFIG_FILES[0] or (name == CONFIG_FILES[1] and _TOOL_TABLE.search(head) is not None)


@dataclass
class Discovery:
    files: list[InputFile] = field(default_factory=list)  # readable inputs, and unreadable ones with their error
    notes: list[str] = field(default_factory=list)  # refused archive members, caps reached ...


def _read_head(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(HEAD_BYTES)


# Sniffing a head holds the interpreter (a dozen sniffers over 64 KiB): from this many files,
# discover's caller may sniff them in its worker processes.
SNIFF_APART = 256
Sniffer = Callable[[list[Path]], Iterable[tuple[str, str | None]]]  # paths -> (format, error) of each


def sniff_file(path: Path) -> tuple[str, str | None]:
    """A file's format from its head, read again (a deferred sniff, maybe in another process), or
    why it could no longer be read."""
    try:
        return sniff_format(_read_head(path)), None
    except OSError as exc:
        return "unreadable", f"cannot be read: {_reason(exc)}"


def _text(name: str) -> str:
    """A file name as text to show and store: bytes that are not UTF-8 (Python keeps them as lone
    surrogates, which no table, report or terminal can encode) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _is_tar(path: Path, head: bytes) -> bool:
    if head.startswith(_GZIP_MAGIC):
        try:
            with GzipMembers(path) as fh:
                inner = b""
                while len(inner) < 512 and (more := fh.read(512 - len(inner))):
                    inner += more
        except _MEMBER_ERRORS:
            return False
        return len(inner) >= 262 and inner[257:262] == b"ustar"
    return len(head) >= 262 and head[257:262] == b"ustar"


def _member_problem(name: str) -> str | None:
    """Why an archive member name is unsafe, or None."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "'..' in path"
    if "\x00" in name:
        return "NUL byte in name"
    return None


def _safe_target(dest: Path, name: str) -> Path:
    target = (dest / name).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ValueError("resolves outside the extraction folder")
    return target


def _keep_mtime(path: Path, mtime: float) -> None:
    """Give an extracted file its archived modification time: dumps without a timestamp are timed
    by it. A time that is no time (NaN, out of range) leaves the extraction time."""
    try:
        os.utime(path, (mtime, mtime))
    except (OverflowError, ValueError, OSError):
        pass


def _zip_mtime(info: zipfile.ZipInfo) -> float:
    try:
        return time.mktime((*info.date_time, 0, 0, -1))
    except (OverflowError, ValueError):
        return math.nan


def _reason(exc: BaseException) -> str:
    """An exception as a short reason that never names a path (extraction folders are private)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, (zlib.error, lzma.LZMAError)):
        return f"corrupt compressed data ({exc})"
    if isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        return "encrypted (password protected), cannot be read"
    if isinstance(exc, NotImplementedError):
        return f"unsupported compression ({exc})"
    return str(exc) or type(exc).__name__


def _size(n: int) -> str:
    if n >= _GIB:
        return f"{n / _GIB:.3g} GiB"
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n:,} bytes"


class _Budget:
    """Bytes and members left to extract from one target, and the expansion ratio checks: of each
    member, and of each archive over all its members (many members each under the member check)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.bytes = 0
        self.members = 0
        self.archive_size = 0  # compressed size of the archive being extracted
        self.archive_bytes = 0  # and what it expanded to so far

    def member(self, declared: int = 0) -> None:
        """Count a member before it is written; `declared`: its size, when the archive says it."""
        self.members += 1
        if self.members > self.limits.members:
            raise CapReached(
                f"more than {self.limits.members:,} archive members (member cap; TRACELENS_MAX_MEMBERS raises it)"
            )
        if self.bytes + declared > self.limits.total_bytes:
            raise self._total_cap()

    def _total_cap(self) -> CapReached:
        return CapReached(
            f"extracted data passed {_size(self.limits.total_bytes)} "
            "(total size cap; TRACELENS_MAX_EXTRACT_GB raises it)"
        )

    def too_expanded(self, expanded: int, compressed: int) -> bool:
        """Whether `expanded` bytes from `compressed` are past the ratio cap."""
        return expanded > self.limits.ratio_after and expanded > self.limits.ratio * max(compressed, 1)

    def archive(self, size: int, declared: int = 0) -> None:
        """Start extracting an archive of `size` bytes; `declared`: what its directory says its
        members expand to, refused before anything is written when that is past the ratio cap."""
        self.archive_size, self.archive_bytes = size, 0
        if self.too_expanded(declared, size):
            raise CapReached(
                f"its members would expand to {_size(declared)}, more than {self.limits.ratio}x the archive's "
                f"{_size(size)} (overall expansion ratio cap, a likely archive bomb)"
            )

    def member_bomb(self, what: str, declared: int, compressed: int) -> None:
        """Refuse a member whose declared size is past the ratio cap, before it is written."""
        if self.too_expanded(declared, compressed):
            raise _RatioExceeded(self._ratio_message(what, compressed, declared))

    def _ratio_message(self, what: str, compressed: int, written: int) -> str:
        return (
            f"{what} expands more than {self.limits.ratio}x its compressed size ({_size(compressed)} -> over "
            f"{_size(written)}: expansion ratio cap, a likely archive bomb)"
        )

    def copy(self, src: BinaryIO | GzipMembers, out: BinaryIO, compressed: int, what: str) -> None:
        """Copy a decompressing stream, stopping at the total-size cap, when the archive being
        extracted expands past the ratio cap over its size, or when `what` expands more than the
        ratio cap over its `compressed` size."""
        written = 0
        while block := src.read(_COPY_BLOCK):
            written += len(block)
            self.bytes += len(block)
            self.archive_bytes += len(block)
            if self.bytes > self.limits.total_bytes:
                raise self._total_cap()
            if self.too_expanded(self.archive_bytes, self.archive_size):
                raise CapReached(
                    f"it expands more than {self.limits.ratio}x its {_size(self.archive_size)} "
                    "(overall expansion ratio cap, a likely archive bomb)"
                )
            if self.too_expanded(written, compressed):
                raise _RatioExceeded(self._ratio_message(what, compressed, written))
            out.write(block)


class _RatioExceeded(ValueError):
    """One member (or stream) expanded past the ratio cap: that member is dropped."""


_HOST_FOLDER = re.compile(r"^(?:[A-Za-z][\w-]*\d[\w-]*|(?:\d{1,3}\.){3}\d{1,3})$")
_IP = re.compile(r"^(?:\d{1,3}\.){3}\d{1,3}$")
_HOST_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])((?:node|gpu|host|worker|compute|dgx|hgx)[-_]?\d+|ip-\d+-\d+-\d+-\d+|(?:\d{1,3}\.){3}\d{1,3})(?![0-9])",
    re.IGNORECASE,
)
# Folder names that say what is inside (a kind of input, a rank, a copy of the run), not which host it came from.
_CONTENT_FOLDER = re.compile(
    r"^(?:logs?|pcaps?|captures?|tcpdump|counters?|perfquery|ibstat|fabric|nccl|deepspeed|ds|torch|pytorch|traces?|"
    r"profiler?s?|profiles?|kineto|dumps?|stacks?|pyspy|py-spy|flight[-_]?recorder|fr|fr[-_]traces?|hangs?|tmp|temp|"
    r"out|outputs?|results?|data|configs?|config|settings|metrics|tensorboard|tb|kernel|dmesg|syslog|journal|"
    r"hosts?|nodes?|gpus?|nvidia-smi|dcgm|sys|system|net|network|iface|interfaces|checkpoints?|ckpt|runs?|"
    r"artifacts?|artefacts?|attachments?|misc|other|raw|debug|stdout|stderr|before|after|good|bad|slow|fast|"
    r"baseline|healthy|broken|old|new|current|previous|latest|report|reports|\d[\d._-]*|"
    r"(?:local[-_]?|global[-_]?)?ranks?[-_]?\d*|proc(?:ess)?[-_]?\d*|pid[-_]?\d+|"
    r"(?:[\w-]*[-_])?(?:logs?|traces?|dumps?|pcaps?|captures?|counters?|results?|outputs?))$",
    re.IGNORECASE,
)


def host_folder(name: str) -> bool:
    """Whether a folder's name can be a host's: anything but a name that says what is inside."""
    return bool(_IP.match(name)) or not _CONTENT_FOLDER.match(name)


def host_from_path(rel: PurePosixPath, host_folders: Set[PurePosixPath] = frozenset()) -> str | None:
    """A host suggested by a file's path: the nearest folder that is a host's (a node-like name, or one
    of `host_folders`: sibling folders that split the run by host, whatever their names), else a
    node-like piece of the file's name."""
    folders = rel.parents
    for part, folder in zip(rel.parts[-2::-1], folders):
        if host_folder(part) and (_HOST_FOLDER.match(part) or folder in host_folders):
            return part
    found = _HOST_IN_NAME.search(rel.name)
    return found.group(1) if found else None


class _Walker:
    def __init__(self, workdir: Path, limits: Limits, defer_sniffing: bool = False) -> None:
        self.workdir = workdir
        self.limits = limits
        self.budget = _Budget(limits)
        self.result = Discovery()
        self.defer_sniffing = defer_sniffing  # plain files' formats are found once all are listed
        self.unsniffed: list[int] = []  # their places in result.files
        self.heads: list[bytes] | None = []  # their heads while they are few (sniffed here, not read again)
        self._count = 0
        self._seen_folders: set[tuple[int, int]] = set()
        self.host_folders: set[PurePosixPath] = set()  # sibling folders that split the run by host
        self.folder_run = False  # the run is a folder: a config file may sit at its top

    def _scratch(self) -> Path:
        self._count += 1
        path = self.workdir / f"x{self._count}"
        path.mkdir(parents=True)
        return path

    def note(self, text: str) -> None:
        self.result.notes.append(_text(text.replace(str(self.workdir), "<extraction folder>")))

    def unreadable(self, label: str, reason: str, rel: PurePosixPath | None = None) -> None:
        """A file that cannot be read: an input with an error, counted and shown like any other."""
        reason = reason.replace(str(self.workdir), "<extraction folder>")
        hint = host_from_path(rel, self.host_folders) if rel is not None else None
        self.result.files.append(
            InputFile(path=Path(os.devnull), name=label, format="unreadable", host_hint=hint, error=reason)
        )

    def visit_file(self, path: Path, label: str, rel: PurePosixPath, depth: int) -> None:
        try:
            head = _read_head(path)
            size = path.stat().st_size
        except OSError as exc:
            self.unreadable(label, f"cannot be read: {_reason(exc)}", rel)
            return
        is_archive = head.startswith(_ZIP_MAGIC) or _is_tar(path, head)
        if (is_archive or head.startswith(_GZIP_MAGIC)) and depth >= self.limits.depth:
            self.unreadable(
                label, f"archive nested more than {self.limits.depth} levels deep: not opened (nesting depth cap)", rel
            )
            return
        if not head:
            fmt = "empty"
        elif is_archive:
            self.visit_archive(path, label, rel, depth)
            return
        elif head.startswith(_GZIP_MAGIC):
            self.visit_gzip(path, label, rel, depth, size)
            return
        elif self.folder_run and len(rel.parts) == 1 and is_config(rel.name, head):
            fmt = "config"  # the run's settings (tracelens.config_file), not evidence of the run
        elif self.defer_sniffing:
            fmt = ""
            self.unsniffed.append(len(self.result.files))
            if self.heads is not None:
                self.heads.append(head)
                if len(self.heads) >= SNIFF_APART:  # many: their heads are read again where they are sniffed
                    self.heads = None
        else:
            fmt = sniff_format(head)
        self.result.files.append(
            InputFile(path=path, name=label, format=fmt, host_hint=host_from_path(rel, self.host_folders), size=size)
        )

    def sniff(self, sniff_many: Sniffer) -> None:
        """The deferred formats: by `sniff_many` for many files, here, from their heads, for a few."""
        files = self.result.files
        if self.heads is None:
            found = sniff_many([files[i].path for i in self.unsniffed])
        else:
            found = ((sniff_format(head), None) for head in self.heads)
        for i, (fmt, error) in zip(self.unsniffed, found, strict=True):
            files[i] = replace(files[i], format=fmt, error=error, path=Path(os.devnull) if error else files[i].path)

    def visit_gzip(self, path: Path, label: str, rel: PurePosixPath, depth: int, size: int) -> None:
        name = path.name[:-3] if path.name.endswith(".gz") else path.name + ".out"
        if len(os.fsencode(name)) > 255:  # a name at the file system's limit has no room for `.out`
            name = name[:60] + ".out"
        target = self._scratch() / name
        try:
            self.budget.archive(size)  # no directory: its expansion is checked as it streams
            self.budget.member()
            with GzipMembers(path) as src, target.open("wb") as out:
                self.budget.copy(src, out, size, label)
        except CapReached as exc:
            self.unreadable(label, f"not read: {exc}", rel)
            return
        except _MEMBER_ERRORS as exc:
            if not target.exists() or not target.stat().st_size:
                self.unreadable(label, f"damaged gzip file: {_reason(exc)}", rel)
                return
            self.note(
                f"{label}: damaged gzip file, read the {target.stat().st_size:,} "
                f"bytes before the damage: {_reason(exc)}"
            )
        _keep_mtime(target, path.stat().st_mtime)
        self.visit_file(target, f"{label}!{_text(target.name)}", rel.with_name(_text(target.name)), depth + 1)

    def visit_archive(self, path: Path, label: str, rel: PurePosixPath, depth: int) -> None:
        dest = self._scratch()
        before = self.budget.members
        try:
            if zipfile.is_zipfile(path):
                self._extract_zip(path, label, dest)
            else:
                self._extract_tar(path, label, dest)
        except CapReached as exc:
            if self.budget.members == before:
                self.unreadable(label, f"not extracted: {exc}", rel)
            else:
                self.unreadable(label, f"extraction stopped: {exc}; the members before it are read", rel)
        except _MEMBER_ERRORS as exc:
            self.unreadable(label, f"damaged archive, read what could be extracted: {_reason(exc)}", rel)
        self.visit_tree(dest, f"{label}!", rel.parent, depth + 1, follow_links=False)

    def _extract_member(
        self, label: str, name: str, dest: Path, open_member, compressed: int, mtime: float, declared: int
    ) -> None:
        """Extract one member of `declared` size (as the archive says it); a damaged one, or one
        past the ratio cap, becomes an error and the next member is tried."""
        self.budget.member(declared)
        target = None
        try:
            self.budget.member_bomb(f"member {name!r}", declared, compressed)
            target = _safe_target(dest, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_member() as src, target.open("wb") as out:
                self.budget.copy(src, out, compressed, f"member {name!r}")
        except (CapReached, *_MEMBER_ERRORS) as exc:
            if target is not None and target.exists():
                target.unlink()  # a partial member is no input
            if isinstance(exc, CapReached):
                raise
            self.unreadable(f"{label}!{name}", f"not extracted: {_reason(exc)}", PurePosixPath(name))
            return
        _keep_mtime(target, mtime)

    def _extract_tar(self, archive: Path, label: str, dest: Path) -> None:
        compressed = archive.stat().st_size  # per-member sizes are unknown in a compressed tar: ratio of the whole
        self.budget.archive(compressed)  # no directory: its expansion is checked as it streams
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                problem = _member_problem(member.name)
                if problem is None and (member.issym() or member.islnk()):
                    problem = f"link to {member.linkname!r} (links are not followed)"
                if problem is None and not (member.isfile() or member.isdir()):
                    problem = "special file"
                if problem:
                    self.note(f"{label}: refused member {member.name!r}: {problem}")
                    continue
                if member.isfile():
                    self._extract_member(
                        label,
                        member.name,
                        dest,
                        lambda m=member: tar.extractfile(m),
                        compressed,
                        _float(member.mtime),
                        member.size,
                    )

    def _extract_zip(self, archive: Path, label: str, dest: Path) -> None:
        with zipfile.ZipFile(archive) as zf:
            members = []
            for info in zf.infolist():
                problem = _member_problem(info.filename)
                if problem is None and stat.S_ISLNK(info.external_attr >> 16):
                    problem = "link (links are not followed)"
                if problem:
                    self.note(f"{label}: refused member {info.filename!r}: {problem}")
                elif not info.is_dir():
                    members.append(info)
            # the directory says what every member expands to (zipfile reads no more than that): the
            # archive is refused before anything is written when, over the members not refused one
            # by one, it is past the ratio cap
            declared = sum(i.file_size for i in members if not self.budget.too_expanded(i.file_size, i.compress_size))
            self.budget.archive(archive.stat().st_size, declared)
            for info in members:
                self._extract_member(
                    label,
                    info.filename,
                    dest,
                    lambda i=info: zf.open(i),
                    info.compress_size,
                    _zip_mtime(info),
                    info.file_size,
                )

    def visit_tree(
        self, root: Path, label_prefix: str, rel_base: PurePosixPath, depth: int, follow_links: bool
    ) -> None:
        """Every file under `root`, sorted, hidden ones skipped. Links are followed only in a folder the
        user assembled (`follow_links`); archives' links were refused when they were extracted."""
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
            info = root.stat()
        except OSError as exc:
            self.unreadable(label_prefix.rstrip("/!") or _text(str(root)), f"folder cannot be read: {_reason(exc)}")
            return
        self._seen_folders.add((info.st_dev, info.st_ino))
        hosts = [_text(e.name) for e in entries if not e.name.startswith(".") and host_folder(e.name) and _is_folder(e)]
        if len(hosts) >= 2:  # node-a/ and node-b/: the run is split by host, whatever the names
            self.host_folders.update(rel_base / name for name in hosts)
        for entry in entries:
            if entry.name.startswith("."):
                continue  # hidden files and folders (.git, .DS_Store ...)
            name = _text(entry.name)
            path, label, rel_path = Path(entry.path), f"{label_prefix}{name}", rel_base / name
            if entry.is_symlink() and not follow_links:
                self.note(f"{label}: symbolic link inside an archive skipped")
                continue
            try:
                info = path.stat()
            except OSError as exc:
                broken = exc.errno == errno.ENOENT and entry.is_symlink()
                looped = exc.errno == errno.ELOOP
                why = "broken symbolic link" if broken else "symbolic link loop" if looped else _reason(exc)
                self.unreadable(label, f"skipped: {why}", rel_path)
                continue
            if stat.S_ISDIR(info.st_mode):
                if (info.st_dev, info.st_ino) in self._seen_folders:
                    self.unreadable(
                        label, "skipped: symbolic link loop (a link back to a folder already read)", rel_path
                    )
                    continue
                self.visit_tree(path, f"{label}/", rel_path, depth, follow_links)
            elif stat.S_ISREG(info.st_mode):
                self.visit_file(path, label, rel_path, depth)
            else:
                self.unreadable(
                    label, f"skipped: not a regular file ({_file_type(info.st_mode)}), not opened", rel_path
                )


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "special file"


def discover(target: Path, workdir: Path, limits: Limits | None = None, sniff_many: Sniffer | None = None) -> Discovery:
    """List the inputs under `target` (folder, file or archive); archives unpack into `workdir`.
    `sniff_many` finds the formats of many plain files at once (in worker processes), once all are listed."""
    walker = _Walker(workdir, limits or Limits.from_env(), defer_sniffing=sniff_many is not None)
    try:
        info = target.stat()
    except FileNotFoundError:
        walker.note(f"{target}: no such file or folder")
        return walker.result
    except OSError as exc:
        walker.unreadable(_text(str(target)), f"cannot be opened: {_reason(exc)}")
        return walker.result
    if stat.S_ISDIR(info.st_mode):
        walker.folder_run = True
        walker.visit_tree(target, "", PurePosixPath(), 0, follow_links=True)
    elif stat.S_ISREG(info.st_mode):
        walker.visit_file(target, _text(target.name), PurePosixPath(_text(target.name)), 0)
    else:
        walker.unreadable(_text(target.name), f"not a regular file ({_file_type(info.st_mode)}), not opened")
    if sniff_many is not None:
        walker.sniff(sniff_many)
    return walker.result
