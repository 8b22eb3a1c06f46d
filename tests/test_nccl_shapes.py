"""The shape path (ingest/text/shapes.py) gives the same kind and fields as lark on the raw body.

Bodies: every NCCL body of the corpus and of the committed fixtures, hand-written bodies of the
kinds neither has, and each of them again with its numbers and hex ids replaced by random ones
(same shape, other values: the case the shape path exists for).
"""

from __future__ import annotations

import random
import re
import time

import polars as pl
import pytest

from tests.helpers import CORPUS, FIXTURES
from tracelens.ingest import InputFile, textlog
from tracelens.ingest.nccl.log import CANDIDATE_MARKS, FIELDS, _grammar, parse_body, parse_recipes, split_records
from tracelens.ingest.text.lines import read_chunks
from tracelens.ingest.text.shapes import MARK, ShapeParser, masked

# Kinds that neither the corpus nor the fixtures print (formats: docs/formats/nccl.md).
EXTRA_BODIES = [
    "NET/IB : mlx5_ib0:1 communicator encountered a fatal error (detected in ncclIbTest)",
    "NVML failure 999 'Unknown Error'",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ncclCommInitRank(0x7ffd3c9e1a40,8,0x5566aa10,3)",
    "Bootstrap Root : rank 3 of 8 ranks has already checked in",
    "Bootstrap Root : mismatch in rank count from procs 16 : 8",
    "Bootstrap timings total 0.012345 (create 0.000021, send 0.000213, recv 0.010987, ring 0.000876, delay 0.000000)",
    "comm 0x5604 rank 3 nranks 8 cudaDev 3 busId 5d000 - Destroy COMPLETE",
    "Cuda failure 'out of memory'",
    "GPU Direct RDMA Enabled for GPU 1b000 / HCA 0 (distance 4 <= 4), read 1",
    "GPU Direct RDMA Disabled for GPU 8f000 / HCA 3 (distance 5 > 4)",
    "Error : ring 3 does not loop back to start (5 != 0)",
    "NET/IB : Got async event : port error",
    "NET/IB : mlx5_0:1 async fatal event: port error(10)",
    "NET/IB : Unable to open device mlx5_3",
    "HINT: In many cases this error occurs when the NCCL_IB_TIMEOUT is set too short.",
    "NET/IB : No IP interface found.",
    "ProcessGroupNCCL initialization options: size: 16, global rank: 3, TIMEOUT(ms): 1800000",
    "Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1533, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=1800000) ran for 1800472 "
    "milliseconds before timing out.",
    "Mismatched NCCL version detected : rank 0 version 22304 rank 5 version 22105",
    "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>",
    "Bootstrap : Using eth0:10.0.3.17<0>",
    "Trees [0] 12/-1/-1->5->3 [1] 3/-1/-1->5->2",
    "NCCL_IB_TIMEOUT set by environment to 22.",
    "NET/IB : Using interface ib0 for sideband communication",
    "NET : Using interface eth1:192.168.4.20<0>",
    "Tree 1 : 12 -> 13 -> 14/-1/-1",
    "Ring 02 : 7 -> 0 -> 1",
    "NET/IB: [2] mlx5_2:1/RoCE",
    "comm 0x7f3a50 rank 6 nranks 8",
    "=== System : maxBw 24.0 totalBw 48.0 ===",
    "Pattern 4, crossNic 0, nChannels 2, bw 12.000000/12.000000, type SYS/PIX, sameChannels 1",
    "NET/Socket : 2 interfaces found",
    "CUDA Dev 0, IP Interfaces : lo(SOC) eth0(PXB)",
    "NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge",
    "NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
    "NET/OFI No NIC info for dev 3",
    "NET/OFI No NIC info for dev 3. Supplying default values for NIC properties.",
    "Initialized NET plugin Libfabric",
    "Socket creation failed : Address family not supported by protocol",
    "[Service thread] Accept failed Success",
    "socketFinalizeAccept: wrong magic 5454502f312e3120 != 3c9e0b7ac70a7b6c",
    "mpirun -np 16 -H node01:8,node02:8 -x NCCL_IB_DISABLE=1 python train.py",
    "[PG ID 0 PG GUID 0(default_pg) Rank 3] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making "
    "progress in monitoring enqueued collectives.",
    "NET/Socket : Using 4 threads and 2 sockets per thread",
    "[Proxy Service] Device 3 CPU core 42",
    "NET/IB : No device found.",
    "Failed to open libibverbs.so[.1]",
    "SHARP rank 3/16 initialization failed",
    "ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1",
    (
        "Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, data may be corrupted."
    ),
    (
        "[Rank 5] Work WorkNCCL(SeqNum=77, OpType=BROADCAST, "
        "Timeout(ms)=600000) timed out in blocking wait (NCCL_BLOCKING_WAIT=1)."
    ),
    (
        "[Rank 1] Exception (either an error or timeout) detected by watchdog at work: 1533, last enqueued NCCL "
        "work: 1534, last completed NCCL work: 1532."
    ),
    (
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
        "unhandled system error, NCCL version 2.10.3"
    ),
    "socketProgressOpt: Call to recv from 10.0.0.7<53214> failed : Connection reset by peer",
    "[Service thread] Error encountered progressing operation=Connect, res=3, closing connection",
    "Call to ibv_modify_qp failed with error Network is unreachable",
    "NET/IB : Got completion from peer 10.0.0.2<43241> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
    (
        "AllReduce: opCount 1a sendbuff 0x7f00 recvbuff 0x7f10 count "
        "4194304 datatype 9 op 0 root 0 comm 0x55 [nranks=16] stream 0xe2"
    ),
    "Received and initiated operation=Init res=0",
]


def _bodies_of(paths) -> list[str]:
    bodies: list[str] = []
    for path in paths:
        for chunk in read_chunks(path):
            bodies += split_records(chunk)["msg"].to_list()
    return bodies


@pytest.fixture(scope="module")
def fixture_bodies() -> list[str]:
    """The NCCL bodies of every committed fixture, read once through the real splitter. A file without
    any of the splitter's candidate marks (nor a quoted `Last error:`) has no record: not read."""
    marks = [m.encode() for m in CANDIDATE_MARKS] + [b"Last error:"]
    logs = [p for p in sorted(FIXTURES.rglob("*")) if p.is_file() and p.suffix not in (".pcap", ".json", ".md", ".gz")]
    return [b for b in _bodies_of([p for p in logs if any(m in p.read_bytes() for m in marks)]) if b]


def _revalue(body: str, rand: random.Random) -> str:
    """The same shape with other values: each digit run and hex id replaced by a random one."""

    def token(m: re.Match) -> str:
        if m.group().startswith("0x"):
            return "0x" + "".join(rand.choice("0123456789abcdef") for _ in range(rand.randint(1, 14)))
        return str(rand.randint(0, 10 ** rand.randint(1, 6)))

    return re.sub(r"0x[0-9a-fA-F]+|\d+", token, body)


def _disagreements(bodies: list[str]) -> list[str]:
    """Shape path vs lark on each body (the first body of a shape is its representative)."""
    shapes = ShapeParser(parse_recipes)
    kinds, fields = shapes.classify(pl.Series(bodies, dtype=pl.String))
    by_row = {r.pop("row"): {k: v for k, v in r.items() if v is not None} for r in fields.to_dicts()}
    problems = []
    for row, (body, kind) in enumerate(zip(bodies, kinds.to_list())):
        if kind is None:  # no recipes: the caller asks lark, which is trivially equal
            continue
        lark_kind, lark_fields = parse_body(body)
        lark_fields = {k: v for k, v in lark_fields.items() if k in FIELDS}
        if kind != lark_kind or by_row.get(row, {}) != lark_fields:
            problems.append(f"{body}\n  shape    {kind} {by_row.get(row)}\n  lark     {lark_kind} {lark_fields}")
    return problems


def _check(bodies: list[str], copies: int = 3) -> None:
    """Each distinct body (a body's shape result and its lark result are the same wherever it
    repeats: the fixtures' 6,500 bodies are 1,100 distinct) and `copies` of it with other values."""
    bodies = list(dict.fromkeys(bodies))
    rand = random.Random(12)
    revalued = [_revalue(b, rand) for _ in range(copies) for b in bodies]
    assert _disagreements(bodies + revalued) == []


def test_shapes_equal_grammar_on_fixtures_and_every_kind(fixture_bodies):
    bodies = fixture_bodies + EXTRA_BODIES
    assert set(_grammar().kinds) - {parse_body(b)[0] for b in bodies} == set()
    _check(bodies)


def test_most_bodies_take_the_shape_path(fixture_bodies):
    bodies = fixture_bodies + EXTRA_BODIES
    shapes = ShapeParser(parse_recipes)
    kinds, _ = shapes.classify(pl.Series(bodies))
    assert kinds.null_count() <= len(bodies) // 50, "bodies without recipes fall back to lark one by one"
    assert len(shapes.shapes) < len(set(bodies)) // 2, "a shape stands for many bodies"


def test_bodies_without_recipes_are_left_to_the_grammar():
    shapes = ShapeParser(parse_recipes)
    kinds, fields = shapes.classify(pl.Series([f"Bootstrap : Using eth0:10.0.0.1<0> {MARK}", "Connected all rings"]))
    assert kinds.to_list() == [None, "connected"]
    assert fields.height == 0


def test_a_body_of_records_glued_by_the_thousand_is_left_to_the_grammar(tmp_path):
    """A MiB line of one NCCL record repeated without newlines: past the glued-line cuts, its body held
    thousands of tokens, and gathering a field of a shape one expression per token took 1.4 GB and
    6 s. Such a body is the grammar's, as it would read it anyway."""
    record = "node01:98:220 [1] NCCL INFO NCCL_IB_DISABLE set by environment to 1."
    body = "NCCL_IB_DISABLE set by environment to 1." + record * 16_000
    shapes = ShapeParser(parse_recipes)
    kinds, fields = shapes.classify(pl.Series([body, "NCCL_IB_DISABLE set by environment to 1."]))
    assert kinds.to_list()[0] is None and fields["row"].to_list() == [1] and len(shapes.shapes) == 1
    path = tmp_path / "rank0.log"
    path.write_text(f"{record}\n{record * 16_000}\n{record}\n")
    started = time.process_time()
    account = textlog.ingest(InputFile(path, path.name, "log", size=path.stat().st_size)).account
    assert (account.lines, account.parsed, account.unrecognized) == (3, 3, 0)
    assert time.process_time() - started < 5


def test_shape_values_come_back_by_position():
    shapes = ShapeParser(parse_recipes)
    bodies = [f"Bootstrap : Using ib{i}:10.{i}.0.{i * 3}<0>" for i in range(200)]
    kinds, fields = shapes.classify(pl.Series(bodies))
    assert len(shapes.shapes) == 1
    assert set(kinds.to_list()) == {"bootstrap_ifs"}
    assert fields.sort("row")["ifaddr"].to_list()[57] == ["ib57:10.57.0.171<0>"]


@pytest.mark.skipif(not (CORPUS / "nccl").is_dir(), reason=f"real-log corpus not found at {CORPUS / 'nccl'}")
def test_shapes_equal_grammar_on_corpus():
    bodies = _bodies_of(sorted((CORPUS / "nccl").glob("*.log")))
    assert len(bodies) > 600
    _check(bodies)


def test_masking_in_passes_finds_the_tokens_one_regex_finds():
    """masked() masks hex tokens, then digit runs: the same shapes as the one `(0x)hex|digits` scan,
    also where a digit run runs into `0x` or a hex token into digits."""
    tricky = [
        "10x5",
        "0xab0x5",
        "50x",
        "a0x1f b",
        "0x",
        "x0x0",
        "7 0xFFg 12",
        "00x1",
        "1\ue001 2",
        "Channel 00/0 : 3[1b000] -> 4[29000]",
    ]
    rand = random.Random(5)
    alphabet = "0x1a9 fF:/[]-"
    bodies = tricky + ["".join(rand.choice(alphabet) for _ in range(rand.randint(0, 16))) for _ in range(3000)]
    one_scan = [re.sub(r"(0x)[0-9a-fA-F]+|\d+", lambda m: (m.group(1) or "") + MARK, b) for b in bodies]
    assert masked(pl.Series(bodies)).to_list() == one_scan
