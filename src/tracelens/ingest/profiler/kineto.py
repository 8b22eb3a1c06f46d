"""PyTorch profiler traces: Kineto's Chrome-trace JSON (`*.pt.trace.json`, `rank-N.json`, gzipped or not).

A trace is one JSON object: `schemaVersion`, `deviceProperties`, `distributedInfo` (rank, world
size, backend, process groups, NCCL version), `traceEvents` (the spans), and after them
`traceName` and `baseTimeNanoseconds` (when present, every `ts` is microseconds after it; older
traces write epoch microseconds). Rows go to `trace_ranks` (one per file) and `trace_spans`
(one per kept span): every ProfilerStep#N, the CPU ops and user annotations at most
MAX_DEPTH deep on their thread (the step, its phases and their first ops: deeper ones are the
many small aten calls no rule reads), every collective call (`record_param_comms` with its
collective name, sizes, dtype, group and sequence number, joined with the `nccl:*`/`gloo:*` op
inside it), and every GPU kernel, memcpy and memset with its stream, each placed in the step
whose CPU span launched it (through the launch's correlation id).

Streaming: a trace can be gigabytes. The events array is read a chunk of whole events at a time,
cut at the last separator between events: `}`, `,`, `{` and then a quoted key and a colon, which
never occurs inside a JSON string (a quote there is escaped). DuckDB's JSON reader (in C++, outside
the GIL) reads each chunk as an array: the event's own fields, and only on the rows that read them
the args they need (ids on GPU spans and launches, a collective's on its call and its NCCL kernel).
A trace whose spans nest objects in arrays could still be cut wrongly, and its chunk then fails to
parse: such a chunk is read an event at a time with Python's parser, slower, the pieces of an event
cut wrongly joined again; so is a chunk with a damaged value DuckDB refuses (a time of the wrong
type, a string not UTF-8 or wrongly escaped), an event that does not parse lost alone. Only the kept spans'
columns stay in memory, their text as categories: memory follows the chunk and the kept rows, not
the file.

Rank: `distributedInfo.rank`, else a `rank-3` / `rank_3` / `rank3` in the file name, else in a
folder; else unknown (null), and the account says so. Host: the one the file's path names (the
run's per-host folders, as for every file beside it), else the trace's `host_name`; the trace's own
name is kept (`host_name`) and taken back where another source of the run names that machine.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import queue
import re
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracelens.ingest import IngestResult, InputFile, input_format
from tracelens.ingest.text.holes import skip_zeros
from tracelens.prose import count
from tracelens.tables import RunTables

MAX_DEPTH = 2  # CPU spans kept: depth 0 (ProfilerStep, top-level ops), 1 and 2 on their thread
CHUNK_BYTES = 8 << 20
PARSERS = max(1, min(4, os.cpu_count() or 1))  # chunks parsed at once
_HEAD_LIMIT = 64 << 20  # the `traceEvents` key must come within this much of the start
_EVENT_LIMIT = 64 << 20  # bytes of one event at most (a profiler event is a few hundred)

_SNIFF = re.compile(
    rb'^\s*\{\s*"(?:schemaVersion|deviceProperties|distributedInfo|traceEvents|record_shapes|displayTimeUnit)"\s*:'
)
_BOUNDARY = re.compile(rb'\}\s*,\s*(?=\{\s*"[A-Za-z_ ]{1,32}"\s*:)')
_KINETO_SEPARATOR = b"},\n  {"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)

# The args read: every event's ids and placement (integers) ...
SPAN_ARGS = {"correlation": "correlation", "stream": "stream", "device": "device", "bytes": "bytes"}
# ... and a collective's, for the few events that carry them: record_param_comms and NCCL kernels
COLLECTIVE_ARGS = {
    "Collective name": "collective",
    "In msg nelems": "in_nelems",
    "Out msg nelems": "out_nelems",
    "dtype": "dtype",
    "Group size": "group_size",
    "Process Group Name": "pg_name",
    "Process Group Description": "pg_desc",
    "Process Group Ranks": "pg_ranks",
    "Seq": "seq",
    "Src Rank": "src_rank",
    "Dst Rank": "dst_rank",
}
_COLLECTIVE_INTS = ("in_nelems", "out_nelems", "group_size", "seq", "src_rank", "dst_rank")
CPU_CATS = ("cpu_op", "user_annotation")
GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
# the kinds of event kept (`X` spans of these `cat`s), each read as its place in this tuple (`code`)
_CATS = (*CPU_CATS, *LAUNCH_CATS, *GPU_KINDS)
UNTIMED = 255  # the code of a kept kind of event whose time or length is no time (TIME_LIMIT_US)
ARG_KEYS = [*SPAN_ARGS, *COLLECTIVE_ARGS]
# the kept rows' fields, typed: the event's and its args' (a collective's read as JSON text first)
FLAT_SCHEMA = (
    {"code": pl.UInt8, "name": pl.String, "pid": pl.String, "tid": pl.String}
    | {"start_us": pl.Float64, "dur_us": pl.Float64}  # on the trace's clock (baseTimeNanoseconds added last)
    | dict.fromkeys(SPAN_ARGS.values(), pl.Int64)
    | {c: pl.Int64 if c in _COLLECTIVE_INTS else pl.String for c in COLLECTIVE_ARGS.values()}
    | {"collective_args": pl.String}
)
COMM_OP = r"^(?:nccl|gloo|mpi|ucc|xccl):"  # a collective op's name: its backend, a colon, the op
PARAM_COMMS = "record_param_comms"
# GPU span classes, as Holistic Trace Analysis draws them: NCCL kernels communicate, copies and sets
# move memory, a kernel named like a copy or a sync is neither, every other kernel computes
COMMUNICATION_KERNEL = r"^nccl.*Kernel"
MEMORY_KERNEL = r"^(?:Memcpy|Memset|dma)"
OTHER_KERNEL = r"Memcpy|Memset|Sync"
# Microseconds from the epoch (2096) past which a span's time or length is a bad value of its event:
# in nanoseconds, start plus base time would overflow 64 bits (1e309 reads as infinity).
TIME_LIMIT_US = 4e15


def _code(cats: Iterable[str]) -> list[int]:
    """The codes of these `cat`s."""
    return [_CATS.index(c) for c in cats]


def _codes_sql(cats: Iterable[str]) -> str:
    return f"code IN ({', '.join(map(str, _code(cats)))})"


def _args_sql(fields: dict[str, str]) -> str:
    """json_transform's structure for the args `fields` (key -> column), typed as FLAT_SCHEMA types the
    column: an integer from a number or its text, decimal or hex (ROCm writes a stream as "0x0"),
    anything else null; text as written (a number's text, an array's JSON)."""
    types = {key: "BIGINT" if FLAT_SCHEMA[column] == pl.Int64 else "VARCHAR" for key, column in fields.items()}
    return json.dumps(types)


# The event's fields as DuckDB reads them (`args` as its JSON, read only where a kind needs it)
_JSON_COLUMNS = dict.fromkeys(("ph", "cat", "name", "pid", "tid"), "VARCHAR") | {
    "ts": "DOUBLE",
    "dur": "DOUBLE",
    "args": "JSON",
}
# Each event as DuckDB reads it: its kind's code (null: not kept; UNTIMED: a time or length out of
# range, or no time), the name of a CPU or GPU span, a CPU span's thread, its times, the ids of a
# launch or GPU span (`ids`, SPAN_ARGS typed), and the args of an NCCL kernel or a collective call as
# JSON text (`collective_args`, typed once at the end by _collective_args: a column of each on every
# row would cost more than the parse of those rows).
_TIMED_SQL = f"abs(ts) <= {TIME_LIMIT_US} AND coalesce(abs(dur) <= {TIME_LIMIT_US}, true)"
_KIND_SQL = " ".join(f"WHEN '{cat}' THEN {code}" for code, cat in enumerate(_CATS))
_CPU_SQL, _GPU_SQL = _codes_sql(CPU_CATS), _codes_sql(GPU_KINDS)
_SELECT = (
    f"SELECT code, CASE WHEN {_CPU_SQL} OR {_GPU_SQL} THEN name END AS name,"
    f" CASE WHEN {_CPU_SQL} THEN pid END AS pid, CASE WHEN {_CPU_SQL} THEN tid END AS tid,"
    " ts AS start_us, coalesce(dur, 0.0) AS dur_us,"
    f" CASE WHEN {_GPU_SQL} OR {_codes_sql(LAUNCH_CATS)}"
    f" THEN json_transform(args, '{_args_sql(SPAN_ARGS)}') END AS ids,"
    f" CASE WHEN ({_GPU_SQL} AND starts_with(name, 'nccl')) OR ({_CPU_SQL} AND name = '{PARAM_COMMS}')"
    " THEN args END AS collective_args"
    f" FROM (SELECT CASE WHEN ph = 'X' AND cat IN ({', '.join(repr(c) for c in _CATS)})"
    f" THEN CASE WHEN {_TIMED_SQL} THEN CASE cat {_KIND_SQL} END ELSE {UNTIMED} END END::UTINYINT AS code,"
    " * FROM events)"
)


def sniff(head: bytes) -> bool:
    """A JSON object whose first key is one Kineto writes, with trace events in it."""
    return bool(_SNIFF.match(head)) and (b'"traceEvents"' in head or b'"deviceProperties"' in head)


# before the Flight Recorder's JSON (a trace is JSON too)
@input_format("kineto", priority=4, sniff=sniff, reads_lines=False)
def ingest(source: InputFile) -> IngestResult:
    result = IngestResult()
    try:
        trace = read_trace(source.path)
    except (ValueError, OSError) as exc:
        result.account.errors.append(f"{source.name}: not a readable profiler trace: {exc}")
        return result
    rank, rank_source = _rank(trace.meta, source.name)
    if rank is None:
        result.account.errors.append(
            f"{source.name}: no distributedInfo and no rank in the file name or folder (like rank-3): "
            "its spans are read but belong to no rank"
        )
    spans = span_rows(trace, rank, source.name)
    result.account.lines = trace.events
    result.account.parsed = spans.height
    result.account.unrecognized = trace.untimed + trace.broken
    result.account.ignored = trace.events - spans.height - result.account.unrecognized
    if trace.untimed:
        result.account.errors.append(
            f"{source.name}: {count(trace.untimed, 'event')} whose time or length is not a number in range, not read"
        )
    if trace.broken:
        result.account.errors.append(f"{source.name}: {count(trace.broken, 'event')} whose text is not JSON, not read")
    if trace.zeros is not None:
        at, rest = trace.zeros
        result.account.notes.append(
            f"ends in {count(rest, 'zero byte')} from byte {at:,} (a hole, or space never written): read up to them"
        )
    # the host as the run's folders name it, as every other file there is named; else as the trace does
    host = source.host_hint or _machine(trace.meta)
    if host:
        spans = spans.with_columns(host=pl.lit(host))
    result.add("trace_spans", spans)
    result.add("trace_ranks", _rank_row(trace, spans, rank, rank_source, source.name, host))
    return result


_CPU_COLUMNS = ["code", "name", "pid", "tid", "start_us", "dur_us"]
_GPU_COLUMNS = ["code", "name", "start_us", "dur_us", *SPAN_ARGS.values()]


class Trace:
    """What a file held: the top-level keys but the events, the kept events per kind, and counts."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.events = 0  # every event, broken ones too
        self.untimed = 0  # kept kinds of event whose time is no time (UNTIMED)
        self.broken = 0  # events whose text is not JSON (_events_of)
        self.zeros: tuple[int, int] | None = None  # where the zero bytes the file ends in begin, and how many
        self.cpu: list[pl.DataFrame] = []
        self.calls: list[pl.DataFrame] = []  # record_param_comms, with the collective's args
        self.gpu: list[pl.DataFrame] = []
        self.nccl: list[pl.DataFrame] = []  # NCCL kernels, with the collective's args; one frame a batch
        self.launches: list[pl.DataFrame] = []

    def keep(self, batch: pl.DataFrame) -> None:
        """Sort a batch of events (_SELECT) into CPU spans, GPU spans and launches, each with the
        columns it needs."""
        self.events += batch.height
        self.untimed += int((batch["code"] == UNTIMED).sum())
        code = pl.col("code")
        cpu = batch.lazy().filter(code.is_in(_code(CPU_CATS)))
        calls = pl.col("name") == PARAM_COMMS
        self.cpu.append(_own(cpu.filter(~calls).select(_CPU_COLUMNS)))
        self.calls.append(_own(cpu.filter(calls).select(*_CPU_COLUMNS, "collective_args")))
        gpu = batch.lazy().filter(code.is_in(_code(GPU_KINDS))).unnest("ids")
        nccl = pl.col("name").str.starts_with("nccl")
        self.gpu.append(_own(gpu.filter(~nccl).select(_GPU_COLUMNS)))
        self.nccl.append(_own(gpu.filter(nccl).select(*_GPU_COLUMNS, "collective_args")))
        correlation = pl.col("ids").struct.field("correlation")
        launches = batch.lazy().filter(code.is_in(_code(LAUNCH_CATS)), correlation.is_not_null())
        self.launches.append(launches.select(correlation, launch_us="start_us").collect())


def _own(kept: pl.LazyFrame) -> pl.DataFrame:
    """`kept` holding none of its batch's memory: its names as categories (few distinct names, held
    once) and the collective's args copied. A text column filtered, or imported from DuckDB, is views
    into buffers it shares with every column of the batch, and keeps them all."""
    text = pl.col(pl.String).exclude("collective_args").cast(pl.Categorical)
    if "collective_args" in kept.collect_schema().names():
        return kept.with_columns(text, pl.concat_str("collective_args", pl.lit(""))).collect()
    return kept.with_columns(text).collect()


def _collective_args(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its `collective_args` (JSON text) as the COLLECTIVE_ARGS columns, typed as the
    ids are (_args_sql)."""
    import duckdb

    with duckdb.connect(config={"threads": 1}) as con:  # one thread: the rows stay in their order
        texts = con.from_arrow(frame.select("collective_args").to_arrow())
        typed = texts.query(
            "texts", f"SELECT json_transform(collective_args, '{_args_sql(COLLECTIVE_ARGS)}') AS a FROM texts"
        )
        assert typed is not None  # a SELECT has rows, if none
        args = typed.pl().unnest("a").rename(COLLECTIVE_ARGS)
    return pl.concat([frame.drop("collective_args"), args], how="horizontal")


def read_trace(path: Path) -> Trace:
    """The trace's kept events, read a chunk at a time."""
    trace = Trace()
    for batch in _chunked(path, trace):
        trace.keep(batch)
    return trace


def _chunked(path: Path, trace: Trace) -> Iterator[pl.DataFrame]:
    """The events, a chunk at a time, PARSERS chunks parsed at once in threads (DuckDB parses without
    the GIL) while the one before is sorted into kinds, so that every core has work."""
    return _parsed(_event_arrays(path, trace), trace)


def _parsed(arrays: Iterator[bytes], trace: Trace) -> Iterator[pl.DataFrame]:
    """Each array of whole events as its events (_SELECT), read by DuckDB (_duck); an array it does
    not read, an event at a time by Python's parser (_events_of): a value of the wrong type, a string
    not UTF-8 or wrongly escaped, or a cut inside an event (between objects nested in its arrays),
    whose rest then starts the next array, read the same way (DuckDB's parse of that array, made
    ahead, is not used). The events Python reads are written again as JSON DuckDB reads, each value
    of its field's type, for the same query: one typing of the args for both."""
    import duckdb  # here, not at the top: only a run with traces pays for loading it

    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tracelens-")))
        # a database per parser: each parses on the thread that asks, none waits for another's
        connections: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(PARSERS):
            connections.put(stack.enter_context(duckdb.connect(config={"threads": 1})))

        def parse(name: str, array: bytes) -> pl.DataFrame:
            con = connections.get()
            try:
                return _duck(con, folder / name, array)
            finally:
                connections.put(con)

        carry = b""
        # closed before the connections and the folder: the parses under way end first
        ahead = stack.enter_context(
            contextlib.closing(_ahead(((f"events-{n}.json", array) for n, array in enumerate(arrays)), parse))
        )
        for number, (array, parsed) in enumerate(itertools.chain(ahead, [(None, None)])):
            if array is not None and parsed is not None and not carry:
                try:
                    yield parsed.result()
                    continue
                except duckdb.Error:
                    pass
            body = carry + (b"," if carry and array else b"") + (array[1:-1] if array else b"")
            rows, carry = _events_of(body, trace, last=array is None)
            if rows:
                text = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
                yield parse(f"events-{number}-typed.json", text.encode("utf-8", errors="replace"))


def _duck(con: Any, path: Path, array: bytes) -> pl.DataFrame:
    """An array of events as DuckDB's JSON reader reads it (_SELECT): only the fields asked for, and
    the args only on the rows that read them. It reads the array from a file of its own in a private
    folder (by name, as it reads files in C++; a new name each time, so that nothing it keeps of a
    file it has read can stand for the next)."""
    path.write_bytes(array)
    try:
        events = con.read_json(
            str(path), format="array", columns=_JSON_COLUMNS, maximum_object_size=_EVENT_LIMIT + CHUNK_BYTES
        )
        selected = events.query("events", _SELECT)
        assert selected is not None  # a SELECT has rows, if none
        return selected.pl()
    finally:
        path.unlink()


def _event_arrays(path: Path, trace: Trace) -> Iterator[bytes]:
    """The events array's text, a chunk of whole events at a time, each an array of its own (`[`, the
    events, `]`); the other keys into `trace.meta`. The file is read into one buffer used again for
    every chunk: a new one each time is memory the kernel maps and clears again, a large share of the
    time. The text ends where only zero bytes are left (zero padding after a trace, a hole of gigabytes
    never written, read as text at great cost), and `trace.zeros` says where."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        zeros = _EndingZeros(path, size)
        head = b""
        while (found := _EVENTS_KEY.search(head)) is None:
            more = b"" if trace.zeros else fh.read(1 << 20)
            if not more or len(head) > _HEAD_LIMIT:
                raise ValueError("no traceEvents array")
            if (nul := zeros.find(more, 0, len(more), len(head))) is not None:
                more, trace.zeros = more[:nul], (len(head) + nul, size - len(head) - nul)
            head += more
        trace.meta.update(_object_text(head[: found.start()]))
        buf = bytearray(head[found.end() :])
        cut = _cut_kineto if _KINETO_SEPARATOR in buf else _cut_any
        filled, offset = len(buf), found.end()  # offset: the file's byte at buf[0]
        while True:
            if len(buf) < filled + CHUNK_BYTES:  # the first time, and when an event outgrows a chunk
                buf.extend(bytes(filled + CHUNK_BYTES - len(buf)))
            got = 0
            if trace.zeros is None:
                with memoryview(buf) as view:
                    got = fh.readinto(view[filled : filled + CHUNK_BYTES])
                if (nul := zeros.find(buf, filled, filled + got, offset)) is not None:
                    got, trace.zeros = nul - filled, (offset + nul, size - offset - nul)
            filled += got
            if ends := cut(buf, filled):
                with memoryview(buf) as view:
                    yield b"".join((b"[", view[: ends[0]], b"]"))
                rest = buf[ends[1] : filled]
                buf[: len(rest)] = rest
                filled = len(rest)
                offset += ends[1]
            elif filled > _EVENT_LIMIT:
                raise ValueError(f"an event longer than {_EVENT_LIMIT >> 20} MiB at byte {offset:,}")
            if not got:
                break
    try:
        last, trailer = _split_tail(buf[:filled].decode("utf-8", errors="replace"))
    except ValueError as exc:
        if trace.zeros is None:
            raise
        raise ValueError(
            f"{exc} before zero bytes at byte {trace.zeros[0]:,} (a hole, or space never written)"
        ) from None
    trace.meta.update(trailer)
    if last is not None:
        yield f"[{last}]".encode()


_NOT_ZERO = re.compile(rb"[^\0]")


class _EndingZeros:
    """Where a file's text ends in zero bytes that go on to its end: no JSON holds one, and a hole's
    zeros read as text cost as much as text. A zero byte with text after it (a damaged byte) is left
    to the parser. The file is looked at only where a run of zeros reaches the end of what was read."""

    def __init__(self, path: Path, size: int) -> None:
        self._path, self._size = path, size
        self._seen = 0  # the file's zero runs before this byte have data after them

    def find(self, data: bytes | bytearray, lo: int, hi: int, offset: int) -> int | None:
        """The index in `data[lo:hi]` (`data[0]` is the file's byte `offset`) of the zero byte from
        which only zeros are left in the file, if there is one."""
        at = max(lo, self._seen - offset)
        while at < hi and (nul := data.find(b"\0", at, hi)) >= 0:
            if after := _NOT_ZERO.search(data, nul, hi):
                at = after.start()
                continue
            with self._path.open("rb") as fh:
                fh.seek(offset + nul)
                self._seen = skip_zeros(fh)
            return nul if self._seen >= self._size else None
        return None


def _cut_any(text: bytearray, end: int) -> tuple[int, int] | None:
    """Where the whole events at the start of `text[:end]` end and the rest (the start of the next
    event) begins: at the last separator between events, found in a window at the end grown until
    it holds one; None if there is none."""
    window = 1 << 16
    while True:
        begin = max(0, end - window)
        if found := list(_BOUNDARY.finditer(text, begin, end)):
            return found[-1].start() + 1, found[-1].end()
        if begin == 0:
            return None
        window *= 4


def _cut_kineto(text: bytearray, end: int) -> tuple[int, int] | None:
    """`_cut_any` for Kineto's own layout, faster: its separator between events, `},` newline, two
    spaces, `{`, holds a raw newline, so it is never inside a string, and its indent is the events
    array's (an object nested in an event is indented deeper). The rest of a separator cut by the
    chunk's end is found with the next chunk."""
    at = text.rfind(_KINETO_SEPARATOR, 0, end)
    return None if at < 0 else (at + 1, at + 2)


def _ahead(
    arrays: Iterator[tuple[str, bytes]], parse: Callable[[str, bytes], pl.DataFrame]
) -> Generator[tuple[bytes, Future[pl.DataFrame]], None, None]:
    """Each named array with its parse, PARSERS of them made at once in threads, ahead of their use:
    one array more than there are parsers is read, so that none waits for the file."""
    with ThreadPoolExecutor(PARSERS) as pool:
        pending: collections.deque[tuple[bytes, Future[pl.DataFrame]]] = collections.deque()
        for name, array in arrays:
            pending.append((array, pool.submit(parse, name, array)))
            if len(pending) > PARSERS:
                yield pending.popleft()
        yield from pending


def _object_text(head: bytes) -> dict[str, Any]:
    """The keys before `traceEvents` (`{ "schemaVersion": 1, ..., `), as a dict; {} if they do not parse."""
    text = head.decode("utf-8", errors="replace").strip().rstrip(",")
    try:
        value = json.loads(text + "}") if text.startswith("{") else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


_TAIL_TRIES = 16  # the last `]`s of a trace's tail tried as the events array's end


def _split_tail(text: str) -> tuple[str | None, dict[str, Any]]:
    """The last event's text and the keys after the events array (`], "traceName": ...,
    "baseTimeNanoseconds": ...}`). A last event that does not parse ends at the last `]` that such
    keys and the closing `}` follow: it is then lost alone, where its parser fails on it."""
    text = text.strip()
    if not text.startswith("{"):
        return None, _trailer(text)
    try:
        end = json.JSONDecoder().raw_decode(text)[1]
    except (ValueError, RecursionError):
        at = len(text)
        for _ in range(_TAIL_TRIES if text.endswith("}") else 0):
            if (at := text.rfind("]", 0, at)) <= 0:
                break
            with contextlib.suppress(ValueError):
                return text[:at].rstrip(), _trailer(text[at:], strict=True)
        raise ValueError("the traceEvents array does not end") from None
    return text[:end], _trailer(text[end:])


def _trailer(text: str, strict: bool = False) -> dict[str, Any]:
    """The keys after the events array, from its `]` on; {} if they do not parse (as the keys before
    it), unless `strict`."""
    text = text.strip()
    if not text.startswith("]"):
        raise ValueError("the traceEvents array does not end")
    rest = text[1:].strip()
    if not rest.startswith(","):
        return {}
    try:
        value = json.loads("{" + rest[1:])
    except (ValueError, RecursionError):
        if strict:
            raise ValueError("the keys after the traceEvents array do not parse") from None
        return {}
    return value if isinstance(value, dict) else {}


def _events_of(body: bytes, trace: Trace, last: bool) -> tuple[list[dict], bytes]:
    """The rows of the events in `body` (events and separators), parsed one at a time: it is cut at
    every separator between events; a piece whose JSON stops short at its end (a separator between
    objects nested in an event's arrays) is joined with the pieces after it until it parses; one
    that does not parse is counted in `trace.broken`, the rest read. And the text of an event that
    may go on in the next array (unless `last`)."""
    if not body.strip():
        return [], b""
    bounds = list(_BOUNDARY.finditer(body))
    starts, ends = [0, *(m.end() for m in bounds)], [*(m.start() + 1 for m in bounds), len(body)]
    rows: list[dict] = []
    i = 0
    while i < len(starts):
        j, joins = i, min(len(ends), i + _JOINS)
        while (event := _event(body[starts[i] : ends[j]])) is _SHORT and j + 1 < joins:
            j += 1
        if event is _SHORT and not last and joins == len(ends) and len(body) - starts[i] <= _EVENT_LIMIT:
            return rows, body[starts[i] :]
        if event is _SHORT or event is _BROKEN:
            trace.broken += 1
            trace.events += 1
            j = i
        elif isinstance(event, dict):
            rows.append(_typed_event(event))
        i = j + 1
    return rows, b""


_JOINS = 256  # pieces joined at most into one event (objects in its arrays)
_SHORT, _BROKEN = object(), object()  # JSON that stops short at the end of its text; text that is no JSON


def _event(text: bytes) -> Any:
    """`text` parsed (any number, text not UTF-8 made so, control characters in strings), or _SHORT or _BROKEN."""
    decoded = text.decode("utf-8", errors="replace").rstrip()
    try:
        return json.loads(decoded, strict=False)
    except json.JSONDecodeError as exc:
        return _SHORT if exc.pos >= len(decoded) else _BROKEN
    except RecursionError:
        return _BROKEN


def _typed_event(event: dict) -> dict[str, Any]:
    """An event's fields as _JSON_COLUMNS types them (text, or a number: infinity where Python's
    parser read a number past a float's range), and the args of ARG_KEYS as they are."""
    out: dict[str, Any] = {k: _text(event.get(k)) for k in ("ph", "cat", "name", "pid", "tid")}
    out.update({k: _number(event.get(k)) for k in ("ts", "dur")})
    args = event.get("args")
    out["args"] = {key: args[key] for key in ARG_KEYS if key in args} if isinstance(args, dict) else None
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return _str(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _str(value: Any) -> str | None:
    """`value` if it is text, its lone surrogates (a `\\ud800` escape in the JSON, which Python's parser
    keeps) replaced: a column holds UTF-8 only."""
    return value.encode("utf-8", errors="replace").decode("utf-8") if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    """`value` if it is an integer a 64-bit column holds (not a bool, a float, text or a list)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63
    return value if ok else None


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past a float's range
        return None


# -- rows -----------------------------------------------------------------------------------------


_MAX_RANK = 1 << 31  # a rank past it is no rank (a damaged value, a long number in a name)


def _rank(meta: dict[str, Any], name: str) -> tuple[int | None, str]:
    if (rank := _int(_dict(meta.get("distributedInfo")).get("rank"))) is not None and 0 <= rank < _MAX_RANK:
        return rank, "distributedInfo"
    base = name.rsplit("!", 1)[-1]
    leaf, _, folders = base.rpartition("/")[2], None, base.rpartition("/")[0]
    if (found := _RANK_IN_NAME.search(leaf)) and int(found.group(1)) < _MAX_RANK:
        return int(found.group(1)), "file name"
    if (in_path := _RANK_IN_NAME.findall(folders)) and int(in_path[-1]) < _MAX_RANK:
        return int(in_path[-1]), "folder"
    return None, "unknown"


def _machine(meta: dict[str, Any]) -> str | None:
    """The host name the trace wrote (the machine's)."""
    return _str(meta.get("host_name")) or None


def _base_us(meta: dict[str, Any]) -> float:
    """Microseconds every `ts` counts from: `baseTimeNanoseconds`, when a number within TIME_LIMIT_US."""
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or abs(base) > TIME_LIMIT_US * 1000:
        return 0.0
    return base / 1000


EPOCH_MIN_US = 1e15  # 2001: a trace time below this (and no baseTimeNanoseconds) is not wall-clock time


def span_rows(trace: Trace, rank: int | None, name: str) -> pl.DataFrame:
    """One row per kept span of the trace, with its step, depth and time in UTC."""
    base = _base_us(trace.meta)
    cpu = _concat(trace.cpu, _CPU_COLUMNS)
    calls = _collective_args(_concat(trace.calls, [*_CPU_COLUMNS, "collective_args"]))
    gpu = _gpu_frame(trace.gpu, trace.nccl)
    launches = _concat(trace.launches, ["correlation", "launch_us"])
    # their memory goes with the last reference
    trace.cpu, trace.calls, trace.gpu, trace.nccl, trace.launches = [], [], [], [], []
    steps = _steps(cpu)
    cpu_rows = pl.concat([_cpu_spans(cpu), _collectives(cpu, calls)], how="diagonal_relaxed")
    del cpu, calls
    gpu_rows = _gpu_spans(gpu, launches)
    del gpu, launches
    # each part placed in its steps apart, then sorted, then the rest added and the times counted from
    # the trace's base time: every step on the whole rows would copy them (a column added to a frame
    # of several chunks rechunks it)
    parts = [_in_steps(part, steps) for part in (cpu_rows, gpu_rows)]
    del cpu_rows, gpu_rows
    rows = _sorted(parts).with_columns(pl.col("start_us", "launch_us") + base)
    wall = rows.height > 0 and rows["start_us"].min() >= EPOCH_MIN_US  # type: ignore[operator]
    return rows.with_columns(
        file=pl.lit(name),
        rank=pl.lit(rank, dtype=pl.Int64),
        end_us=pl.col("start_us") + pl.col("dur_us"),
        ts=pl.from_epoch((pl.col("start_us") * 1000).cast(pl.Int64), "ns").dt.replace_time_zone("UTC")
        if wall
        else pl.lit(None, dtype=pl.Datetime("ns", "UTC")),
        ts_quality=pl.lit("exact" if wall else "none"),
    )


def _gpu_frame(gpu: list[pl.DataFrame], nccl: list[pl.DataFrame]) -> pl.DataFrame:
    """The GPU spans as one frame, batch after batch, each batch's NCCL kernels after its other spans
    (the order spans of equal start keep), the kernels' collective args typed at once for every batch
    (_collective_args): typing every GPU span's nulls cost more time and memory than the few kernels'."""
    typed = _collective_args(_concat(nccl, [*_GPU_COLUMNS, "collective_args"]))
    starts = itertools.accumulate((frame.height for frame in nccl), initial=0)
    parts = [
        part for other, start, kernels in zip(gpu, starts, nccl) for part in (other, typed.slice(start, kernels.height))
    ]
    return pl.concat(parts or [typed], how="diagonal_relaxed")


def _sorted(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The rows of `parts` (emptied) in time order (as they were among equal starts), a column at a
    time, each unsorted column let go once its sorted copy is made: a sort of the whole frame holds
    both copies of every column, and so does a frame's `drop` when its columns are cut into chunks
    differently (it copies every other column into one chunk)."""
    rows = pl.concat(parts, how="diagonal_relaxed")
    parts.clear()
    order = rows.select(pl.arg_sort_by("start_us", maintain_order=True)).to_series()
    columns = rows.get_columns()
    del rows
    for i, column in enumerate(columns):
        columns[i] = column.gather(order)
    return pl.DataFrame(columns)


def _concat(frames: list[pl.DataFrame], columns: list[str]) -> pl.DataFrame:
    """The kept frames of one kind as one, their text as categories (as Trace.keep keeps it)."""
    if frames:
        return pl.concat(frames, how="diagonal_relaxed")
    return _own(pl.DataFrame(schema={c: FLAT_SCHEMA.get(c, pl.Float64) for c in columns}))


def _matching(frame: pl.DataFrame, column: str, pattern: str) -> pl.Expr:
    """`column` (text held as categories) matches the regex `pattern`: tried once per distinct value."""
    values = frame.get_column(column).unique().drop_nulls()
    return pl.col(column).is_in(values.filter(values.cast(pl.String).str.contains(pattern)).implode())


def _as_text(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its categories as text again."""
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _steps(cpu: pl.DataFrame) -> pl.DataFrame:
    """The ProfilerStep#N spans: step number, pid, start and end."""
    return (
        _as_text(cpu.filter(_matching(cpu, "name", "^ProfilerStep#")))
        .select(
            step=pl.col("name").str.extract(_STEP.pattern, 1).cast(pl.Int64),
            step_pid=pl.col("pid"),
            step_start=pl.col("start_us"),
            step_end=pl.col("start_us") + pl.col("dur_us"),
        )
        .drop_nulls("step")
        .sort("step_start")
    )


def _cpu_spans(cpu: pl.DataFrame) -> pl.DataFrame:
    """The CPU ops and annotations at most MAX_DEPTH deep on their thread (collectives apart)."""
    ops = ~_matching(cpu, "name", COMM_OP) & (pl.col("name") != PARAM_COMMS)
    spans = _as_text(_with_depth(cpu.select("code", "name", "pid", "tid", "start_us", "dur_us"), ops))
    kind = (
        pl.when(pl.col("name").str.starts_with("ProfilerStep#"))
        .then(pl.lit("step"))
        .when(pl.col("code").is_in(_code(["user_annotation"])))
        .then(pl.lit("annotation"))
        .otherwise(pl.lit("cpu_op"))
    )
    return spans.with_columns(kind=kind).drop("code")


def _with_depth(spans: pl.DataFrame, among: pl.Expr) -> pl.DataFrame:
    """The spans of `among` at most MAX_DEPTH deep, each with its nesting depth on its thread (0: inside
    no other), levels peeled off one at a time: a span is at the current level when it starts at or
    after the end of every earlier span left. The levels are found on the spans' threads and times
    alone (a thread as one number made of its pid's and tid's category ids: sorting their text would
    cost more than the peeling), and only the spans kept are copied whole: the sorted copies the
    peeling makes, and a filtered copy of every span, would hold every span's name. Of two spans with
    the same start and end, the one written first holds the other."""
    pid, tid = ((pl.col(c).to_physical().cast(pl.UInt64) + 1).fill_null(0) for c in ("pid", "tid"))
    slim = (
        spans.select(
            thread=pid * (1 << 32) + tid,
            start_us="start_us",
            end=pl.col("start_us") + pl.col("dur_us"),
            _i=pl.int_range(pl.len(), dtype=pl.UInt32),
            _among=among,
        )
        .filter("_among")
        .sort(["thread", "start_us", "end"], descending=[False, False, True], maintain_order=True)
    )
    depth = np.full(spans.height, -1, dtype=np.int32)
    rest = slim
    for level in range(MAX_DEPTH + 1):
        if rest.height == 0:
            break
        covered = pl.col("end").cum_max().shift(1).over("thread")
        top = rest.select(covered.is_null() | (pl.col("start_us") >= covered)).to_series()
        depth[rest.filter(top)["_i"].to_numpy()] = level
        rest = rest.filter(~top)
    kept = np.flatnonzero(depth >= 0)
    return spans[kept].with_columns(depth=pl.Series(depth[kept]))


def _collectives(cpu: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """One row per collective call on the CPU: `record_param_comms` (sizes, dtype, group, sequence
    number) with the `nccl:*`/`gloo:*` op on the same thread that starts inside it (PyTorch 2) or
    holds it (older); an op with no such call (gloo's worker threads) is a row of its own, and a call
    with neither an op nor a collective name, or that only waits for one (`wait`), is no row."""
    calls = _as_text(calls.drop("code")).sort("start_us")
    ops = (
        _as_text(cpu.filter(_matching(cpu, "name", COMM_OP)))
        .select(
            "pid", "tid", op="name", op_start="start_us", op_dur="dur_us", op_end=pl.col("start_us") + pl.col("dur_us")
        )
        .sort("op_start")
    )
    call_end = pl.col("start_us") + pl.col("dur_us")
    pairs = []
    for strategy, holds in (
        ("forward", pl.col("op_start") <= call_end),  # the op starts inside the call
        ("backward", pl.col("op_end") >= pl.col("start_us")),  # the op holds the call
    ):
        found = calls.join_asof(
            ops,
            left_on="start_us",
            right_on="op_start",
            by=["pid", "tid"],
            strategy=strategy,
            check_sortedness=False,
        )
        pairs.append(found.with_columns(pl.when(holds).then(pl.struct("op", "op_start")).alias(strategy)))
    named = (
        pairs[0]
        .with_columns(backward=pairs[1]["backward"])
        .with_columns(pick=pl.coalesce("forward", "backward"))
        .with_columns(op=pl.col("pick").struct.field("op"), op_start=pl.col("pick").struct.field("op_start"))
        .drop("forward", "backward", "pick", "op_dur", "op_end")
    )
    named = named.with_columns(name=pl.coalesce("op", "collective")).filter(
        pl.col("name").is_not_null(), pl.col("collective").fill_null("") != "wait"
    )
    matched = named.filter(pl.col("op").is_not_null()).select("pid", "tid", "op_start")
    alone = ops.join(matched, on=["pid", "tid", "op_start"], how="anti").select(
        "pid", "tid", name="op", start_us="op_start", dur_us="op_dur"
    )
    rows = pl.concat([named.drop("op", "op_start"), alone], how="diagonal_relaxed")
    return rows.with_columns(
        kind=pl.lit("collective"),
        collective=pl.coalesce("collective", pl.col("name").str.split(":").list.last()),
        backend=pl.col("name").str.extract(r"^(\w+):", 1),
    )


def _gpu_spans(gpu: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Kernels, copies and sets with their class and the time their launch was called."""
    first = launches.filter(pl.col("correlation").is_first_distinct())  # in their order: a faster join
    rows = gpu.join(first, on="correlation", how="left") if gpu.height else gpu.with_columns(launch_us=pl.lit(None))
    category = (
        pl.when(_matching(gpu, "name", COMMUNICATION_KERNEL))
        .then(pl.lit("communication"))
        .when(~pl.col("code").is_in(_code(["kernel"])) | _matching(gpu, "name", MEMORY_KERNEL))
        .then(pl.lit("memory"))
        .when(_matching(gpu, "name", OTHER_KERNEL))
        .then(pl.lit("other"))
        .otherwise(pl.lit("computation"))
    )
    rows = _as_text(rows.with_columns(_category=category))
    return rows.with_columns(
        kind=pl.col("code").replace_strict(dict(zip(_code(GPU_KINDS), GPU_KINDS.values())), default="kernel"),
        category="_category",
        tid=pl.lit(None),
    ).drop("code", "_category")


def _in_steps(rows: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each span's ProfilerStep: the step whose CPU span holds its start (a GPU span's launch), the
    last step to start at or before it, found by a binary search of the steps (no copy of the rows)."""
    at = (pl.coalesce("launch_us", "start_us") if "launch_us" in rows.columns else pl.col("start_us")).alias("_at")
    if steps.height == 0:
        return rows.with_columns(step=pl.lit(None, dtype=pl.Int64))
    times = rows.select(at).to_series()
    before = steps["step_start"].search_sorted(times, side="right").cast(pl.Int64) - 1
    index = before.clip(lower_bound=0)
    holds = (before >= 0) & (times < steps["step_end"].gather(index))
    return rows.with_columns(step=pl.when(holds).then(steps["step"].gather(index)))


def _rank_row(
    trace: Trace, spans: pl.DataFrame, rank: int | None, rank_source: str, name: str, host: str | None
) -> pl.DataFrame:
    meta = trace.meta
    info = _dict(meta.get("distributedInfo"))
    devices = meta.get("deviceProperties")
    devices = devices if isinstance(devices, list) else []
    steps = spans.filter(pl.col("kind") == "step")
    return pl.DataFrame(
        [
            {
                "file": name,
                "rank": rank,
                "rank_source": rank_source,
                # the trace's own values, each of its column's type or none (a damaged or edited trace)
                "world_size": _int(info.get("world_size")),
                "backend": _str(info.get("backend")),
                "nccl_version": _str(info.get("nccl_version")),
                "pg_count": _int(info.get("pg_count")),
                "pg_config": json.dumps(info["pg_config"]) if "pg_config" in info else None,
                "device_name": next((_str(d.get("name")) for d in devices if isinstance(d, dict)), None),
                "base_time_ns": _int(meta.get("baseTimeNanoseconds")),
                "schema_version": _int(meta.get("schemaVersion")),
                "events": trace.events,
                "spans": spans.height,
                "kernels": (spans["kind"] == "kernel").sum(),
                "steps": steps.height,
                "first_step": steps["step"].min(),
                "last_step": steps["step"].max(),
                "host": host,
                "host_name": _machine(meta),
                "ts": spans["ts"].min(),
                "ts_quality": spans["ts_quality"][0] if spans.height else "none",
            }
        ]
    )


def machine_hosts(tables: RunTables) -> RunTables:
    """The tables with each trace named by its machine's name (`host_name`) instead of its folder's
    where another source of the run names that machine too: the run then names its hosts as the
    machines do (NCCL's and the launchers' prefixes print the machine's name), and the trace follows."""
    if tables.height("trace_ranks") == 0:
        return tables
    others = tables["inputs"].filter(pl.col("format") != "kineto")["host"].drop_nulls().str.split(", ").explode()
    moved = tables["trace_ranks"].filter(
        pl.col("host_name").is_not_null(), pl.col("host") != pl.col("host_name"), pl.col("host_name").is_in(others)
    )
    if moved.height == 0:
        return tables
    names = dict(zip(moved["file"].to_list(), moved["host_name"].to_list()))
    host = pl.col("file").replace_strict(names, default=pl.col("host"), return_dtype=pl.String).alias("host")
    return tables.with_frames(
        {name: tables.frame(name).with_columns(host) for name in ("trace_ranks", "trace_spans", "inputs")}
    )
