"""A seeded mutation fuzzer over the fixtures and synthetic lines of every format.

Each case is one input file: a fixture file or a block of synthetic lines, mutated by one or
more of: byte flips, truncation, duplicated and spliced lines, out-of-range numbers and
dates, huge values and lines, NUL bytes, wrong encodings; some cases are archives of such
files, themselves mutated. `check_run` holds the properties every run must keep.
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
]  # fmt: skip
BAD_DATES = ["9999-12-31", "0001-01-01", "2024-02-31", "2024-13-01", "1600-01-01", "2262-04-12", "1677-09-21"]
BAD_TIMES = ["24:00:00", "23:59:60", "99:99:99", "00:00:00"]
BAD_C10 = ["E0231 24:00:00", "E1301 10:00:00", "E0000 00:00:00", "E1231 23:59:60"]


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


def mutate(rng: random.Random, data: bytes, others: list[bytes], huge: int) -> bytes:
    """One random mutation of `data`."""
    kind = rng.randrange(12)
    if kind == 0 and data:  # byte flips
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if kind == 1 and data:  # truncation
        return data[: rng.randrange(len(data))]
    if kind == 2:  # duplicated lines
        lines = _lines(data)
        i = rng.randrange(len(lines))
        return b"\n".join(lines[:i] + [lines[i]] * rng.randint(2, 50) + lines[i:])
    if kind == 3 and others:  # spliced with another file's lines
        mine, theirs = _lines(data), _lines(rng.choice(others))
        i, j = rng.randrange(len(mine) + 1), rng.randrange(len(theirs) + 1)
        return b"\n".join(mine[:i] + theirs[j : j + rng.randint(1, 40)] + mine[i:])
    if kind == 4:
        return _replace_random(rng, data, rb"\d+", BAD_NUMBERS)
    if kind == 5:
        return _replace_random(rng, data, rb"\d{4}-\d\d-\d\d", BAD_DATES)
    if kind == 6:
        return _replace_random(rng, data, rb"\d\d:\d\d:\d\d", BAD_TIMES)
    if kind == 7:
        return _replace_random(rng, data, rb"[EWIF]\d{4} \d\d:\d\d:\d\d", BAD_C10)
    if kind == 8:  # a huge line, with or without a newline after it
        lines = _lines(data)
        i = rng.randrange(len(lines) + 1)
        big = (lines[i - 1] if i else b"x") * (huge // max(len(lines[i - 1]) if i else 1, 1) + 1)
        return b"\n".join(lines[:i] + [big[:huge]] + (lines[i:] if rng.random() < 0.5 else []))
    if kind == 9 and data:  # NUL bytes
        buf = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            buf.insert(rng.randrange(len(buf) + 1), 0)
        return bytes(buf)
    if kind == 10:  # wrong encodings
        text = data.decode("utf-8", errors="replace")
        codec = rng.choice(["utf-16", "utf-16-le", "latin-1", "cp1252", "utf-8-sig"])
        return text.encode(codec, errors="replace")
    # CRLF line ends, stray CRs and tabs
    return data.replace(b"\n", rng.choice([b"\r\n", b"\r", b"\n\t", b"\n\n"]))


def archive(rng: random.Random, members: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """The members as a zip, tar.gz or .gz, its bytes mutated half of the time."""
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
    if rng.random() < 0.5:
        data = mutate(rng, data, [], 0) if rng.random() < 0.5 else data[: rng.randrange(1, len(data))]
    return name, data


def case(rng: random.Random, pool: list[tuple[str, bytes]], huge: int) -> tuple[str, bytes]:
    """One fuzz input: a source file mutated one to three times, or an archive of some."""
    others = [d for _, d in rng.sample(pool, min(5, len(pool)))]
    if rng.random() < 0.1:
        picked = rng.sample(pool, rng.randint(1, 3))
        return archive(rng, [(f"m{i}/{Path(n).name}", mutate(rng, d, others, huge)) for i, (n, d) in enumerate(picked)])
    name, data = rng.choice(pool)
    for _ in range(rng.randint(1, 3)):
        data = mutate(rng, data, others, huge)
    return Path(name).name, data


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
