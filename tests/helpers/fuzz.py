"""A seeded mutation fuzzer over the fixtures and synthetic lines of every format.

Each case is one input file: a fixture file or a block of synthetic lines, mutated by one or
more of `MUTATIONS`: byte flips, truncation, duplicated and spliced lines, out-of-range numbers
and dates, huge lines, NUL bytes and runs of them, wrong encodings and invalid UTF-8, terminal
control sequences and markup; some cases are archives of such files, themselves mutated or with
a member's data corrupted. The CI test (tests/test_fuzz.py) and the longer campaign
(tests/fuzz_campaign.py) draw their cases from here. `check_run` holds the properties every run must keep.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import struct
import tarfile
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

from rich.console import Console

from tests.helpers import FIXTURES
from tracelens.report.terminal import print_summary

# Synthetic lines of every text format, the forms people paste included.
SYNTHETIC = {
    "nccl.log": """NCCL version 2.18.3+cuda12.2
node01:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
node01:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
node01:1234:1234 [0] NCCL INFO Using network IB
node01:1234:1234 [0] NCCL INFO comm 0x55d5c8a0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1a2b - Init START
node01:1234:1234 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
node01:1234:1236 [0] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 0 'enp1s0f0'

[2026-09-01 16:19:24] node01:1234:1240 [0] transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2 hca mlx5_0
node01:1234:1240 [0] NCCL INFO transport/net.cc:1298 -> 6
node01:1234:1240 [0] NCCL INFO proxy.cc:874 -> 6 [Progress Thread]
node01:1234:1234 [0] include/socket.h:360 WARN Call to connect failed : Connection timed out
[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG 3 Rank 5] Process group watchdog thread terminated with exception: [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
> node02:77:77 [1] transport/[net_ib.cc:1909](http://net_ib.cc:1909/) NCCL WARN NET/IB : mlx5_ib0:1 async fatal event on QP (0x7f69f01519a8): local access violation work queue error
RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, unhandled cuda error, NCCL version 2.10.3
""",
    "deepspeed.log": """[2024-05-01 10:00:00,123] [INFO] [launch.py:78:main] WORLD INFO DICT: {'node01': [0, 1]}
[2024-05-01 10:00:05,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]
[2024-05-01 10:00:05,001] [INFO] [timer.py:260:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=120.5, CurrSamplesPerSec=121.0, MemAllocated=4.1GB, MaxMemAllocated=6.2GB
[Rank 0] time (ms) | fwd: 120.50 | bwd: 240.10 | bwd_inner: 200.00 | bwd_allreduce: 40.10 | step: 30.00
[2024-05-01 10:00:06,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=11, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]
[Rank 0] time (ms) | fwd: 9999999999999999999999.0 | bwd: | step:
""",
    "perfquery.txt": """# Port extended counters: Lid 3 port 1 (CapMask: 0x5A00)
PortXmitData:....................18446744073709551615
PortRcvData:.....................1234567890
PortXmitPkts:....................9223372036854775808
SymbolErrorCounter:..............65535
LinkDownedCounter:...............255
""",
    "ibstat.txt": """CA 'mlx5_0'
	CA type: MT4123
	Number of ports: 1
	Port 1:
		State: Active
		Physical state: LinkUp
		Rate: 200
		Base lid: 3
		Link layer: InfiniBand
""",
    "ds_config.json": """{
  "train_micro_batch_size_per_gpu": 4,
  "zero_optimization": {"stage": 2, "overlap_comm": false, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}
}
""",
}


def hostile() -> list[tuple[str, bytes]]:
    """Inputs an outside fuzz campaign broke tracelens with, kept as seeds: numbers out of range,
    long lines for backtracking regexes and Earley, a run of NUL bytes, terminal escape sequences,
    a pcap record of 2^31 bytes, a zip of many members each under the member ratio cap."""
    step = "[2024-05-01 10:00:0{i},000] [INFO] [logging.py:96:log_dist] [Rank 0] step={i}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n"
    timers = "[Rank 0] time (ms) | fwd: {v} | bwd: 240.10 | bwd_inner: 200.00 | bwd_allreduce: 40.10 | step: 30.00\n"
    speed = (
        "[2024-05-01 10:00:0{i},001] [INFO] [timer.py:260:stop] epoch=0/micro_step={i}/global_step={i}, "
        "RunningAvgSamplesPerSec=120.5, CurrSamplesPerSec={v}, MemAllocated=4.1GB, MaxMemAllocated=6.2GB\n"
    )
    values = ["120.5", "1e309", "99999999999999999999", "121.0", "nan", "122.0"]
    deepspeed = "".join(step.format(i=i) + timers.format(v=v) + speed.format(i=i, v=v) for i, v in enumerate(values))
    warn = "node01:100:100 [0] misc/socket.cc:50 NCCL WARN Call to connect failed : {}Connection timed out\n"
    escapes = "".join(warn.format(seq) for seq in ["\x1b[2J\x1b[H", "\x1b[8m", "\x1b]0;owned\x07", "\x9b31m", "\u202e"])
    sysfs = "".join(f"/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data:{i}\n" for i in range(3))
    csv = "index, utilization.gpu [%], power.draw [W], clocks.current.sm [MHz]\n" + "0, 26 %, 83.92 W, 1320 MHz\n" * 3
    nccl = "node01:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n" * 80
    frame = " all_reduce at /venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3245"
    analyzer = (
        "Not all ranks joining collective: sequence number: 6\ngroup info: 0:default_pg\ncollective: nccl:all_reduce\n"
        "missing ranks: {1}\nexpected ranks: {0, 1}\ncollective state: scheduled\ncollective stack trace:\n"
    )
    pcap = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 0xFFFFFFFF, 1) + struct.pack("<IIII", 1, 0, 2**31, 2**31)
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(80):  # 80 MiB declared from about 80 KB: past the overall ratio cap
            zf.writestr(f"m{i:02}.log", bytes(1 << 20))
    return [
        ("hostile/ds-out-of-range.log", deepspeed.encode()),
        ("hostile/escapes.log", escapes.encode()),
        ("hostile/sysfs-long-line.txt", (sysfs + "x" * (32 << 10) + "\n" + sysfs).encode()),
        ("hostile/smi-long-line.csv", (csv + "0, 26 %, 83.92 W, 1320 MHz " * 1200 + "\n" + csv).encode()),
        ("hostile/nul-run.log", nccl.encode() + bytes(8 << 10) + b"\n" + nccl.encode()),
        ("hostile/analyzer-long-frame.txt", (analyzer + frame * 300 + "\n" + frame + "\n").encode()),
        ("hostile/snaplen.pcap", pcap + bytes(64)),
        ("hostile/many-members.zip", bomb.getvalue()),
    ]


BAD_NUMBERS = [
    "99999999999999999999", "18446744073709551616", "18446744073709551615", "9223372036854775808", "4294967295",
    "-1", "0", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "00000000000000000000000000000001",
    "1e309", "-1e309", "1e-400", "nan", "inf", "-0", "-9223372036854775809", "340282366920938463463374607431768211456",
]  # fmt: skip
BAD_DATES = ["9999-12-31", "0001-01-01", "2024-02-31", "2024-13-01", "1600-01-01", "2262-04-12", "1677-09-21"]
BAD_TIMES = ["24:00:00", "23:59:60", "99:99:99", "00:00:00"]
BAD_C10 = ["E0231 24:00:00", "E1301 10:00:00", "E0000 00:00:00", "E1231 23:59:60"]
# Terminal control sequences (clear screen, conceal, window title, hyperlink, C1 CSI, bidi override, bell,
# backspaces, a bare CR, reset, cursor up) and text that would be markup if a report let it through;
# MARKER is what `escapes_in` looks for unescaped in the outputs.
MARKER = "TLFUZZ"
ESCAPES = [
    "\x1b[2J\x1b[H", "\x1b[8m", "\x1b]0;owned\x07", "\x1b]8;;http://example.invalid/\x1b\\link\x1b]8;;\x1b\\",
    "\x9b31m", "\u202e", "\x07", "\x08\x08\x08", "\r", "\x1bc", "\x1b[1A\x1b[2K", "\x00",
]  # fmt: skip
INJECTIONS = [
    f"<script>{MARKER}()</script>", f"<img src=x onerror={MARKER}>", f"[{MARKER}](javascript:{MARKER})",
    "</pre></code></td></tr></table>", f"{{{{ {MARKER} }}}}", f"| {MARKER} |", f"![{MARKER}](http://example.invalid/x)",
]  # fmt: skip
INVALID_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\x80\x80",
    b"\xe2\x82",
    b"\xf4\x90\x80\x80",
    b"\xc3",
]


PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}


def sources(limit: int = 0) -> list[tuple[str, bytes]]:
    """Every fixture file (not READMEs or expectations) and every synthetic block; with a `limit`,
    each file cut to about that many bytes (see `trimmed`)."""
    found = [
        (p.relative_to(FIXTURES).as_posix(), p.read_bytes())
        for p in sorted(FIXTURES.rglob("*"))
        if p.is_file() and p.name not in ("README.md", "expected.json")
    ]
    if limit:
        found = [(name, trimmed(data, limit)) for name, data in found]
    return found + [(f"synthetic/{name}", text.encode()) for name, text in SYNTHETIC.items()] + hostile()


def trimmed(data: bytes, limit: int) -> bytes:
    """The head of a source, at most about `limit` bytes, still well formed: whole lines of a text,
    whole records of a classic pcap, a gzip stream of the trimmed content. A case costs what its
    input costs to analyse, and the mutations find their faults in the first lines as well
    (the lab captures alone are 5 MB each once decompressed)."""
    if data[:2] == b"\x1f\x8b":
        inner = gzip.decompress(data)
        return data if len(inner) <= limit else gzip.compress(trimmed(inner, limit), mtime=0)
    if len(data) <= limit or data[:4] == b"PK\x03\x04":  # a zip is cut nowhere: its directory is at its end
        return data
    if data[:4] in PCAP_MAGICS:
        end, order = 24, PCAP_MAGICS[data[:4]]
        while end + 16 <= len(data):
            (caplen,) = struct.unpack_from(order + "I", data, end + 8)
            if end + 16 + caplen > limit:
                break
            end += 16 + caplen
        return data[:end]
    cut = data.rfind(b"\n", 0, limit)
    return data[: cut + 1] if cut > 0 else data[:limit]


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _replace_random(rng: random.Random, data: bytes, pattern: bytes, choices: list[str]) -> bytes:
    hits = list(re.finditer(pattern, data))
    if not hits:
        return data
    for hit in rng.sample(hits, min(len(hits), rng.randint(1, 3))):
        data = data[: hit.start()] + rng.choice(choices).encode() + data[hit.end() :]
        break  # positions move after a replacement: one per call, calls repeat
    return data


def _insert(rng: random.Random, data: bytes, piece: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + piece + data[at:]


def _byte_flips(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def _duplicated_lines(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    i = rng.randrange(len(lines))
    return b"\n".join(lines[:i] + [lines[i]] * rng.randint(2, 50) + lines[i:])


def _spliced(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    mine, theirs = _lines(data), _lines(rng.choice(others))
    i, j = rng.randrange(len(mine) + 1), rng.randrange(len(theirs) + 1)
    return b"\n".join(mine[:i] + theirs[j : j + rng.randint(1, 40)] + mine[i:])


def _huge_line(rng: random.Random, data: bytes, huge: int) -> bytes:
    """A line of `huge` bytes (a neighbour repeated), with or without a newline after it."""
    lines = _lines(data)
    i = rng.randrange(len(lines) + 1)
    big = (lines[i - 1] if i else b"x") * (huge // max(len(lines[i - 1]) if i else 1, 1) + 1)
    return b"\n".join(lines[:i] + [big[:huge]] + (lines[i:] if rng.random() < 0.5 else []))


def _nul_bytes(rng: random.Random, data: bytes) -> bytes:
    """A few stray NULs, or one run of up to 64 KiB of them."""
    if rng.random() < 0.5:
        return _insert(rng, data, bytes(rng.randint(256, 64 << 10)))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        buf.insert(rng.randrange(len(buf) + 1), 0)
    return bytes(buf)


def _wrong_encoding(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", errors="replace")
    codec = rng.choice(["utf-16", "utf-16-le", "latin-1", "cp1252", "utf-8-sig"])
    return text.encode(codec, errors="replace")


def _into_lines(rng: random.Random, data: bytes, pieces: list[bytes]) -> bytes:
    """Each piece inserted into a random line, after a random prefix of it (so prefixes still parse)."""
    lines = _lines(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        at = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:at] + rng.choice(pieces) + lines[i][at:]
    return b"\n".join(lines)


def _line_ends(rng: random.Random, data: bytes) -> bytes:
    """CRLF line ends, stray CRs and tabs."""
    return data.replace(b"\n", rng.choice([b"\r\n", b"\r", b"\n\t", b"\n\n"]))


# One mutation of a file's bytes each: name -> (rng, data, other files' data, huge-line bytes) -> data.
MUTATIONS: dict[str, Callable[[random.Random, bytes, list[bytes], int], bytes]] = {
    "byte_flips": lambda rng, data, others, huge: _byte_flips(rng, data) if data else data,
    "truncated": lambda rng, data, others, huge: data[: rng.randrange(len(data))] if data else data,
    "duplicated_lines": lambda rng, data, others, huge: _duplicated_lines(rng, data),
    "spliced_lines": lambda rng, data, others, huge: _spliced(rng, data, others) if others else data,
    "number_out_of_range": lambda rng, data, others, huge: _replace_random(rng, data, rb"\d+(\.\d+)?", BAD_NUMBERS),
    "bad_date": lambda rng, data, others, huge: _replace_random(rng, data, rb"\d{4}-\d\d-\d\d", BAD_DATES),
    "bad_time": lambda rng, data, others, huge: _replace_random(rng, data, rb"\d\d:\d\d:\d\d", BAD_TIMES),
    "bad_c10_time": lambda rng, data, others, huge: _replace_random(rng, data, rb"[EWIF]\d{4} \d\d:\d\d:\d\d", BAD_C10),
    "huge_line": lambda rng, data, others, huge: _huge_line(rng, data, huge),
    "nul_bytes": lambda rng, data, others, huge: _nul_bytes(rng, data),
    "wrong_encoding": lambda rng, data, others, huge: _wrong_encoding(rng, data),
    "line_ends": lambda rng, data, others, huge: _line_ends(rng, data),
    "control_sequences": lambda rng, data, others, huge: _into_lines(
        rng, data, [e.encode() for e in ESCAPES + INJECTIONS]
    ),
    "invalid_utf8": lambda rng, data, others, huge: _into_lines(rng, data, INVALID_UTF8),
}


def mutate_named(rng: random.Random, data: bytes, others: list[bytes], huge: int) -> tuple[str, bytes]:
    """One random mutation of `data`, and its name."""
    name = rng.choice(list(MUTATIONS))
    return name, MUTATIONS[name](rng, data, others, huge)


def mutate(rng: random.Random, data: bytes, others: list[bytes], huge: int) -> bytes:
    """One random mutation of `data`."""
    return mutate_named(rng, data, others, huge)[1]


def corrupt_member(rng: random.Random, data: bytes) -> bytes:
    """An archive with bytes of its compressed data overwritten, past the first header and before a
    zip's central directory, so the archive still opens and a member fails as it is read."""
    body_end = data.rfind(b"PK\x01\x02") if data[:4] == b"PK\x03\x04" else len(data) - 8
    start = 30 if data[:4] == b"PK\x03\x04" else 10
    if body_end <= start + 1:
        return _byte_flips(rng, data) if data else data
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        buf[rng.randrange(start, body_end)] = rng.randrange(256)
    return bytes(buf)


def archive(rng: random.Random, members: list[tuple[str, bytes]]) -> tuple[str, bytes, str]:
    """The members as a zip, tar.gz or .gz, and what was done to its bytes: nothing, a mutation of
    the whole, a member's data corrupted, or a cut."""
    buf = io.BytesIO()
    form = rng.choice(["zip", "tgz", "gz"])
    if form == "zip":
        with zipfile.ZipFile(buf, "w", rng.choice([zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED, zipfile.ZIP_LZMA])) as zf:
            for name, data in members:
                zf.writestr(name, data)
        name = "bundle.zip"
    elif form == "tgz":
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), rng.choice([0, 1_700_000_000, 2**33 - 1])
                tar.addfile(info, io.BytesIO(data))
        name = "bundle.tar.gz"
    else:
        buf.write(gzip.compress(members[0][1]))
        name = "single.log.gz"
    data = buf.getvalue()
    how = rng.choice(["archive", "archive", "archive_mutated", "archive_member_corrupted", "archive_truncated"])
    if how == "archive_mutated":
        data = mutate(rng, data, [], 0)
    elif how == "archive_member_corrupted":
        data = corrupt_member(rng, data)
    elif how == "archive_truncated":
        data = data[: rng.randrange(1, len(data))]
    return name, data, how


def case_named(
    rng: random.Random, pool: list[tuple[str, bytes]], huge: int, source: tuple[str, bytes] | None = None
) -> tuple[str, bytes, list[str]]:
    """One fuzz input: a source file (`source`, else one of the pool) mutated one to three times, or
    an archive of it and others; and the names of the mutations made, in order."""
    others = [d for _, d in rng.sample(pool, min(5, len(pool)))]
    if rng.random() < 0.1:
        picked = [source or rng.choice(pool), *rng.sample(pool, rng.randint(0, 2))]
        done: list[str] = []
        members = []
        for i, (n, d) in enumerate(picked):
            how, d = mutate_named(rng, d, others, huge)
            done.append(how)
            members.append((f"m{i}/{Path(n).name}", d))
        name, data, how = archive(rng, members)
        return name, data, [*done, how]
    name, data = source or rng.choice(pool)
    done = []
    for _ in range(rng.randint(1, 3)):
        how, data = mutate_named(rng, data, others, huge)
        done.append(how)
    return Path(name).name, data, done


def case(rng: random.Random, pool: list[tuple[str, bytes]], huge: int) -> tuple[str, bytes]:
    """One fuzz input: a source file mutated one to three times, or an archive of some."""
    name, data, _ = case_named(rng, pool, huge)
    return name, data


class _TagBalance(HTMLParser):
    """Checks that every opened element is closed in order (void elements excepted)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def html_problems(html: str) -> list[str]:
    checker = _TagBalance()
    checker.feed(html)
    checker.close()
    return checker.problems + ([f"unclosed {checker.stack}"] if checker.stack else [])


def expected_lines(data: bytes) -> int:
    """Lines the shared line reader must account for in a text file."""
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def check_run(analysis, files: dict[str, bytes], html: str, as_json: dict) -> list[str]:
    """Every property a run must keep; returns what broke (empty when all holds)."""
    problems = []
    inputs = analysis.tables["inputs"]
    for row in inputs.iter_rows(named=True):
        for err in row["errors"] or []:
            if "could not be read:" in err:  # ingest_file's catch-all: an internal error lost the file
                problems.append(f"{row['file']}: whole file lost to an internal error: {err[:300]}")
        if row["format"] == "log" and row["file"] in files and not row["errors"]:
            want = expected_lines(files[row["file"]])
            if row["lines"] != want:
                problems.append(f"{row['file']}: {row['lines']} lines read, the file has {want}")
        if row["lines"] != row["parsed"] + row["ignored"] + row["unrecognized"]:
            problems.append(f"{row['file']}: lines not all accounted for: {row}")
    problems += [f"rule {f.rule.id} failed: {f.traceback}" for f in analysis.failed]
    problems += [f"HTML: {p}" for p in html_problems(html)[:3]]
    terminal = io.StringIO()
    print_summary(Console(file=terminal, width=120), analysis, [], verbose=True)
    if control := TERMINAL_CONTROL.search(terminal.getvalue()):
        problems.append(f"terminal: control character {control[0]!r} from the inputs")
    try:
        json.dumps(as_json, allow_nan=False, default=str)
    except ValueError as exc:
        problems.append(f"JSON: {exc}")
    return problems
