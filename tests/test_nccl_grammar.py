"""grammars/nccl.lark on single message bodies, and the vectorized kinds proven equal to it.

Synthetic bodies follow the formats in docs/formats/nccl.md; the corpus part reads ../shared/corpus/nccl when present.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import polars as pl
import pytest

from tracelens.ingest.nccl.log import FIELDS, VECTOR_KINDS, match_vector, parse_body, split_records
from tracelens.ingest.text.lines import read_chunks

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "nccl"
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"real-log corpus not found at {CORPUS}")

# Bodies of the regex-matched kinds in every era's wording.
VECTOR_BODIES = [
    "Ring 00 : 1 -> 0 via NET/IB/0",  # 2.3
    "Ring 00 : 0[0] -> 1[1] via P2P/IPC",  # 2.3 P2P
    "Ring 01 : 1[1] -> 2[2] via direct shared memory",
    "Ring 00 : 1 -> 0 [receive] via NET/Socket/0",  # 2.4
    "Ring 02 : 5[89000] -> 6[8e000] via P2P/direct pointer",  # 2.5
    "Channel 00 : 1[1e0] -> 0[1e0] [receive] via NET/Socket/0",  # 2.7
    "Channel 03 : 5[99000] -> 4[93000] via P2P/IPC/read",
    "Channel 02/1 : 3[3] -> 11[3] [send] via NET/IB/1(9)/GDRDMA/Shared",  # PXN, 2.12+
    "Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA",
    "Channel 04/0 : 2[2] -> 3[3] via P2P/CUMEM/read",
    "Channel 05/0 : 2[2] -> 3[3] via P2P/indirect/1[1]",
    "Channel 21 : 5[5] -> 4[4] via SHM/direct/direct",
    "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA(PCI)",  # 2.26+
    "Channel 01/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",  # plugin name with a space
    "Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL",  # 2.20.3+
    "Coll 01 : 3 [receive] via COLLNET/SHARP/1/GDRDMA",
    "CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA",
    "comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE",
    "comm 0x7f6df005a260 rank 2 nranks 8 cudaDev 2 nvmlDev 2 - Init COMPLETE",  # 2.4
    "comm 0x55d2a0 rank 1 nranks 2 cudaDev 1 busId 1e0 - Init COMPLETE",  # 2.5-2.15
    "ncclCommSplit comm 0x5602 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1a parent 0x5601 color 7 key 0 - Init START",
    "ncclCommSplit comm 0x5602 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 parent 0x5601 splitCount 1 color 7 key 0 commId 0x1a - Init START",
    "[Rank 0] ncclCommInitRankConfig comm 0x5603 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0x2b - Init START",
    "comm 0x5604 rank 3 nranks 8 cudaDev 3 busId 5d000 - Destroy COMPLETE",
    "comm 0x5605 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 5d000 - Abort COMPLETE",
    "comm 0x6426550 rank 2 nRanks 8 nNodes 4 localRanks 2 localRank 0 MNNVL 0",
    "transport/net.cc:1298 -> 6",
    "misc/socket.cc:504 -> 2 (Operation now in progress)",
    "group.cc:65 -> 2 [Async thread]",
    "proxy.cc:874 -> 6 [Progress Thread]",
    "external/nccl_archive/src/init.cc:878 -> 2",
    "Init timings - ncclCommInitRank: rank 3 nranks 16 total 2.17 (kernels 0.25, alloc 1.56, bootstrap 0.08, allgathers 0.01, topo 0.06, graphs 0.00, connections 0.20, rest 0.01)",
    "New proxy send connection 3 from local rank 1, transport 2",
    "Connected to proxy localRank 1 -> connection 0x7f1130004f40",
    "AllGather: opCount 2a sendbuff 0x7f00 recvbuff 0x7f10 count 1048576 datatype 9 op 0 root 0 comm 0x55 [nranks=512] stream 0xe2",
    "Ring 00 : 428 -> 238 -> 764",
    "Ring 03 : -1 -> 7 -> 0",
    "Tree 1 : 429 -> 238 -> 789/825/-1",
    "Trees [0] 789/825/-1->238->429 [1] 825/-1/-1->238->429",
    "Trees [0] 1/-1/-1->0->-1|-1->0->1/-1/-1 [1] 1/-1/-1->0->-1|-1->0->1/-1/-1",  # 2.12+ split trees
    "Channel 00/04 :    0   1",
    "Channel 00/02 : 0 1 2 3",
    "Ring 00 : 0 1 2 3",  # 2.4-2.6
    "threadThresholds 8/8/64 | 8192/8/64 | 512 | 512",
    "Connected all rings, use ring PXN 0 GDR 1",
    "Connected all rings",
    "Connected all trees",
    "Connected NVLS tree",
    "Connected collnet + chain",
    "Bootstrap timings total 0.012345 (create 0.000021, send 0.000213, recv 0.010987, ring 0.000876, delay 0.000000)",
]  # fmt: skip


def _vector_vs_lark(bodies: list[str]) -> list[str]:
    """Every disagreement between the regex-matched kinds and the grammar, as readable lines."""
    kinds, fields = match_vector(pl.Series(bodies), skip_fields=frozenset())
    by_row = {r.pop("row"): r for r in fields.to_dicts()}
    vector_kinds = {k for k, _, _ in VECTOR_KINDS}
    problems = []
    for row, (body, kind) in enumerate(zip(bodies, kinds.to_list())):
        lark_kind, lark_fields = parse_body(body)
        if kind is None:
            if lark_kind in vector_kinds:
                problems.append(f"regex missed {lark_kind}: {body}")
            continue
        regex_fields = {k: v for k, v in by_row.get(row, {}).items() if v is not None}
        lark_fields = {k: v for k, v in lark_fields.items() if k in FIELDS}
        if kind != lark_kind or regex_fields != lark_fields:
            problems.append(f"{body}\n  regex {kind} {regex_fields}\n  lark  {lark_kind} {lark_fields}")
    return problems


def test_vector_kinds_equal_grammar_on_synthetic_bodies():
    assert _vector_vs_lark(VECTOR_BODIES) == []
    kinds, _ = match_vector(pl.Series(VECTOR_BODIES))
    assert kinds.null_count() == 0, "every synthetic body should take the fast path"


def _redrawn(body: str, rand: random.Random) -> str:
    """The body with each number that stands alone (not in `P2P`, `0x55`, `9b000`) drawn anew."""
    return re.sub(r"(?<![\w.])\d+(?![\w.])", lambda m: str(rand.randrange(10 ** rand.randint(1, 5))), body)


def _mutated(body: str, rand: random.Random) -> str:
    """The body with a blank dropped, doubled or made a tab, a character deleted or a word repeated:
    bodies a kind's regex must still tell apart as lark does."""
    at = rand.randrange(len(body))
    return rand.choice(
        [
            lambda: body[:at] + body[at + 1 :],
            lambda: body[:at] + " " + body[at:],
            lambda: body.replace(" ", "", 1),
            lambda: body.replace(" ", "\t", 1),
            lambda: body[:at] + body[at:].split(" ", 1)[0] + " " + body[at:],
        ]
    )()


def test_vector_kinds_equal_grammar_on_random_bodies():
    rand = random.Random(7)
    redrawn = [_redrawn(body, rand) for _ in range(20) for body in VECTOR_BODIES]
    assert _vector_vs_lark(redrawn) == []
    kinds, _ = match_vector(pl.Series(redrawn))
    assert kinds.null_count() == 0, "every body with other numbers should take the fast path"
    mutated = [_mutated(body, rand) for body in redrawn]
    kinds, _ = match_vector(pl.Series(mutated), skip_fields=frozenset())
    wrong = [(b, k) for b, k in zip(mutated, kinds.to_list()) if k is not None and k != parse_body(b)[0]]
    assert wrong == []


@needs_corpus
def test_vector_kinds_equal_grammar_on_corpus():
    bodies = []
    for path in sorted(CORPUS.glob("*.log")):
        for chunk in read_chunks(path):
            bodies += split_records(chunk)["msg"].to_list()
    assert len(bodies) > 600
    assert _vector_vs_lark(bodies) == []


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        ("NCCL version 2.8.3+cudaCUDA_MAJOR.CUDA_MINOR", "version", {"nccl_version": "2.8.3"}),  # a TensorFlow build
        ("NCCL_IB_TIMEOUT set by environment to 18.", "env_set", {"env_name": "NCCL_IB_TIMEOUT", "env_value": "18."}),
        ("NCCL_IB_HCA set to mlx5_0,mlx5_1", "env_set", {"env_name": "NCCL_IB_HCA", "env_value": "mlx5_0,mlx5_1"}),
        ("Using internal Network IB", "network", {"net_name": "IB"}),  # 2.3
        ("Using network IBext_v8", "network", {"net_name": "IBext_v8"}),
        ("Bootstrap : Using ib0.0065:10.1.32.3<0>", "bootstrap_ifs", {"ifaddr": ["ib0.0065:10.1.32.3<0>"]}),
        ("NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'", "gdr_hca", {"gdr_state": "Disabled", "gdr_name": "mlx5_0"}),
        ("GPU Direct RDMA Enabled for GPU 1b000 / HCA 0 (distance 4 <= 4), read 1", "gdr_gpu", {"gdr_state": "Enabled", "gdr_name": "1b000"}),
        ("NET/Plugin: Loaded net plugin NCCL RDMA Plugin (v4)", "plugin", {"plugin_name": "NCCL RDMA Plugin (v4)"}),
        ("Call to ibv_modify_qp failed with error Network is unreachable", "verbs_call", {"verb": "ibv_modify_qp"}),
        ("NET/IB : Got async event : port error", "ib_async_event", {}),
        ("NET/IB : mlx5_0:1 async fatal event: port error(10)", "ib_async_event", {}),
        ("Bootstrap Root : rank 3 of 8 ranks has already checked in", "bootstrap_error", {}),
        ("Mismatched NCCL version detected : rank 0 version 22304 rank 5 version 22105", "version_mismatch", {}),
        ("[Service thread] Error encountered progressing operation=Connect, res=3, closing connection", "proxy_error", {}),
        ("HINT: In many cases this error occurs when the NCCL_IB_TIMEOUT is set too short.", "ib_hint", {}),
        ("this is not an NCCL message", "unknown", {}),
    ],
)  # fmt: skip
def test_kinds_and_fields(body, kind, expected):
    got_kind, fields = parse_body(body)
    assert got_kind == kind
    assert {k: fields.get(k) for k in expected} == expected
