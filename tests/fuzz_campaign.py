"""A long fuzz campaign: thousands of mutated runs, each analysed by the `tracelens analyze` command
in its own process, as a user runs it, with a CPU and wall-clock limit and its memory watched.

    nice -n 19 .venv/bin/python -m tests.fuzz_campaign --cases 3000 --jobs 2 [--corpus ../shared/corpus]

Each case is one run: a mutated file given as the run, a folder of one to four mutated files, an
archive of them, or a hostile folder (`HOSTILE`). Its sources are every committed fixture file,
the synthetic and hostile seeds of tests/helpers/fuzz.py and, with `--corpus`, every file of a
folder of real logs, read in place (only mutated copies are written, into the campaign's own
folder outside the repository). The mutations are those of tests/helpers/fuzz.py. A case fails
(`FAILURES`) on exit 3 or 4, a Python traceback or a Rust panic on the terminal, a run killed for
its CPU time, its wall time or its memory, a peak RSS over `--max-rss-gb`, control characters or
markup from the inputs unescaped in the terminal output, the HTML or the Markdown, JSON that is
not strict, or lines not all accounted for. Every case is reproducible from `--seed` and its
number (`--only N` runs one case and keeps its folder); failing cases are kept, with their
output, under the campaign folder, and `summary.json` there has the numbers.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import hashlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.helpers import FIXTURES, fuzz

REPO = FIXTURES.parent
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20

FAILURES = {
    "exit3": "exit status 3: a bug stopped the command",
    "exit4": "exit status 4: a rule failed",
    "traceback": "a Python traceback on the terminal",
    "panic": "a Rust panic message on the terminal",
    "signal": "ended by a signal the campaign did not send",
    "cpu_timeout": "killed after --cpu-seconds of CPU time",
    "hang": "killed after --wall-seconds with little CPU used (waiting on something)",
    "rss": "peak RSS over --max-rss-gb",
    "terminal_escape": "a control character from the inputs on the terminal",
    "html": "HTML report unbalanced or with markup from the inputs",
    "markdown": "markup from the inputs outside the Markdown's code blocks",
    "json": "--json output missing or not strict JSON",
    "accounting": "an input's lines not all counted as parsed, ignored or unrecognised",
    "file_lost": "a whole input lost to an internal error",
    "exit_status": "an exit status the command never gives",
    "harness": "the campaign itself could not make or run the case (an OSError: a full disk ...)",
}


# ---------------------------------------------------------------------------------- hostile folders


def _deflated(size: int) -> tuple[bytes, int]:
    """Raw deflate of `size` zero bytes, and their CRC-32, made a MiB at a time."""
    packer, crc, zero = zlib.compressobj(9, zlib.DEFLATED, -15), 0, bytes(MIB)
    out = []
    for _ in range(size // MIB):
        out.append(packer.compress(zero))
        crc = zlib.crc32(zero, crc)
    out.append(packer.flush())
    return b"".join(out), crc


_ZEROS: dict[int, tuple[bytes, int]] = {}
_ZEROS_LOCK = threading.Lock()


def _zeros(size: int) -> tuple[bytes, int]:
    with _ZEROS_LOCK:
        if size not in _ZEROS:
            _ZEROS[size] = _deflated(size)
        return _ZEROS[size]


def zip_of_zeros(members: int, size: int) -> bytes:
    """A zip of `members` members of `size` zero bytes each, the one deflated body written for every
    member (what a bomb of many members is: small on disk, each member under a per-member cap)."""
    body, crc = _zeros(size)
    out, central = io.BytesIO(), io.BytesIO()
    for i in range(members):
        name = f"part{i:05d}.log".encode()
        offset = out.tell()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(body), size, len(name), 0))
        out.write(name + body)
        central.write(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                20,
                20,
                0,
                8,
                0,
                0x21,
                crc,
                len(body),
                size,
                len(name),
                0,
                0,
                0,
                0,
                0o100644 << 16,
                offset,
            )  # fmt: skip
            + name
        )
    start = out.tell()
    out.write(central.getvalue())
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, members, members, central.tell(), start, 0))
    return out.getvalue()


def gzip_of_zeros(size: int) -> bytes:
    body, crc = _zeros(size)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + body + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _hostile_deep(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    deep = run.joinpath(*["d"] * rng.choice([40, 200, 400]))
    deep.mkdir(parents=True)
    (deep / "rank0.log").write_bytes(some())
    (deep / "up").symlink_to(run)


def _hostile_links(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    (run / "node01").mkdir(parents=True)
    (run / "node01" / "train.log").write_bytes(some())
    (run / "node01" / "loop").symlink_to("..")
    (run / "self").symlink_to("self")
    (run / "a").symlink_to("b")
    (run / "b").symlink_to("a")
    (run / "dangling.log").symlink_to("nowhere/at/all.log")
    (run / "twice.log").symlink_to("node01/train.log")
    (run / "zero").symlink_to("/dev/zero")
    (run / "random").symlink_to("/dev/urandom")
    (run / "null.log").symlink_to("/dev/null")
    (run / "status.txt").symlink_to("/proc/self/status")


def _hostile_zip_members(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    count, size = rng.choice([(1024, 10 * MIB), (4096, MIB), (200, 63 * MIB)])
    (run / "logs.zip").write_bytes(zip_of_zeros(count, size))
    (run / "train.log").write_bytes(some())


def _hostile_zip_ratio(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    (run / "one.zip").write_bytes(zip_of_zeros(1, rng.choice([1024, 3072]) * MIB))
    (run / "rank0.log.gz").write_bytes(gzip_of_zeros(rng.choice([256, 2048]) * MIB))


def _hostile_nested(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    """A log inside a tar.gz inside a zip inside ..., deeper than the nesting cap or not."""
    run.mkdir()
    name, data = "rank0.log", some()
    for level in range(rng.choice([3, 12])):
        if level % 2:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr(name, data)
            name, data = f"level{level}.zip", buf.getvalue()
        else:
            name, data = f"level{level}.tar.gz", _tar([(_member(name), data)])
    (run / name).write_bytes(data)


def _hostile_fifo(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    os.mkfifo(run / "pipe.log")
    os.mkfifo(run / "nccl.txt")
    (run / "train.log").write_bytes(some())


def _hostile_unreadable(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    (run / "locked").mkdir(parents=True)
    (run / "locked" / "a.log").write_bytes(some())
    (run / "secret.log").write_bytes(some())
    (run / "secret.log").chmod(0)
    (run / "locked").chmod(0)  # the campaign runs as root on some machines: then both are read anyway
    (run / "train.log").write_bytes(some())


def _hostile_sparse(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    with open(run / "huge.log", "wb") as fh:
        fh.write(some())
        fh.truncate(rng.choice([4, 64, 1024]) << 30)  # a hole of zeros: gigabytes that take no disk
    with open(run / "holes.log", "wb") as fh:
        fh.seek(rng.choice([1, 8]) << 30)
        fh.write(some())


def _hostile_many(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    pieces = some().split(b"\n")
    for i in range(rng.choice([2000, 5000])):  # many files, not much data: each at most 4 KiB
        (run / f"rank{i:05d}.log").write_bytes((b"\n".join(pieces[i % max(len(pieces), 1) :][:3]) + b"\n")[-4096:])


def _hostile_names(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    names = [
        b"new\nline.log", b"\x1b[2J\x1b]0;owned\x07.log", b"\xff\xfe-invalid.log", b"-o", b"--json",
        b"x" * 250 + b".log", b"<script>TLFUZZ()<\xe2\x80\xae>.log", b" ", b"*.log", b"\x9b31m.txt",
    ]  # fmt: skip
    for name in names:
        with open(os.path.join(os.fsencode(run), name), "wb") as fh:
            fh.write(some())
    (run / "dir.log").mkdir()
    (run / "empty.log").write_bytes(b"")
    (run / "empty.gz").write_bytes(b"")
    (run / "empty.zip").write_bytes(b"")


def _hostile_archive_members(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    (run / "links.tar.gz").write_bytes(
        _tar([
            (_member("../escape.log"), some()), (_member("/abs/path.log"), some()),
            (_member("ok/train.log"), some()), (_member("ok/passwd", tarfile.SYMTYPE, "/etc/passwd"), None),
            (_member("ok/hard", tarfile.LNKTYPE, "/etc/shadow"), None), (_member("ok/dev", tarfile.CHRTYPE), None),
            (_member("ok/fifo", tarfile.FIFOTYPE), None), (_member("ok/dir/../../up.log"), some()),
        ])
    )  # fmt: skip
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ["../../zip-escape.log", "/abs.log", "ok.log", "a/../../b.log", "nul\x00name.log"]:
            zf.writestr(name, some())
    (run / "names.zip").write_bytes(buf.getvalue())


def _hostile_config(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    run.mkdir()
    (run / "tracelens.toml").write_bytes(
        rng.choice([b"select = [\n", b"[rules.TL203]\nwait_warns = 1e309\n", b'tz = "\x1b[2J"\n', some()[:4096]])
    )
    (run / "train.log").write_bytes(some())


def _hostile_sparse_tails(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    """The head of each format read whole or as one document, before a hole of gigabytes."""
    run.mkdir()
    heads = {
        "fr_trace_rank_0": b"\x80\x02}q\x00(X\x07\x00\x00\x00versionq\x01X\x03\x00\x00\x002.4q\x02",
        "fr_trace_rank_1.json": b'{"version": "2.4", "entries": [',
        "ds_config.json": b'{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2,\n',
        "rank-0.pt.trace.json": b'{"schemaVersion": 1, "traceEvents": [\n',
        "perfquery.txt": b"# Port extended counters: Lid 3 port 1 (CapMask: 0x5A00)\nPortXmitData:....1\n",
        "train.log": some()[:4096],
    }
    if rng.random() < 0.3:  # refused as a usage error: the run stops before the other files are read
        heads["tracelens.toml"] = b'select = ["TL1"]\n'
    for name, head in heads.items():
        with open(run / name, "wb") as fh:
            fh.write(head)
            fh.truncate(rng.choice([1, 4, 64]) << 30)


def _capture(order: str, snaplen: int, records: list[tuple[int, bytes]]) -> bytes:
    """A classic pcap: (captured length as claimed, bytes) per record."""
    out = struct.pack(order + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1)
    for i, (caplen, data) in enumerate(records):
        out += struct.pack(order + "IIII", 1_700_000_000 + i, 0, caplen, max(caplen, len(data))) + data
    return out


def _block(kind: int, body: bytes, length: int | None = None) -> bytes:
    body += bytes(-len(body) % 4)
    size = len(body) + 12 if length is None else length
    return struct.pack("<II", kind, size) + body + struct.pack("<I", size)


def _hostile_captures(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    """Captures whose headers claim what cannot be: absurd snapshot and captured lengths, pcapng
    blocks of length zero or of zeros, interfaces never described, zeros where blocks should be."""
    run.mkdir()
    frame = bytes(range(64))
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb = _block(1, struct.pack("<HHI", 1, 0, 0xFFFFFFFF))
    epb = _block(6, struct.pack("<IIIII", 0, 0, 0, len(frame), len(frame)) + frame)
    files = {
        "snaplen.pcap": _capture("<", 0xFFFFFFFF, [(2**31, frame)]),
        "snaplen-be.pcap": _capture(">", 0xFFFFFFFF, [(len(frame), frame), (2**32 - 1, frame)]),
        "caplen-past-end.pcap": _capture("<", 65535, [(len(frame), frame), (len(frame) * 1000, frame)]),
        "zero-records.pcap": _capture("<", 65535, [(0, b"")] * rng.choice([1, 1000])),
        "zero-length-block.pcapng": shb + idb + _block(6, b"", length=0) + epb,
        "zero-blocks.pcapng": shb + idb + bytes(rng.choice([12, 4096, 1 << 20])) + epb,
        "zeros-after.pcapng": shb + idb + epb * 3 + bytes(rng.choice([4, 4096])),
        "only-header.pcapng": shb,
        "no-interface.pcapng": shb + epb * 2,
        "huge-block.pcapng": shb + idb + struct.pack("<II", 6, 0xFFFFFFF0) + bytes(64),
        "many-sections.pcapng": (shb + idb + epb) * rng.choice([10, 5000]),
        "caplen-over-block.pcapng": shb + idb + _block(6, struct.pack("<IIIII", 0, 0, 0, 2**31, 2**31) + frame),
    }
    for name, data in files.items():
        (run / name).write_bytes(data if rng.random() < 0.7 else fuzz.mutate(rng, data, [], 0))


KINETO = FIXTURES / "profiler-straggler" / "node01" / "rank-0.pt.trace.json"
# What a Kineto trace's values become in a damaged or hand-edited file: wrong types, numbers out of
# range, nesting where a value should be.
KINETO_VALUES = [
    None, "", "x" * 10_000, -1, 0, 2**64, -(2**63) - 1, 1e308, -1e308, "1e309", [], {}, [[[[[[]]]]]], True,
    {"nested": {"deeper": [1, 2, {"ts": "now"}]}}, "NaN", "\x1b[2J", "<script>TLFUZZ()</script>",
]  # fmt: skip


def _mangled(rng: random.Random, value: object, depth: int = 0) -> object:
    """`value` with some of its keys' values replaced, dropped or doubled, at every depth."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            roll = rng.random()
            if roll < 0.03:
                continue
            out[key] = rng.choice(KINETO_VALUES) if roll < 0.08 else _mangled(rng, item, depth + 1)
        return out
    if isinstance(value, list):
        items = [_mangled(rng, item, depth + 1) for item in value if rng.random() > 0.02]
        if items and rng.random() < 0.1:
            items.insert(rng.randrange(len(items)), rng.choice(KINETO_VALUES))
        return items
    return value


def _hostile_kineto(run: Path, rng: random.Random, some: Callable[[], bytes]) -> None:
    """A profiler trace mangled as JSON (wrong types, out-of-range numbers, keys gone), and as text."""
    run.mkdir()
    trace = json.loads(KINETO.read_text())
    for i in range(rng.randint(1, 3)):
        mangled = _mangled(rng, trace)
        if rng.random() < 0.3:
            mangled = {"traceEvents": rng.choice([{}, "events", [[[]]] * 1000, None, mangled])}  # type: ignore[index]
        text = json.dumps(mangled, allow_nan=rng.random() < 0.5).encode()
        if rng.random() < 0.3:
            text = fuzz.mutate(rng, text, [], 1 << 16)
        (run / f"rank-{i}.pt.trace.json").write_bytes(text)
    deep = b'{"traceEvents": ' + b"[" * rng.choice([1000, 100_000]) + b"]" * rng.choice([0, 1000])
    (run / "rank-9.pt.trace.json").write_bytes(deep)


# A hostile folder: name -> (run folder to create, rng, a mutated file's bytes on each call).
HOSTILE: dict[str, Callable[[Path, random.Random, Callable[[], bytes]], None]] = {
    "deep_nesting": _hostile_deep,
    "symlink_loops_and_devices": _hostile_links,
    "zip_bomb_many_members": _hostile_zip_members,
    "zip_and_gzip_bomb_ratio": _hostile_zip_ratio,
    "nested_archives": _hostile_nested,
    "fifos": _hostile_fifo,
    "unreadable": _hostile_unreadable,
    "huge_sparse_files": _hostile_sparse,
    "many_small_files": _hostile_many,
    "hostile_file_names": _hostile_names,
    "archive_links_and_escapes": _hostile_archive_members,
    "hostile_config": _hostile_config,
    "sparse_tails": _hostile_sparse_tails,
    "captures": _hostile_captures,
    "kineto_mangled": _hostile_kineto,
}


# ---------------------------------------------------------------------------------- the cases


def corpus_sources(root: Path, limit: int) -> list[tuple[str, bytes]]:
    """Every file under `root` but its READMEs and SOURCES lists, cut like the fixtures."""
    return [
        (f"corpus/{p.relative_to(root).as_posix()}", fuzz.trimmed(p.read_bytes(), limit))
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("README.md", "SOURCES.md")
    ]


@dataclass
class Case:
    number: int
    kind: str  # file, folder, archive or hostile:<name>
    sources: list[str] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)


def build(case: Case, seed: int, pool: list[tuple[str, bytes]], huge: int, where: Path) -> Path:
    """Write case `case.number` of the campaign under `where`, filling in `case` as it goes (so a
    case that fails half made still says what it was); returns the target to analyse. The first
    cases take the sources in a shuffled order, so every source is mutated once the campaign has
    run as many cases as there are sources."""
    number = case.number
    rng = random.Random(seed * 1_000_003 + number)
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)

    def mutated(first: bool = False) -> tuple[str, bytes]:
        source = pool[order[number % len(pool)]] if first else rng.choice(pool)
        name, data, done = fuzz.case_named(rng, pool, huge, source)
        case.sources.append(source[0])
        case.mutations += done
        return name, data

    run = where / "run"
    roll = rng.random()
    if roll < 0.2:
        name = rng.choice(list(HOSTILE))
        case.kind = f"hostile:{name}"
        HOSTILE[name](run, rng, lambda: mutated()[1])
        return run
    name, data = mutated(first=True)
    if roll < 0.45:
        case.kind = "archive" if case.mutations[-1].startswith("archive") else "file"
        run.mkdir()
        (run / name).write_bytes(data)
        return run / name
    case.kind = "folder"
    files = [(name, data)] + [mutated() for _ in range(rng.randint(0, 3))]
    for i, (name, data) in enumerate(files):
        (run / f"node{i:02d}").mkdir(parents=True)
        (run / f"node{i:02d}" / name).write_bytes(data)
    return run


# ---------------------------------------------------------------------------------- running one


@dataclass
class Result:
    case: Case
    code: str  # which code ran it (`code_version`)
    status: int | None  # exit status, or -N for a signal
    cpu: float  # seconds, user + system, of the command and its children
    wall: float
    rss_mb: float  # peak, the command and its children together
    failures: list[str]
    detail: str  # the first failure's evidence


def _session(leader: int) -> list[int]:
    """The pids of the processes in `leader`'s session (the command and what it started)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == leader:  # field 6 of stat: the session id
                found.append(int(entry.name))
    return found


def _usage(pids: list[int], leader: int) -> tuple[float, int]:
    """CPU seconds and resident bytes of `pids` now (the leader's count includes its reaped children)."""
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/statm", "rb") as fh:
                rss += int(fh.read().split()[1]) * PAGE
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if pid == leader else 0)) / TICKS
    return cpu, rss


def _nice() -> None:
    os.nice(19 - os.nice(0))


def code_version() -> str:
    """A digest of the package's and grammars' files as they are now: the command runs the working
    tree, which may change while a campaign runs (commits that change no code keep it)."""
    digest = hashlib.sha1()
    for folder in ("src", "grammars"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def attempt(number: int, pool: list[tuple[str, bytes]], where: Path, args: argparse.Namespace) -> Result:
    """Case `number` made under `where` and run; an OSError of the campaign's own (making the
    case's files, writing its outputs) is that case's harness error, and the campaign goes on."""
    case = Case(number, "")
    try:
        where.mkdir()
        return run_case(case, build(case, args.seed, pool, args.huge, where), where, args)
    except OSError as exc:
        return Result(case, code_version(), None, 0.0, 0.0, 0.0, ["harness"], f"{FAILURES['harness']}: {exc!r}")


def run_case(case: Case, target: Path, where: Path, args: argparse.Namespace) -> Result:
    code = code_version()
    out = where / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "tracelens", "analyze", str(target), "-o", str(out / "report.html"),
        "--json", str(out / "report.json"), "--markdown", str(out / "report.md"),
    ]  # fmt: skip
    # The command's working folders in the case's own folder: a run killed for its time or memory
    # leaves them behind, and they go with the case.
    (where / "tmp").mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(where / "cache"), "TMPDIR": str(where / "tmp"), "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    started = time.monotonic()
    with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
        child = subprocess.Popen(
            command, cwd=where, env=env, stdout=stdout, stderr=stderr, start_new_session=True, preexec_fn=_nice
        )
        peak, cpu, killed = 0, 0.0, ""
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            cpu, rss = _usage(_session(child.pid), child.pid)
            peak = max(peak, rss)
            wall = time.monotonic() - started
            if cpu > args.cpu_seconds:
                killed = "cpu_timeout"
            elif rss > args.kill_rss_gb * (1 << 30):
                killed = "rss"
            elif wall > args.wall_seconds:
                killed = "hang"
            if killed:
                os.killpg(child.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.2)
        child.returncode = os.waitstatus_to_exitcode(status)
    with_children = usage.ru_utime + usage.ru_stime
    cpu = max(cpu, with_children)
    peak = max(peak, usage.ru_maxrss * 1024)
    wall = time.monotonic() - started
    for leftover in _session(child.pid):  # a worker the command left behind is ended with it
        os.kill(leftover, signal.SIGKILL)
    failures, detail = check(child.returncode, killed, peak, out, args)
    return Result(case, code, child.returncode, round(cpu, 2), round(wall, 2), round(peak / MIB, 1), failures, detail)


TRACEBACK = re.compile(r"Traceback \(most recent call last\)|PanicException")
PANIC = re.compile(r"panicked at|RUST_BACKTRACE")
# What the inputs' markup would be if an output let it through: tags in HTML (escaped text shows as
# text), and tags, links and images in Markdown outside its code blocks (a tag whose `<`, or a link
# whose `]`, is backslash-escaped, after an even number of backslashes, is text).
HTML_MARKUP = re.compile(rf"<script>{fuzz.MARKER}|<img src=x onerror={fuzz.MARKER}")
MARKDOWN_MARKUP = re.compile(rf"(?<!\\)(?:\\\\)*(?:{HTML_MARKUP.pattern}|\]\(javascript:)|!\[{fuzz.MARKER}\]\(")


def outside_fences(markdown: str) -> str:
    """The Markdown's text outside fenced code blocks (a fence closes on a line of its own backticks)."""
    kept, fence = [], ""
    for line in markdown.splitlines():
        if fence:
            fence = "" if line.strip() == fence else fence
        elif line.startswith("```"):
            fence = line[: len(line) - len(line.lstrip("`"))]
        else:
            kept.append(line)
    return "\n".join(kept)


def check(status: int, killed: str, peak: int, out: Path, args: argparse.Namespace) -> tuple[list[str], str]:
    """What failed in a finished case, and the first failure's evidence."""
    found: dict[str, str] = {}
    terminal = (out / "stdout").read_bytes().decode("utf-8", "replace") + (out / "stderr").read_bytes().decode(
        "utf-8", "replace"
    )
    if killed:
        found[killed] = f"killed: {FAILURES[killed]}"
    elif status < 0 or status >= 128:
        found["signal"] = f"status {status}"
    elif status == 3:
        found["exit3"] = terminal[-2000:]
    elif status == 4:
        found["exit4"] = terminal[-2000:]
    elif status not in (0, 1, 2):
        found["exit_status"] = f"status {status}"
    if match := TRACEBACK.search(terminal):
        found["traceback"] = terminal[max(0, match.start() - 200) : match.start() + 3000]
    if match := PANIC.search(terminal):
        found["panic"] = terminal[max(0, match.start() - 300) : match.start() + 1000]
    if peak > args.max_rss_gb * (1 << 30):
        found.setdefault("rss", f"peak {peak / MIB:,.0f} MiB")
    if control := fuzz.TERMINAL_CONTROL.search(terminal):
        found["terminal_escape"] = repr(terminal[max(0, control.start() - 100) : control.end() + 100])
    if (out / "report.html").exists():
        html = (out / "report.html").read_text(errors="replace")
        if problems := fuzz.html_problems(html)[:3] + [m[0] for m in HTML_MARKUP.finditer(html)][:3]:
            found["html"] = "; ".join(problems)
    markdown = (out / "report.md").read_text(errors="replace") if (out / "report.md").exists() else ""
    if match := MARKDOWN_MARKUP.search(outside_fences(markdown)):
        found["markdown"] = match[0]
    if status in (0, 1, 4) and not killed:
        try:
            report = json.loads((out / "report.json").read_text(), parse_constant=_refuse)
        except (OSError, ValueError) as exc:
            found["json"] = str(exc)[:300]
        else:
            for row in report.get("inputs", []):
                if row["lines"] != row["parsed"] + row["ignored"] + row["unrecognized"]:
                    found.setdefault("accounting", f"{row['file']}: {row}"[:500])
                if lost := [e for e in row["errors"] if "could not be read:" in e]:
                    found.setdefault("file_lost", f"{row['file']}: {lost[0]}"[:500])
    return sorted(found), next(iter(found.values()), "")[:4000]


def _refuse(constant: str) -> float:
    raise ValueError(f"{constant} in the JSON")


# ---------------------------------------------------------------------------------- the campaign


def summary(records: list[dict], seed: int) -> dict:
    """The campaign's numbers from its results (`results.jsonl`'s records)."""
    by_mutation = collections.Counter(m for r in records for m in r["case"]["mutations"])
    by_kind = collections.Counter(r["case"]["kind"] for r in records)
    failing = collections.Counter(f for r in records for f in r["failures"])
    slowest = max(records, key=lambda r: r["cpu"], default=None)
    biggest = max(records, key=lambda r: r["rss_mb"], default=None)
    return {
        "code": dict(collections.Counter(r["code"] for r in records).most_common()),
        "seed": seed,
        "cases": len(records),
        "failed_cases": sum(1 for r in records if r["failures"]),
        "failures_by_class": dict(failing.most_common()),
        "cases_by_kind": dict(by_kind.most_common()),
        "mutations_applied": dict(by_mutation.most_common()),
        "exit_statuses": dict(collections.Counter(str(r["status"]) for r in records).most_common()),
        "slowest_case": slowest,
        "biggest_case": biggest,
        "cpu_seconds": {
            "total": round(sum(r["cpu"] for r in records), 1),
            "median": _median([r["cpu"] for r in records]),
        },
        "wall_seconds_median": _median([r["wall"] for r in records]),
    }


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--first", type=int, default=0, help="number of the first case (to go on with a campaign)")
    parser.add_argument("--only", type=int, help="run this case alone and keep its folder")
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--jobs", type=int, default=2, help="cases run side by side")
    parser.add_argument("--minutes", type=float, default=0, help="start no case after this many minutes (0: no limit)")
    parser.add_argument("--corpus", type=Path, help="a folder of real logs to mutate too, read in place")
    parser.add_argument("--out", type=Path, help="the campaign's folder (default: a new temporary folder)")
    parser.add_argument("--source-bytes", type=int, default=64 << 10, help="each source cut to about this (0: whole)")
    parser.add_argument("--huge", type=int, default=4 << 20, help="bytes of the huge-line mutation")
    parser.add_argument("--cpu-seconds", type=float, default=60)
    parser.add_argument("--wall-seconds", type=float, default=900)
    parser.add_argument("--max-rss-gb", type=float, default=2.0)
    parser.add_argument("--kill-rss-gb", type=float, default=4.0)
    parser.add_argument("--summary", action="store_true", help="only print the summary of the results in --out")
    parser.add_argument("--code", help="with --summary: only the cases this code ran (see summary.json's `code`)")
    args = parser.parse_args(argv)

    if args.summary:
        records = [json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines()]
        print(json.dumps(summary([r for r in records if args.code in (None, r["code"])], args.seed), indent=1))
        return 0
    # Bytecode as an installed package has it: where the environment forbids writing it
    # (PYTHONDONTWRITEBYTECODE), every case would compile the package's sources again.
    compileall.compile_dir(REPO / "src", quiet=1)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"tracelens-fuzz-{args.seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    pool = fuzz.sources(args.source_bytes)
    if args.corpus:
        pool += corpus_sources(args.corpus, args.source_bytes)
    numbers = [args.only] if args.only is not None else list(range(args.first, args.first + args.cases))
    print(f"{len(numbers)} cases from {len(pool)} sources into {out}", flush=True)
    results: list[Result] = []
    started, lock = time.monotonic(), threading.Lock()

    def one(number: int) -> None:
        if args.minutes and time.monotonic() - started > args.minutes * 60:
            return
        where = out / f"case-{number:06d}"
        if where.exists():
            _remove(where)
        result = attempt(number, pool, where, args)
        case = result.case
        with lock:
            results.append(result)
            with open(out / "results.jsonl", "a") as fh:
                fh.write(json.dumps(asdict(result)) + "\n")
            if result.failures:
                print(f"case {number} {case.kind} {case.mutations} {case.sources}: {result.failures}", flush=True)
            if len(results) % 50 == 0:
                print(f"{len(results)} cases, {sum(1 for r in results if r.failures)} failed", flush=True)
                (out / "summary.json").write_text(json.dumps(summary([asdict(r) for r in results], args.seed)) + "\n")
        if not result.failures and args.only is None:
            _remove(where)
        else:
            for made in ("run", "tmp"):  # the inputs are made again from the seed and the number; the outputs stay
                _remove(where / made)

    with ThreadPoolExecutor(args.jobs) as pool_of:
        list(pool_of.map(one, numbers))
    numbers_out = summary([asdict(r) for r in results], args.seed)
    (out / "summary.json").write_text(json.dumps(numbers_out, indent=1) + "\n")
    print(json.dumps(numbers_out, indent=1))
    return 1 if numbers_out["failed_cases"] else 0


def _remove(path: Path) -> None:
    """Remove a case's folder, whatever its modes (unreadable folders) and links."""
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            full = os.path.join(root, d)
            if not os.path.islink(full):
                os.chmod(full, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
