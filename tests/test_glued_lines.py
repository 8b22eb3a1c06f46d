"""Glued lines and free text: both halves of a glued line read, and lark run per shape, never per line.

A glued line is a line printed without its newline and another process's line after it on the same
line (ingest/text/glued.py); free text is a record's body that no grammar kind can start with. The logs
here are generated: launcher lines of eight ranks with such lines among them, their words drawn anew
for every line.
"""

from __future__ import annotations

import random
from pathlib import Path

import lark
import polars as pl
import pytest

from tracelens.ingest import IngestResult, InputFile, textlog
from tracelens.ingest.deepspeed.grammar import parse_body
from tracelens.ingest.deepspeed.log import DeepSpeedParser
from tracelens.ingest.nccl import log as nccl_log
from tracelens.ingest.nccl.log import _grammar, parse_recipes, split_records
from tracelens.ingest.text.glued import line_starts
from tracelens.ingest.text.shapes import ShapeParser, masked

STAMP = "[2026-11-30 08:00:01,250] [INFO] [logging.py:96:log_dist] "


def _word(rand: random.Random) -> str:
    return "".join(rand.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))


def launcher_log(lines: int, seed: int) -> list[str]:
    """Every fifth line glued onto an unfinished WARN of another rank (at NCCL's head, a torchrun
    tag or DeepSpeed's stamp), every seventh free text in an NCCL or a DeepSpeed record."""
    rand = random.Random(seed)
    out = []
    for n in range(lines):
        rank, peer = rand.randrange(8), rand.randrange(8)
        head = f"node{rank // 4}:{1000 + rank}:{2000 + rank} [{rank % 4}] NCCL"
        line = rand.choice(
            [
                f"{head} INFO Channel {n % 4:02d}/0 : {rank}[{rank % 4}] -> {peer}[{peer % 4}] via NET/IB/{rank % 2}",
                f"{head} INFO Ring {n % 4:02d} : {peer} -> {rank} -> {(rank + 1) % 8}",
                f"{head} INFO Bootstrap : Using eth0:10.0.{rank}.{n % 250}<0>",
                f"{STAMP}[Rank {rank}] step={n}, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
            ]
        )
        if n % 5 == 0:
            tag = rand.choice(["", f"[default{peer % 4}]:", "2026-11-30 08:00:01 "])
            warn = rand.choice(["NET/IB : Got async event : port error", "Cuda failure 'out of memory'"])
            line = f"node{peer // 4}:{1000 + peer}:{2000 + peer} [{peer % 4}] NCCL WARN {warn}{tag}{line}"
        elif n % 7 == 0:
            words = f"{_word(rand)} shard {rand.randrange(99)} of {_word(rand)} ready in {rand.random():.3f} s"
            line = f"{head} INFO {words}" if n % 2 else f"{STAMP}{words}"
        out.append(line)
    return out


def _ingest(tmp_path: Path, lines: list[str], name: str) -> tuple[list[str], IngestResult]:
    """The file's ingest result, and the text of every lark parse it ran (one per call)."""
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    parsed: list[str] = []
    parse = lark.Lark.parse

    def counted(self, text, *args, **kwargs):
        parsed.append(text)
        return parse(self, text, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lark.Lark, "parse", counted)
        result = textlog.ingest(InputFile(path=path, name=name, format="log", size=path.stat().st_size))
    return parsed, result


def test_lark_parses_are_bounded_by_shapes_not_lines(tmp_path):
    # the grammar's caches are per process: the first log teaches every shape, the others add none
    _ingest(tmp_path, launcher_log(2_000, seed=1), "warm.log")
    small, _ = _ingest(tmp_path, launcher_log(2_000, seed=2), "small.log")
    large, result = _ingest(tmp_path, launcher_log(20_000, seed=3), "large.log")
    assert small == large == []
    assert result.account.lines == 20_000


def test_first_log_parses_once_per_shape(tmp_path, monkeypatch):
    # the first log a process reads: no shape known yet, whichever tests this process ran before
    first = ShapeParser(parse_recipes)
    monkeypatch.setattr(nccl_log, "_shapes", lambda: first)
    lines = launcher_log(3_000, seed=4)
    parsed, _ = _ingest(tmp_path, lines, "first.log")
    bodies = split_records(pl.DataFrame({"text": lines}))["msg"]
    # free text (no kind starts so) is no shape the grammar learns
    shapes = masked(bodies.filter(bodies.str.contains(_grammar().starts))).n_unique()
    # lark sees a shape's representative body and its probes (shapes.ShapeParser.learn),
    # whatever its bodies; each is tried against every kind its first word may start
    assert len(set(parsed)) <= 4 * shapes < 40


def test_both_halves_of_a_glued_line_are_read(tmp_path):
    line = (
        "node1:1005:2005 [1] NCCL WARN Cuda failure 'out of memory'"
        "[default2]:node0:1002:2002 [2] NCCL INFO Ring 01 : 6 -> 2 -> 3"
    )
    _, result = _ingest(tmp_path, [line], "one.log")
    events = result.tables["nccl_events"].lazy().collect()
    assert events.select("line", "pid", "cuda_dev", "level", "kind", "message").rows() == [
        (1, 1005, 1, "WARN", "cuda_failure", "Cuda failure 'out of memory'"),
        (1, 1002, 2, "INFO", "graph_ring", "Ring 01 : 6 -> 2 -> 3"),
    ]
    assert (result.account.lines, result.account.parsed) == (1, 1)


def test_deepspeed_record_before_a_glued_nccl_line_is_read(tmp_path):
    step = f"{STAMP}[Rank 3] step=7, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]"
    line = step + "node0:1:2 [0] NCCL INFO Ring 00 : 1 -> 0 -> 2"
    _, result = _ingest(tmp_path, [line], "ds.log")
    steps = result.tables["steps"].lazy().collect()
    assert steps.select("rank", "step").rows() == [(3, 7)]
    events = result.tables["nccl_events"].lazy().collect()
    assert events["kind"].to_list() == ["graph_ring"]


def test_free_text_is_counted_unrecognised_without_a_parse(tmp_path):
    lines = [
        "node0:1:2 [0] NCCL INFO qwertyu shard 3 of asdfghj ready in 0.5 s",
        f"{STAMP}zxcvbnm shard 4 of poiuytr ready in 0.25 s",
        "node0:1:2 [0] NCCL INFO Ring 00 : 1 -> 0 -> 2",
    ]
    _ingest(tmp_path, lines[2:], "warm.log")  # the ring line's shape
    parsed, result = _ingest(tmp_path, lines, "free.log")
    assert parsed == []
    account = result.account
    assert (account.lines, account.parsed, account.unrecognized) == (3, 1, 2)


@pytest.mark.parametrize(
    ("text", "at"),
    [
        # a line start glued inside a word: where the host name begins is not knowable, it takes the word
        ("NET/IB : Got async event : port errornode3:1:2 [0] NCCL INFO x", "errornode3:1:2"),
        ("Cuda failure 'out of memory'[default1]:node3:1:2 [0] NCCL INFO x", "[default1]:"),
        ("Cuda failure 2026-11-30 08:00:01 node3:1:2 [0] NCCL INFO x", "2026-11-30"),
        (
            "Reducing dynamic loss scale fr[2025-01-02 15:47:32,712] [INFO] [fused_optimizer.py:393:_update_scale] R",
            "[2025",
        ),
        ("progress 43%[rank3]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog", "[rank3]"),
    ],
)
def test_line_start_found_in_a_glued_body(text, at):
    assert line_starts(pl.Series([text])).item() == text.encode().index(at.encode())


@pytest.mark.parametrize(
    "text",
    [
        "Bootstrap : Using eth0:10.0.0.1<0>",
        "Channel 00/0 : 0[0] -> 1[1] via NET/IB/0",
        "[2025-01-02 15:47:32,712] (ActorName=x, pid=4)",  # a shipper's stamp alone starts no record
        "NCCL INFO without a head",
    ],
)
def test_no_line_start_in_an_ordinary_body(text):
    assert line_starts(pl.Series([text])).item() is None


def test_statuses_of_glued_and_free_lines(tmp_path):
    lines = launcher_log(500, seed=5)
    _, result = _ingest(tmp_path, lines, "statuses.log")
    free = sum(1 for n in range(500) if n % 5 and n % 7 == 0)
    assert result.account.unrecognized == free
    assert result.account.parsed == 500 - free


NOISE_LINES = [
    "Reducing dynamic loss scale from {big} to {small}",
    "Increasing dynamic loss scale from {small} to {big}",
    "Grad overflow on iteration {n}",
    "No Grad overflow for {n} iterations",
    "[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: {big}, reducing to {small}",
    "Process {n} exits successfully.",
]


def _noise(lines: int, seed: int) -> list[str]:
    rand = random.Random(seed)
    return [
        STAMP
        + rand.choice(NOISE_LINES).format(
            big=float(2 ** rand.randrange(8, 17)),
            small=float(2 ** rand.randrange(1, 8)),
            n=rand.randrange(99999),
            r=rand.randrange(64),
        )
        for _ in range(lines)
    ]


def test_loss_scale_lines_cost_a_parse_per_shape(tmp_path):
    parsed, result = _ingest(tmp_path, _noise(3_000, seed=1), "noise.log")
    assert len(parsed) <= 2 * len(NOISE_LINES) * 4  # a few number shapes per line shape (`256.0`, `1024.0`)
    assert (result.account.lines, result.account.ignored) == (3_000, 3_000)


def test_noise_by_shape_equals_the_grammar_per_body():
    bodies = [line.removeprefix(STAMP) for line in _noise(300, seed=2)]
    bodies += ["Grad overflow on iteration 12x", "Reducing dynamic loss scale from 0x10 to 8.0", "Process 12 exits"]
    parser = DeepSpeedParser(InputFile(path=Path("x.log"), name="x.log", format="log"))
    recs = pl.DataFrame(
        {"kind": [("chatter" if b.startswith("Process") else "overflow") for b in bodies], "body": bodies}
    )
    fast = parser._parse_cold(recs).to_list()
    assert fast == [parse_body(kind, body) is not None for kind, body in recs.iter_rows()]
    assert not all(fast) and any(fast)
