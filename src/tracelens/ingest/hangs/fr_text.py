"""What PyTorch's Flight Recorder analyzer (`torchfrtrace`, `fr_trace.py`) prints, pasted instead of dumps.

The default report has one block per collective that did not match on every rank
(torch/distributed/flight_recorder/components/utils.py, EntryState.log):

    Not all ranks joining collective, sequence number: 6     (2.6+, also `collective: sequence number: 6`;
                                                             2.5: `... collective 6 at entry 4`)
    Input/output mismatch in the collective sequence number: 6
    Collective sequence number: 6 has errors
    internal record id: 29
    group info: 1:undefined
    collective: gloo:all_reduce
    missing ranks: {2}
    input sizes: [[1]] / output sizes: [[1]] / world size: 4 / expected ranks: {0, 1, 2, 3}
    collective state: scheduled
    error msg: Culprit rank 2; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: ...
    collective stack trace:
     all_reduce at /path/distributed_c10d.py:3252

Each block becomes fr_entries rows for the ranks that joined (the expected ranks less the
missing and culprit ones, with the block's op, sizes and state), a row for each culprit
with what it issued when the error message says it, and an fr_groups row with the members.
A missing rank gets no row: that absence is what the hang rules read. `We cannot decide what's
wrong with this collective entry because we missed FR dumps from ranks ({2}) ...` gives rank 2 a
row with status `no dump` and nothing else.

`-j` prints each rank's entries side by side under `Rank N` headers (tabulate columns;
`all_reduce(input_sizes=[[4]], state=scheduled)`, with FR_TRACE_VERBOSE_OUTPUT=1 also
`collective_seq_id | p2p_seq_id=5`, `pg_name=...`): one row per cell, in each rank's order.
"""

from __future__ import annotations

import ast
import re

import polars as pl

from tracelens.ingest import IngestResult, InputFile, input_format
from tracelens.ingest.hangs.flight_recorder import op_name
from tracelens.ingest.text.lines import read_chunks

_BLOCK = re.compile(
    r"^(?:Not all ranks joining collective(?:[,:] sequence number:)? (?P<a>\d+)(?: at entry (?P<entry>\d+))?"
    r"|Input/output mismatch in the collective sequence number: (?P<b>\d+)"
    r"|Collective sequence number: (?P<c>\d+) has errors"
    r"|Collective (?P<d>\d+) at entry (?P<entry2>\d+) has errors)\s*$"
)
_FIELD = re.compile(
    r"^(?P<key>internal record id|group info|collective|missing ranks|input sizes|output sizes|world size|"
    r"expected ranks|collective state|error msg|total input numel|total output numel|collective stack trace)"
    r":\s?(?P<value>.*)$"
)
_CULPRIT = re.compile(
    r"Culprit rank (?P<rank>\d+); Error type: (?P<kind>\w+)(?:, (?P<detail>[^;]*?))?(?=, Culprit rank|$)"
)
_FOUND = re.compile(
    r"found (?:collective type: '(?P<op>[^']*)'|input sizes: '(?P<inp>[^']*)'"
    r"|output sizes: '(?P<out>[^']*)'|state: '(?P<state>[^']*)')"
)
_HEADER = re.compile(r"^\s*Rank \d+(?:\s+Rank \d+)*\s*$")
# 2.6+: an entry it cannot match because some ranks' dumps are missing (a killed or crashed rank)
_NO_DUMP = re.compile(r"missed FR dumps from ranks \((?P<ranks>[^)]*)\)")
_CELL = re.compile(r"^(?P<op>\w+)\((?P<args>.*)\)$")
_ARG = re.compile(
    r"(?P<key>collective_seq_id \| p2p_seq_id|input_sizes|output_sizes|input_dtypes|output_dtypes|state|pg_name|"
    r"pg_description|timestamp_created)=(?P<value>\[.*?\]\]?|[^,]*)(?=, |$)"
)


# What may stand before the analyzer's own text: a launcher tag (`[rank0]:`), or the root
# logger's `INFO:Flight Recorder:` when the script that ran it had logging configured.
_PREFIX = re.compile(r"^(?:\[[\w\s,.:-]*\]:\s?|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):Flight Recorder:)")


def sniff(head: bytes) -> bool:
    if b"ollective" not in head and b"missed FR dumps" not in head and b"input_sizes=" not in head:
        return False  # no block head, no missed-dump line, no listing: skip the line-by-line look
    lines = [
        _PREFIX.sub("", line, count=1) for line in head[:65536].decode("utf-8", errors="replace").splitlines()[:2000]
    ]
    blocks = any(_BLOCK.match(line.strip()) or _NO_DUMP.search(line) for line in lines)
    listing = any(re.match(r"\s*Rank 0\s+Rank 1", line) for line in lines) and any(
        "input_sizes=" in line for line in lines
    )
    return blocks or listing


def _frame(text: str) -> dict | None:
    """`name at file:line`, a frame of a collective's stack trace (split, not a regex: a regex with
    two open-ended parts costs the square of a long line's length)."""
    name, at, rest = text.strip().partition(" at ")
    file, colon, line = rest.rpartition(":")
    if not (name and at and file and line.isascii() and line.isdigit()):
        return None
    return {"name": name, "filename": file, "line": int(line)}


def _set(value: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", value)]


def _literal(value: str | None):
    if not value:
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None


class _Reader:
    def __init__(self, source: InputFile) -> None:
        self.source = source
        self.entries: list[dict] = []
        self.groups: list[dict] = []
        self.parsed = 0

    def block(self, start: int, seq: int, fields: dict[str, str], frames: list[dict]) -> None:
        pg = fields.get("group info", "")
        pg_name, _, pg_desc = pg.partition(":")
        backend, op = op_name(fields.get("collective"))
        expected = _set(fields.get("expected ranks", ""))
        if not expected and fields.get("world size", "").isdigit():
            expected = list(range(int(fields["world size"])))
        if len(expected) == 1 and fields.get("expected ranks", "").strip().isdigit():
            expected = list(range(expected[0]))  # 2.5 printed the count, not the set
        missing = set(_set(fields.get("missing ranks", "")))
        culprits = {int(m.group("rank")): m for m in _CULPRIT.finditer(fields.get("error msg", ""))}
        base = {
            "file": self.source.name, "line": start, "host": None, "ts": None, "ts_quality": "none",
            "record_id": int(fields["internal record id"]) if fields.get("internal record id", "").isdigit() else None,
            "pg_id": int(pg_name) if pg_name.isdigit() else None,
            "pg_name": pg_name or None, "pg_desc": pg_desc or None,
            "collective_seq_id": seq, "profiling_name": fields.get("collective"), "backend": backend, "op": op,
            "is_p2p": op in ("send", "recv"),
            "state": fields.get("collective state"), "status": fields.get("collective state"),
            "input_sizes": fields.get("input sizes"), "output_sizes": fields.get("output sizes"),
            "frames": frames, "encoding": "analyzer text",
        }  # fmt: skip
        for rank in expected:
            if rank in missing:
                continue
            row = dict(base, rank=rank)
            if rank in culprits:
                found = {
                    k: v
                    for m in _FOUND.finditer(culprits[rank].group("detail") or "")
                    for k, v in m.groupdict().items()
                    if v
                }
                row.update(
                    op=found.get("op", op),
                    input_sizes=found.get("inp", row["input_sizes"]),
                    output_sizes=found.get("out", row["output_sizes"]),
                    state=found.get("state", row["state"]),
                    status=found.get("state", row["status"]),
                    frames=[],
                )  # the culprit's own call site is not printed
            self.entries.append(row)
        if expected:
            self.groups.append(
                {
                    "file": self.source.name,
                    "line": start,
                    "host": None,
                    "ts_quality": "none",
                    "rank": None,
                    "pg_id": base["pg_id"],
                    "pg_name": base["pg_name"],
                    "pg_desc": base["pg_desc"],
                    "ranks": expected,
                }
            )

    def no_dump(self, line: int, ranks: list[int]) -> None:
        """The analyzer could not match an entry: these ranks left no dump. A row per rank with
        status `no dump` and nothing else: what the hang rules read as a rank that stopped."""
        for rank in ranks:
            self.entries.append(
                {
                    "file": self.source.name,
                    "line": line,
                    "host": None,
                    "ts_quality": "none",
                    "rank": rank,
                    "status": "no dump",
                    "frames": [],
                    "encoding": "analyzer text",
                }
            )

    def listing(self, start: int, header: str, rows: list[tuple[int, str]], positions: list[tuple[int, int]]) -> None:
        ranks = [int(r) for r in re.findall(r"Rank (\d+)", header)]
        for order, (line, text) in enumerate(rows):
            for rank, (lo, hi) in zip(ranks, positions):
                cell = text[lo:hi].strip()
                m = _CELL.match(cell)
                if not m:
                    continue
                args = {a.group("key"): a.group("value").strip() for a in _ARG.finditer(m.group("args"))}
                seq = args.get("collective_seq_id | p2p_seq_id")
                self.entries.append({
                    "file": self.source.name, "line": line, "host": None, "ts_quality": "none", "rank": rank,
                    "record_id": order, "op": m.group("op"), "is_p2p": m.group("op") in ("send", "recv"),
                    "collective_seq_id": int(seq) if seq and seq.isdigit() else None,
                    "pg_name": args.get("pg_name"), "pg_desc": args.get("pg_description"),
                    "pg_id": (int(args["pg_name"])
                              if args.get("pg_name", "").isdigit() and len(args["pg_name"]) < 10 else None),
                    "input_sizes": args.get("input_sizes"), "output_sizes": args.get("output_sizes"),
                    "input_dtypes": args.get("input_dtypes"), "output_dtypes": args.get("output_dtypes"),
                    "state": args.get("state"), "status": args.get("state"),
                    "frames": [], "encoding": "analyzer listing",
                })  # fmt: skip


@input_format("fr_analyzer", priority=6, sniff=sniff)
def ingest(source: InputFile) -> IngestResult:
    lines = [(int(n), _PREFIX.sub("", t, count=1)) for chunk in read_chunks(source.path) for n, t in chunk.iter_rows()]
    reader = _Reader(source)
    result = IngestResult()
    i, parsed = 0, set()
    while i < len(lines):
        number, text = lines[i]
        stripped = text.strip()
        if m := _BLOCK.match(stripped):
            seq = int(next(g for g in (m.group("a"), m.group("b"), m.group("c"), m.group("d")) if g))
            fields, frames, j = {}, [], i + 1
            in_trace = False
            while j < len(lines) and lines[j][1].strip() and not _BLOCK.match(lines[j][1].strip()):
                body = lines[j][1]
                if (f := _FIELD.match(body.strip())) and not in_trace:
                    fields[f.group("key")] = f.group("value").strip()
                    in_trace = f.group("key") == "collective stack trace"
                elif in_trace and (fr := _frame(body)):
                    frames.append(fr)
                elif f := _FIELD.match(body.strip()):
                    fields[f.group("key")] = f.group("value").strip()
                else:
                    j += 1
                    continue
                parsed.add(j)
                j += 1
            parsed.add(i)
            reader.block(number, seq, fields, frames)
            i = j
            continue
        if m := _NO_DUMP.search(text):
            reader.no_dump(number, _set(m.group("ranks")))
            parsed.add(i)
            i += 1
            continue
        if (
            _HEADER.match(text)
            and i + 1 < len(lines)
            and set(lines[i + 1][1].strip()) <= {"-", " "}
            and lines[i + 1][1].strip()
        ):
            positions = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[i + 1][1])]
            positions = [
                (lo, positions[k + 1][0] if k + 1 < len(positions) else 1 << 30) for k, (lo, _) in enumerate(positions)
            ]
            j = i + 2
            while j < len(lines) and "(" in lines[j][1]:
                j += 1
            reader.listing(number, text, lines[i + 2 : j], positions)
            parsed.update(range(i, j))
            i = j
            continue
        i += 1
    result.account.lines = len(lines)
    result.account.parsed = len(parsed)
    unread = [(n, t) for i, (n, t) in enumerate(lines) if i not in parsed]
    blank = sum(1 for _, t in unread if not t.strip())
    result.account.ignored = blank
    result.account.unrecognized = len(unread) - blank
    result.account.add_samples([(n, t) for n, t in unread if t.strip()])
    frame_type = pl.List(pl.Struct({"name": pl.String, "filename": pl.String, "line": pl.Int64}))
    if reader.entries:
        result.add(
            "fr_entries",
            pl.DataFrame(reader.entries, schema_overrides={"frames": frame_type}, infer_schema_length=None),
        )
    if reader.groups:
        result.add(
            "fr_groups",
            pl.DataFrame(reader.groups, schema_overrides={"ranks": pl.List(pl.Int64)}, infer_schema_length=None),
        )
    return result
