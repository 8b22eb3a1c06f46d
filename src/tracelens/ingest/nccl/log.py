"""NCCL_DEBUG and PyTorch ProcessGroupNCCL lines -> nccl_* tables.

grammars/nccl.lark is the spec of every message body (one rule per kind); this module is
the engine, built for logs of hundreds of MB (lark once per line would be far too slow for those):

1. *Envelope*, vectorized: polars finds the record in each line (`host:pid:tid [dev]
   [file:line] NCCL LEVEL `, the pre-2.3 `[dev] INFO`, `[rankN]:[E.. ProcessGroupNCCL.cpp:N]`,
   bare `NCCL version` lines); what precedes it is the launcher prefix, where a full-date
   timestamp gives `ts`.
2. *Kinds*, two ways: bodies that are nearly all distinct (channel connections, comm
   lifecycle, error propagation, per-op tracing) are matched by regexes (`VECTOR_KINDS`)
   whose equality with the grammar the tests prove; every other body is parsed by lark once
   per distinct text (cached across chunks) and joined back.
3. *Tables*, at `finish`: the records joined with their parsed fields, one frame per table.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from functools import cache

import lark
import polars as pl
from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput
from lark.parsers.lalr_analysis import Shift

from tracelens.ingest import IngestResult, InputFile, line_format
from tracelens.ingest.text import glued
from tracelens.ingest.text.lines import (
    IGNORED,
    PARSED,
    UNRECOGNIZED,
    any_of,
    byte_slice,
    file_of,
    within_datetime_range,
)
from tracelens.ingest.text.shapes import Locator, ShapeParser
from tracelens.private_cache import cache_file
from tracelens.resources import grammar_text
from tracelens.tables import Spill

UNKNOWN = "unknown"

# ------------------------------------------------------------------ grammar: body -> (kind, fields)

# Grammar rules whose text is a field of the record (everything else only structures it).
FIELDS = frozenset(
    "nccl_version cuda_version env_name env_value oob_name net_name gdr_state gdr_name plugin_name"
    " internal_plugin channel conn src_rank dst_rank src_dev dst_dev direction via comm_id comm_hash rank"
    " nranks comm_cuda_dev nvml_dev bus_id comm_event src_file src_line result strerror thread_tag verb peer"
    " status status_sym opcode vendor_err seq op_type timeout_ms ran_ms ifaddr ibdev oob gdr_net async_event"
    " distance_net heartbeat_s".split()
)
LIST_FIELDS = frozenset({"ifaddr", "ibdev"})  # repeated: interface and device lists


class _Fields(Transformer):
    """Turn any kind's tree into a flat dict of its FIELDS (lists for LIST_FIELDS)."""

    def text(self, tokens: list[Token]):
        return " ".join(str(c).strip() for c in tokens)

    def __default__(self, data, children, meta):
        if data in FIELDS:
            text = self.text([c for c in children if isinstance(c, Token)])
            return {data: [text] if data in LIST_FIELDS else text}
        merged: dict = {}
        for child in children:
            if isinstance(child, dict):
                for key, value in child.items():
                    if key in LIST_FIELDS:
                        merged.setdefault(key, []).extend(value)
                    else:
                        merged.setdefault(key, value)
        return merged


def _cache_path(text: str) -> str | bool:
    """Where lark may keep the built parser: a file in the user's private cache folder named by the
    grammar, lark and Python versions, or False (build each time) when none is safe.
    Never lark's `cache=True`, a pickle in the shared temporary folder (see private_cache)."""
    key = hashlib.sha256(f"{text}{lark.__version__}{sys.version_info[:2]}".encode()).hexdigest()[:24]
    return cache_file(f"nccl-grammar-{key}.lark") or False


class _Grammar:
    """grammars/nccl.lark as an LALR parser with one start symbol per kind.

    LALR is much faster than Earley here, and a start per kind keeps the contextual lexer
    from confusing one kind's first word with another's free text. The kinds are the
    alternatives of the grammar's `message` rule; a body is tried only against the kinds
    whose first terminal matches its start, in the grammar's order.
    """

    def __init__(self) -> None:
        text = grammar_text("nccl")
        catalogue = re.search(r"^\?message:(.*?)\n\n", text, re.S | re.M)
        self.kinds = [k.strip() for k in catalogue.group(1).split("|")] if catalogue else []
        self.lark = Lark(text, parser="lalr", start=self.kinds, cache=_cache_path(text))
        table = self.lark.parser.parser.parser.parse_table
        patterns = {t.name: t.pattern.to_regexp() for t in self.lark.terminals}
        self.first = {
            kind: re.compile(
                "|".join(f"(?:{patterns[t]})" for t in table.states[table.start_states[kind]] if t in patterns)
            )
            for kind in self.kinds
        }
        self.starts = _viable_starts(table, [table.start_states[kind] for kind in self.kinds], patterns)

    def parse(self, body: str, fields: _Fields | None = None) -> tuple[str, dict]:
        for kind in self.kinds:
            if self.first[kind].match(body):
                try:
                    return kind, (fields or _Fields()).transform(self.lark.parse(body, start=kind))
                except UnexpectedInput:
                    continue
        return UNKNOWN, {}


def _viable_starts(table, starts: list[int], patterns: dict[str, str]) -> str:
    """A regex (polars') that every body the grammar reads matches at its start: a terminal one of
    the kinds may begin with, then (after the blanks the grammar ignores) one it may take next, or
    the end. A body that does not match is no kind's, known without a parse: free text costs one
    whole-column match, not a grammar run per line. A terminal taken after an empty rule (a reduce)
    is not followed up, and lookaheads are dropped: both only let more bodies through."""
    follow: dict[str, set[str] | None] = {}
    for state in starts:
        for first, (action, target) in table.states[state].items():
            if first not in patterns:
                continue
            known = follow.get(first, set())
            if action is not Shift or known is None:
                follow[first] = None
            else:
                follow[first] = known | {t for t in table.states[target] if t in patterns or t == "$END"}

    def plain(name: str) -> str:
        return "$" if name == "$END" else "(?:" + re.sub(r"\(\?[=!][^()]*\)", "", patterns[name]) + ")"

    branches = [
        plain(first) + ("" if nxt is None else r"[ \t]*(?:" + "|".join(sorted(map(plain, nxt))) + ")")
        for first, nxt in sorted(follow.items(), key=lambda item: item[0])
    ]
    return "^(?:" + "|".join(branches) + ")"


@cache
def _grammar() -> _Grammar:
    return _Grammar()


def parse_body(body: str) -> tuple[str, dict]:
    """The kind and fields of one message body per the grammar; ("unknown", {}) if no rule fits."""
    return _grammar().parse(body)


class _FieldRecipes(_Fields):
    """_Fields with each field's text given as a recipe: where it lies among the body's literal text and tokens."""

    def __init__(self, locate: Locator) -> None:
        super().__init__()
        self.locate = locate

    def text(self, tokens: list[Token]):
        return self.locate(tokens)


def parse_recipes(body: str, locate: Locator) -> tuple[str, dict]:
    """parse_body with recipes for the field texts: a shape for every body that masks to the same text."""
    return _grammar().parse(body, _FieldRecipes(locate))


@cache
def _shapes() -> ShapeParser:
    """The grammar once per shape, for every file this process reads: a shape's kind and
    recipes depend on the grammar alone, and 4,096 per-rank logs share the same few dozen."""
    return ShapeParser(parse_recipes)


# ------------------------------------------------------------------ vectorized kinds

_HEX = r"[0-9a-fA-F]+"
_VIA = r"(?P<via>(?:NET|COLLNET)/[^/]+/\S+|(?:P2P|SHM|NET|COLLNET|direct shared memory)\S*(?: pointer\S*| device)?)"
_COMM = (
    r"^(?:\[Rank \d+\] )?(?:nccl\w+ )?comm (?P<comm_id>0x" + _HEX + r"|\(nil\)) rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev (?P<comm_cuda_dev>\d+)(?: nvmlDev (?P<nvml_dev>\d+))?(?: busId (?P<bus_id>"
    + _HEX
    + r"))?"
)
_COMM_HASH = r"(?: commId (?P<comm_hash>0x" + _HEX + r"))?"
_SPLIT = r"(?: parent \S+(?: splitCount \d+)? color -?\d+ key -?\d+)?"  # ncclCommSplit, before or after commId
_PTR = r"(?:0x" + _HEX + r"|\(nil\))"

# kind -> (literals one of which every such body contains, full-match regex with the grammar's
# field names). A body that fails its regex falls through to lark, so these need to be right,
# not complete. Most frequent first: a body is tried until one kind takes it.
VECTOR_KINDS: list[tuple[str, list[str], str]] = [
    (
        "coll_op",
        [": opCount "],
        (
            r"^(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast|Send|Recv|AllToAll|Gather|Scatter)\w*"
            r": opCount [0-9a-f]+ \S"
        ),
    ),
    (
        "channel_conn",
        [" via "],
        r"^(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<conn>\d+))? : (?P<src_rank>\d+)(?:\[(?P<src_dev>"
        + _HEX
        + r")\])? -> "
        r"(?P<dst_rank>\d+)(?:\[(?P<dst_dev>" + _HEX + r")\])?(?: \[(?P<direction>send|receive)\])? via " + _VIA + "$",
    ),
    (
        "channel_conn",
        [" via COLLNET"],
        (
            r"^(?:CollNet|Coll) (?P<channel>\d+)(?:/(?P<conn>\d+))? : (?P<src_rank>\d+)"
            r"(?: \[(?P<direction>send|receive)\])? via "
        )
        + _VIA
        + "$",
    ),
    (
        "error_propagation",
        [" -> "],
        r"^(?P<src_file>[\w./+-]+\.(?:cc|c|cu|h|hpp|cpp)):"
        r"(?P<src_line>\d+) -> (?P<result>\d+)(?: \((?P<strerror>[^)]*)\))?"
        r"(?: (?P<thread_tag>\[(?:Async thread|Proxy Thread|Progress Thread|Service thread)\]))?$",
    ),
    ("comm_init", [" - Init "], _COMM + _SPLIT + _COMM_HASH + _SPLIT + r" - Init (?P<comm_event>START|COMPLETE)$"),
    ("comm_teardown", [" COMPLETE"], _COMM + _COMM_HASH + r" - (?P<comm_event>Destroy|Abort) COMPLETE$"),
    (
        "comm_info",
        [" nNodes "],
        r"^(?:\[Rank \d+\] )?comm (?P<comm_id>" + _PTR + r") rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes \d+ "
        r"localRanks \d+ localRank \d+(?: MNNVL \d+)?$",
    ),
    ("init_timings", ["Init timings"], r"^Init timings(?: -)? \w*:? ?rank \d+ nranks \d+ total [\d.]+ \([^)]*\)$"),
    (
        "proxy_trace",
        [
            "New proxy",
            "proxyProgressAsync",
            "Received and initiated",
            "ncclPollProxyResponse",
            "resp.opId",
            "Connected to proxy",
        ],
        r"^(?:New proxy (?:send|recv) connection \d+ from local rank \d+, transport \d+"
        r"|proxyProgressAsync opId=" + _PTR + r" op\.type=\d+ op\.reqBuff=" + _PTR + r" op\.respSize=\d+ done"
        r"|Received and initiated operation=\w+ res=\d+|ncclPollProxyResponse Received new opId="
        + _PTR
        + r"|resp\.opId="
        + _PTR
        + r" matches expected opId="
        + _PTR
        + r"|Connected to proxy localRank \d+ -> connection "
        + _PTR
        + r")$",
    ),
]
# Kinds without fields that every rank prints at every communicator's init (rings, trees, channel
# counts, timings): one anchored regex each, token by token as the grammar reads them (blanks between).
_B = r"[ \t]*"
VECTOR_KINDS += [
    (kind, literals, "^" + _B.join(tokens) + _B + "$")
    for kind, literals, tokens in [
        ("graph_ring", [" -> "], [r"Ring", r"\d+", ":", r"-?\d+", "->", r"-?\d+", "->", r"-?\d+"]),
        ("graph_tree", [" -> "], [r"Tree", r"\d+", ":", r"-?\d+", "->", r"-?\d+", "->", r"-?\d+/-?\d+/-?\d+"]),
        ("trees", ["Trees"], [r"Trees", r"(?:\[" + _B + r"\d+" + _B + r"\]" + _B + r"[-\d/>|]+" + _B + ")+"]),
        ("ring_order", [" : "], [r"(?:Channel|Ring)", r"\d+", r"(?:/" + _B + r"\d+)?", ":", r"(?:\d+" + _B + ")+"]),
        ("thread_thresholds", ["threadThresholds"], ["threadThresholds", r"[\d/| ]+"]),
        (
            "connected",
            ["Connected "],
            [r"(?:Connected all rings(?:" + _B + r", use ring PXN" + _B + r"\d+" + _B + r"GDR" + _B + r"\d+)?"
             r"|Connected all trees|Connected NVLS tree|Connected collnet(?:" + _B + ".+)?)"],
        ),
        ("bootstrap_timings", ["Bootstrap timings total"], ["Bootstrap timings total", r"\d+(?:\.\d+)?", r"\([^)]*\)"]),
    ]
]  # fmt: skip
# Kinds that only feed nccl_events: their fields are not extracted on the hot path.
EVENTS_ONLY = frozenset({"coll_op", "proxy_trace", "error_propagation", "init_timings"})


def _candidates(texts: pl.Series, undecided: pl.Series, literals: list[str]) -> pl.Series:
    """Positions of the undecided texts a kind's regex may take: those holding its one literal (a
    memchr pass), or, for several literals, all undecided ones (the anchored regex fails fast on
    their first words, cheaper than polars' contains_any over them)."""
    if len(literals) == 1:
        return (texts.str.contains(literals[0], literal=True) & undecided).arg_true()
    return undecided.arg_true()


def match_vector(msgs: pl.Series, skip_fields: frozenset[str] = EVENTS_ONLY) -> tuple[pl.Series, pl.DataFrame]:
    """Kind of each body a VECTOR_KINDS regex matches (null for the rest), and the fields of
    the matched bodies (column `row` = position in `msgs`), except for kinds in `skip_fields`.

    Each regex runs only on the bodies no kind has taken that hold one of its literals (memchr
    passes over the column), and once: a kind with fields is matched by its extraction."""
    kinds = pl.repeat(None, len(msgs), dtype=pl.String, eager=True)
    fields = [pl.DataFrame(schema={"row": pl.UInt32})]
    for kind, literals, pattern in VECTOR_KINDS:
        rows = _candidates(msgs, kinds.is_null(), literals)
        if not rows.len():
            continue
        bodies = msgs.gather(rows)
        if kind not in skip_fields and "(?P<" in pattern:
            found = bodies.str.extract_groups("^(?P<_hit>)" + pattern.removeprefix("^")).struct.unnest()
            hit = found["_hit"].is_not_null()
            fields.append(found.filter(hit).drop("_hit").with_columns(row=rows.filter(hit)))
        else:
            hit = bodies.str.contains(pattern)
        kinds = kinds.scatter(rows.filter(hit), kind)
    return kinds, pl.concat(fields, how="diagonal")


# ------------------------------------------------------------------ envelope

# NCCL's own record marker, and the head before it (NCCL ≥2.3: host:pid:tid [dev] [ms func:line] [file:line [(fn)]]).
_MARK = r"NCCL (?:INFO|WARN|TRACE|CALL|ABORT) "
_OLD_MARK = r"\] INFO "  # NCCL ≤2.2: `host:pid:tid [dev] INFO msg`, no NCCL word
# NCCL ≤2.2 WARN: `host:pid:tid [dev] include/socket.h:360 WARN Call to connect failed : Connection timed out`
# (the host prefix cut off by whoever pasted it: `include/socket.h:344 WARN Socket creation failed : ...`)
_OLD_WARN = r"^(?P<head>(?:.*\[\d+\] )?)(?P<where>[\w./+-]+\.(?:cc|c|cu|h|hpp|cpp)):\d+ WARN (?P<msg>.*)$"
# where such a WARN without its host came from: a file of NCCL's tree, not any program's `main.c`
_NCCL_SOURCE = r"^(?:[\w.+-]+/[\w./+-]*\.(?:cc|cu|h)|\w+\.cu)$"
# A record whose host prefix was cut off in a paste: NCCL's mark starts the line, after NCCL's source
# location at most (`misc/ibvwrap.cc:203 NCCL WARN Call to ibv_create_cq failed ...`); text that merely
# mentions the mark (`look for NCCL INFO lines`) has other words before it.
_CUT_HEAD = r"^\s*(?:[\w./+-]+\.(?:cc|c|cu|h|hpp|cpp):\d+ )?$"
_HEAD = (
    r"^(?P<prefix>.*?)(?:(?P<host>[^\s:\[\]()]*):(?P<pid>\d+):(?P<tid>\d+) )?(?:\[(?P<dev>\d+)\] )?"
    r"(?:\d+\.\d+ \S+:\d+ )?(?:\S+:\d+ (?:\([^)]*\) )?)?$"
)
# c10 logging: `[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] ` or `[E ProcessGroupNCCL.cpp:737] `;
# its time has no year and a monotonic fraction, so it goes to `clock` for the timeline to date
_PYTORCH = (
    r"^(?P<prefix>.*?)(?:\[rank\d+\]:)?\[(?P<sev>[EWIF])(?:(?P<clock>\d{3,4} \d\d:\d\d:\d\d)\.\d+)? "
    r"(?:ProcessGroupNCCL|NCCLUtils)\.[ch]pp:\d+\] ?(?P<msg>.*)$"
)
_PYTORCH_ERROR = (
    r"^(?P<prefix>.*?)(?P<msg>(?:[\w.]*Error: NCCL error in: "
    r"|nccl(?:System|Remote|Internal|UnhandledCuda|InvalidArgument"
    r"|InvalidUsage|InProgress)(?:Error)?: ).*)$"
)
_BARE_VERSION = r"^(?P<prefix>.*?)(?P<msg>NCCL version \d\S*)$"
# A launcher's command line that sets NCCL_* variables (`$ mpirun -np 16 -x NCCL_IB_DISABLE=1 ...`)
_LAUNCH = (
    r"^(?P<prefix>.*?)(?P<msg>(?:mpirun|mpiexec|orterun|srun|torchrun|horovodrun|deepspeed|pdsh)\s.*"
    r"\bNCCL_\w+[=\s].*)$"
)
# `-x NAME=value` (Open MPI), `export NAME=value;` (DeepSpeed's pdsh), `-genv NAME value` (MPICH, Intel MPI)
_LAUNCH_ENV = r"\bNCCL_[A-Z0-9_]+=[^\s;]*|-g?env\s+NCCL_[A-Z0-9_]+\s+[^\s;-][^\s;]*"
# A watchdog or NCCL error inside a C++ exception's text: `  what():  [PG 3 Rank 5] Process group watchdog
# thread terminated with exception: ...`, `c10::DistBackendError: [Rank 1] Watchdog caught ...`, and the
# `terminate called after throwing an instance of '...'` line before it; CUDA errors PyTorch raises.
_WATCHDOG_TEXT = (
    r"(?:\[[^\]]*Rank \d+\]\s*)?(?:Process group watchdog thread terminated|NCCL watchdog thread terminated"
    r"|Watchdog caught collective|Work WorkNCCL|Exception \(either an error or timeout\)|failure detected by watchdog"
    r"|Timeout at NCCL work|Some NCCL operations|ProcessGroupNCCL's watchdog got stuck|Heartbeat monitor timed out)"
)
_CPP_WRAPPED = (
    r"^(?P<prefix>.*?)(?:what\(\):|(?:\w+(?:::|\.))*\w*(?:Error|Exception):)\s*(?P<msg>" + _WATCHDOG_TEXT + r".*)$"
)
_TERMINATE = r"^(?P<prefix>.*?)(?P<msg>terminate called after throwing an instance of '[^']*'.*)$"
_CUDA_ERROR = r"^(?P<prefix>.*?)(?P<msg>(?:\w+\.)*\w*Error: CUDA (?:error|out of memory).*)$"
# NCCLUtils quotes NCCL's last WARN (2.13+): `ncclRemoteError: ... Last error:` and the WARN's text on the
# next line, or on the same line once collapsed (a paste that lost its line breaks).
_LAST_ERROR = r"^(?P<prefix>.*?)(?:(?:[\w.]*Error|nccl\w+): .*)?Last error: ?(?P<msg>.*)$"
_SEVERITY = {"E": "ERROR", "W": "WARN", "I": "INFO", "F": "FATAL"}

_NCCL_TS = r"\[(\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:\.\d+)?)\] ?$"  # 2.26+ NCCL_DEBUG_TIMESTAMP_FORMAT default
_WRAPPER_TS = r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?)"  # launcher/shipper timestamp with a full date
# pdsh's `host: `; a name is cut at its first dot as NCCL cuts its own, an IPv4 address is kept whole
_PDSH_HOST = r"^((?:\d+\.){3}\d+|[A-Za-z0-9][\w-]*)[\w.-]*: "
# a log collector's `<date time> worker-9 >> ` before a line: the host of PyTorch's records, and of NCCL's
# when its own host field is empty (`:168:1228 [2]`)
_COLLECTOR_HOST = r"(?:^|\s)([A-Za-z0-9][\w-]*)[\w.-]* >> $"

RECORD_COLUMNS = ["idx", "prefix", "ts", "ts_text", "host", "pid", "tid", "cuda_dev", "level", "msg", "bad_number"]


def _split_prefix(records: pl.LazyFrame) -> pl.LazyFrame:
    """Take the timestamp out of `prefix` into `ts`: NCCL's own (2.26+) right before the record,
    else a launcher's that carries a full date. Times are taken as printed, as UTC; `ts_text` keeps
    the printed text (tables.with_ts_text)."""
    prefix = pl.col("prefix")
    nccl_ts = prefix.str.extract(_NCCL_TS)
    printed = pl.coalesce(nccl_ts, prefix.str.extract(_WRAPPER_TS))
    ts_text = printed.str.replace_all(r"[T_]", " ").str.replace(",", ".", literal=True)
    ts_text = pl.when(ts_text.str.len_chars() == 16).then(ts_text + ":00").otherwise(ts_text)  # minutes only
    ts_text = within_datetime_range(ts_text)
    ts = ts_text.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", time_zone="UTC", strict=False)
    return records.with_columns(
        prefix=pl.when(nccl_ts.is_not_null()).then(prefix.str.replace(_NCCL_TS, "")).otherwise(prefix),
        ts=ts,
        ts_text=pl.when(ts.is_not_null()).then(printed),
    )


def _with_head(records: pl.LazyFrame) -> pl.LazyFrame:
    """Split each record's `head` into prefix, ts, host, pid, tid, cuda_dev.

    Heads repeat per thread (`host:pid:tid [dev] `), so the regexes run on the distinct
    heads and are joined back, not captured on every line.
    """
    numbers = {"pid": pl.Int64, "tid": pl.Int64, "dev": pl.Int32}
    # the regex once, its groups unnested (each `struct.field` of an extract_groups expression runs it again)
    heads = records.select("head").unique().with_columns(parts=pl.col("head").str.extract_groups(_HEAD)).unnest("parts")
    heads = heads.with_columns(
        host=pl.when(pl.col("host") == "").then(pl.col("prefix").str.extract(_COLLECTOR_HOST)).otherwise("host"),
        pid=pl.col("pid").cast(pl.Int64, strict=False),
        tid=pl.col("tid").cast(pl.Int64, strict=False),
        cuda_dev=pl.col("dev").cast(pl.Int32, strict=False),
        # a pid, tid or device out of range (a 20-digit pid): the record is counted unrecognised, not the file lost
        bad_number=pl.any_horizontal(
            pl.col(f).is_not_null() & pl.col(f).cast(t, strict=False).is_null() for f, t in numbers.items()
        ),
    ).drop("dev")
    return records.join(_split_prefix(heads), on="head", how="left", maintain_order="left")


def _bytes(start: pl.Expr, length: pl.Expr | int | None = None) -> pl.Expr:
    """Slice of the line by byte offsets, as `str.find` gives them."""
    return byte_slice(pl.col("text"), start, length)


def _nccl_records(lines: pl.DataFrame) -> pl.DataFrame:
    """Lines carrying an NCCL record: split into prefix, host, pid, tid, cuda_dev, level, msg."""
    text, pos = pl.col("text"), pl.col("pos")
    lines = lines.with_columns(pos=text.str.find(_MARK))
    unmarked = lines.filter(pos.is_null()).drop("pos").lazy()  # the few lines the older shapes may hold
    marked = (
        lines.lazy()
        .filter(pos.is_not_null())
        .with_columns(level=_bytes(pos + 5, 5).str.strip_chars_end())
        .with_columns(head=_bytes(0, pos), msg=_bytes(pos + 6 + pl.col("level").str.len_bytes()))
        .collect()
    )
    marked = _with_head(marked.lazy()).filter(
        pl.col("host").is_not_null() | pl.col("cuda_dev").is_not_null() | pl.col("head").str.contains(_CUT_HEAD)
    )
    branches = [marked.select(RECORD_COLUMNS)]
    # the older shapes' branches only where an unmarked line may hold one (most logs have none: a small
    # file's plan then has one branch, not three)
    warn_like = text.str.contains(" WARN ", literal=True)
    old_shapes = unmarked.select(old=text.str.contains(_OLD_MARK).any(), warn=warn_like.any()).collect()
    if old_shapes["old"].item():
        old = (
            unmarked.with_columns(pos=text.str.find(_OLD_MARK))
            .filter(pos.is_not_null())
            .with_columns(level=pl.lit("INFO"), head=_bytes(0, pos + 2), msg=_bytes(pos + 7))
        )
        old = _with_head(old).filter(pl.col("host").is_not_null() & pl.col("cuda_dev").is_not_null())
        branches.append(old.select(RECORD_COLUMNS))
    if old_shapes["warn"].item():
        parts = text.str.extract_groups(_OLD_WARN)
        old_warn = (
            unmarked.filter(warn_like)
            .with_columns(parts=parts)
            .filter(pl.col("parts").struct.field("msg").is_not_null())
            .select(
                "idx",
                "text",
                level=pl.lit("WARN"),
                head=pl.col("parts").struct.field("head"),
                msg=pl.col("parts").struct.field("msg"),
                where=pl.col("parts").struct.field("where"),
            )
        )
        old_warn = _with_head(old_warn).filter(
            pl.col("host").is_not_null() & pl.col("cuda_dev").is_not_null()
            | (pl.col("head") == "") & pl.col("where").str.contains(_NCCL_SOURCE)
        )
        branches.append(old_warn.select(RECORD_COLUMNS))
    return pl.concat(branches).collect()


def _quoted_errors(lines: pl.DataFrame) -> pl.DataFrame:
    """Bodies of the NCCL WARNs PyTorch quotes after `Last error:`, each at the line that holds it
    (columns idx, prefix, msg). A quote on the next line loses the launcher prefix of the `Last error:` line."""
    text, prefix = pl.col("text"), pl.col("prefix")
    marks = lines.filter(text.str.contains("Last error:", literal=True))
    if marks.is_empty():  # no quote (most chunks): the plan below is not built
        return pl.DataFrame(schema={"idx": lines.schema["idx"], "prefix": pl.String, "msg": pl.String})
    marks = marks.lazy().select("idx", parts=text.str.extract_groups(_LAST_ERROR)).unnest("parts")
    next_line = (
        marks.filter(pl.col("msg") == "")
        .select(pl.col("idx") + 1, "prefix")
        .join(lines.lazy(), on="idx")
        .select(
            "idx",
            prefix=pl.when(text.str.starts_with(prefix)).then(prefix).otherwise(pl.lit("")),
            msg=text.str.strip_prefix(prefix),
        )
    )
    quotes = pl.concat([marks.filter(pl.col("msg") != ""), next_line]).with_columns(pl.col("msg").str.strip_chars_end())
    return quotes.filter(pl.col("msg").str.strip_chars_start() != "").collect()


def _other_records(rest: pl.LazyFrame, quoted: pl.LazyFrame) -> pl.LazyFrame:
    """PyTorch ProcessGroupNCCL records, PyTorch's NCCL errors and the WARNs they quote, and bare
    `NCCL version` lines."""
    text = pl.col("text")
    none = {
        c: pl.lit(None, dtype=t)
        for c, t in (("host", pl.String), ("pid", pl.Int64), ("tid", pl.Int64), ("cuda_dev", pl.Int32))
    }
    none["bad_number"] = pl.lit(False)

    def records(pattern: str, level: pl.Expr, clock: pl.Expr = pl.lit(None, pl.String)) -> pl.LazyFrame:
        parts = text.str.extract_groups(pattern)
        found = rest.with_columns(parts=parts).filter(pl.col("parts").struct.field("msg").is_not_null())
        return found.select(
            "idx",
            prefix=pl.col("parts").struct.field("prefix"),
            msg=pl.col("parts").struct.field("msg"),
            level=level,
            clock=clock,
            **none,
        )

    sev = pl.col("parts").struct.field("sev").replace_strict(_SEVERITY, default="ERROR")
    c10 = records(_PYTORCH, sev, clock=pl.col("parts").struct.field("clock"))
    error = records(_PYTORCH_ERROR, pl.lit("ERROR"))
    version = records(_BARE_VERSION, pl.lit("VERSION"))
    launch = records(_LAUNCH, pl.lit("INFO"))
    wrapped = [records(pattern, pl.lit("ERROR")) for pattern in (_CPP_WRAPPED, _TERMINATE, _CUDA_ERROR)]
    pdsh_host = pl.coalesce(pl.col("prefix").str.extract(_PDSH_HOST), pl.col("prefix").str.extract(_COLLECTOR_HOST))
    warns = quoted.with_columns(level=pl.lit("WARN"), clock=pl.lit(None, pl.String), **none)
    found = pl.concat([warns, c10, error, *wrapped, version, launch], how="diagonal").unique(
        "idx", keep="first", maintain_order=True
    )
    return _split_prefix(found.with_columns(host=pdsh_host)).select(*RECORD_COLUMNS, "clock")


# Literals one of which every line with a record holds (a cheap filter before the regexes).
CANDIDATE_MARKS = [
    "NCCL",
    "] INFO ",
    " WARN ",
    "nccl",
    "what():",
    "terminate called",
    "Error: CUDA",
    "Watchdog",
    "watchdog",
]
OTHER_MARKS = [
    "ProcessGroupNCCL",
    "NCCLUtils",
    "Error: ",
    "ncclInvalid",
    "NCCL version ",
    "what():",
    "terminate called",
    "Exception: ",
    "NCCL_",
]
_CANDIDATE, _OTHER = any_of(CANDIDATE_MARKS), any_of(OTHER_MARKS)


GLUED_PARTS = 8  # records one line may hold, glued (glued.py)


def split_records(chunk: pl.DataFrame) -> pl.DataFrame:
    """Every record in the chunk, one row each, with prefix/ts split off and the body stripped; `idx`
    is the record's row in the chunk and `part` its place on that row: a body holding another line's
    start (a glued line, glued.py) ends there, and the rest, after the line's prefix, is read as a
    line of its own (its part one more)."""
    records = _line_records(chunk.select("text").with_row_index("idx")).with_columns(part=pl.lit(0, pl.UInt8))
    done, part = [], 0
    while True:
        at = glued.line_starts(records["msg"])
        if part == GLUED_PARTS or not at.is_not_null().any():
            done.append(records)
            break
        msg, rest = glued.cut(records["msg"], at)
        # a head whose body is all glued (`h:1:2 [2] NCCL INFO h:3:4 [6] NCCL INFO ...`) holds no record
        done.append(records.with_columns(msg=msg.str.strip_chars_end()).filter(at.is_null() | (at > 0)))
        # after a blank, so that the prefix's last word does not become the glued line's host
        prefix = (pl.col("prefix").fill_null("").str.strip_chars_end() + " ").str.strip_chars_start()
        glued_rows = records.select("idx", text=prefix + rest).filter(at.is_not_null())
        part += 1
        # an empty row after each, so that nothing read across lines (a quoted WARN) joins two of them
        texts = glued_rows.select(pl.concat_list("text", pl.lit("")).alias("text")).explode("text")
        again = _line_records(texts.with_row_index("idx"))
        origin = glued_rows["idx"].gather(again["idx"] // 2)
        records = again.with_columns(idx=origin, part=pl.lit(part, pl.UInt8))
    return pl.concat(done, how="diagonal").sort("idx", "part")


def _line_records(lines: pl.DataFrame) -> pl.DataFrame:
    """split_records on lines (columns idx, text), without glued-line cuts."""
    candidates = lines.filter(pl.col("text").str.contains(_CANDIDATE))
    candidates = candidates.with_columns(pl.col("text").str.strip_chars_end())
    nccl = _nccl_records(candidates)
    # eager: a lazy plan would push the filter before the anti-join, onto every candidate
    rest = candidates.join(nccl.select("idx"), on="idx", how="anti")
    rest = rest.filter(pl.col("text").str.contains(_OTHER))
    quoted = _quoted_errors(lines)
    if quoted.height:
        quoted = quoted.join(nccl.select("idx"), on="idx", how="anti")
    other = _other_records(rest.lazy(), quoted.lazy())
    if rest.height or quoted.height:
        others = other.collect()
    else:  # no PyTorch record, no quote: the plan's six regex branches are not run (a fixed cost per small file)
        others = pl.DataFrame(schema=other.collect_schema())
    records = pl.concat([nccl, others], how="diagonal").sort("idx")
    return records.with_columns(msg=pl.col("msg").str.strip_chars_start())


# ------------------------------------------------------------------ the line parser

WRAPPED_LINES = 12  # continuation lines a hard-wrapped record may take (a 1,400-character message at 116 columns)
_LINE_START = re.compile(glued.LINE_START)


def _continues(text: str) -> bool:
    """Whether a line may be the rest of a hard-wrapped record: not blank, and no line's start."""
    return bool(text.strip()) and not _LINE_START.search(text)


@dataclass
class ChunkRecords:
    """What NcclParser.parse makes of one chunk: line statuses, records, their fields by line, new lark results."""

    status: pl.Series
    records: pl.DataFrame
    fields: pl.DataFrame
    lark: dict[str, tuple[str, dict]]


@line_format("nccl", spills=True)
class NcclParser:
    """LineParser (tracelens.ingest) for NCCL/PyTorch records, run by tracelens.ingest.textlog."""

    def __init__(self, source: InputFile, spill: Spill | None = None) -> None:
        self.source = source
        self._parsed: dict[str, tuple[str, dict]] = {}  # distinct body -> lark result, across chunks
        self._fresh: dict[str, tuple[str, dict]] = {}  # the part of _parsed that `parse` added since its last call
        self._shapes = _shapes()
        self._spill = spill  # where each chunk's table rows go, when set; else records are kept until `finish`
        self._records: list[pl.DataFrame] = []  # one row per record: envelope, kind, body
        self._vector_fields: list[pl.DataFrame] = []  # fields of regex-matched bodies, by line
        # seen so far
        self._versions = pl.DataFrame(
            schema={"in_file": pl.Int64, "host": pl.String, "pid": pl.Int64, "version": pl.String}
        )

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        return self.absorb(self.parse(chunk))

    def absorb(self, parsed: ChunkRecords) -> pl.Series:
        """Take one chunk's records (parsed here or by a worker), in file order: spilled as table rows
        at once, or kept for `finish`; return its line statuses."""
        self._parsed.update(parsed.lark)
        if self._spill is None:
            self._records.append(parsed.records)
            self._vector_fields.append(parsed.fields)
        else:
            for name, frame in self._tables(parsed.records, parsed.fields).items():
                self._spill.write(name, frame)
        return parsed.status

    def parse(self, chunk: pl.DataFrame) -> ChunkRecords:
        """One chunk's records, keeping nothing but the caches: chunks of a big file are parsed in
        worker threads or Ray tasks (textlog) and absorbed in order."""
        records = split_records(chunk)
        kinds, fields = match_vector(records["msg"])
        records, fields = self._classify_rest(records.with_columns(kind=kinds), fields)
        records = records.with_columns(
            kind=pl.when(pl.col("bad_number").fill_null(False)).then(pl.lit(UNKNOWN)).otherwise("kind")
        ).drop("bad_number")
        texts = chunk["text"]
        status = pl.zeros(chunk.height, dtype=pl.UInt8, eager=True)
        records, continued = self._join_continuations(records, texts)
        claims = records.select(
            "idx", claim=pl.when(pl.col("kind") != UNKNOWN).then(pl.lit(PARSED)).otherwise(pl.lit(UNRECOGNIZED))
        )
        if (records["part"] > 0).any():  # a glued line: its strongest claim
            claims = claims.group_by("idx").agg(pl.col("claim").max())
        status = status.scatter(claims["idx"], claims["claim"].cast(pl.UInt8))
        if continued:
            status = status.scatter(continued, PARSED)
        blank = _warn_blank_lines(records, texts)
        if blank.len():
            status = status.scatter(blank, IGNORED)
        lines = chunk["line"].gather(records["idx"])
        fields = fields.with_columns(line=lines.gather(fields["row"]), part=records["part"].gather(fields["row"]))
        fields = fields.drop("row")
        fresh, self._fresh = self._fresh, {}
        return ChunkRecords(status, records.with_columns(line=lines).drop("idx"), fields, fresh)

    def _lark(self, body: str) -> tuple[str, dict]:
        if body not in self._parsed:
            self._parsed[body] = self._fresh[body] = parse_body(body)
        return self._parsed[body]

    def _classify_rest(self, records: pl.DataFrame, fields: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Kinds and fields of the bodies no vector regex took: unknown where no kind can start so
        (free text, one whole-column match), else by shape (shapes.py), and the few bodies no
        shape can take (no recipes) by lark, each distinct body once."""
        undecided = records["kind"].is_null()
        free = undecided & ~records["msg"].str.contains(_grammar().starts)
        if free.any():
            records = records.with_columns(kind=pl.when(free).then(pl.lit(UNKNOWN)).otherwise("kind"))
        rest = records.with_row_index("row").filter(pl.col("kind").is_null())
        kinds, by_shape = self._shapes.classify(rest["msg"])
        if rest.height:
            records = records.with_columns(records["kind"].scatter(rest["row"], kinds))
        fields = pl.concat([fields, by_shape.with_columns(row=rest["row"].gather(by_shape["row"]))], how="diagonal")
        left = records["kind"].is_null().arg_true()  # usually none: then no join over every record
        if left.len():
            msgs = records["msg"].gather(left)
            lark_kinds = {body: self._lark(body)[0] for body in msgs.unique().to_list()}
            records = records.with_columns(
                records["kind"].scatter(left, msgs.replace_strict(lark_kinds, return_dtype=pl.String))
            )
        return records, fields

    def _join_continuations(self, records: pl.DataFrame, texts: pl.Series) -> tuple[pl.DataFrame, list[int]]:
        """Re-parse unknown records with the hard-wrapped lines that follow them (a paste wrapped at a fixed width).

        A record that fails to parse, followed by lines that are no record and start no line of
        their own (a logger's stamp, see glued.py), may have been wrapped by a terminal: join the
        next line, and more while each piece has the width of the first line (up to WRAPPED_LINES).
        Keep the longest join the grammar then recognizes: a message with a free-text tail (the
        heartbeat monitor's, 7 lines at 116 columns) takes all its lines, one without (a completion
        error) only those it needs.
        """
        # only the last record of a line (a glued line's first ones end where the next begins)
        ends_line = pl.col("idx") != pl.col("idx").shift(-1).fill_null(-1)
        unknown = records.with_row_index("_r").filter((pl.col("kind") == UNKNOWN) & ends_line)
        if not unknown.height:
            return records, []
        taken = set(records["idx"].to_list())
        fixed, continued = {}, []
        for r, idx, msg in unknown.select("_r", "idx", "msg").iter_rows():
            width, nxt = len(texts[idx]), idx + 1
            pieces: list[int] = []
            while nxt < len(texts) and nxt not in taken and _continues(texts[nxt]) and len(pieces) < WRAPPED_LINES:
                if pieces and len(texts[nxt - 1]) != width:
                    break
                pieces.append(nxt)
                nxt += 1
            joins = ((n, glue) for n in range(len(pieces), 0, -1) for glue in ("", " "))
            for n, glue in joins:
                body = glue.join([msg, *(texts[i] for i in pieces[:n])]).strip()
                if self._lark(body)[0] != UNKNOWN:
                    fixed[r] = (body, self._parsed[body][0])
                    continued.extend(pieces[:n])
                    taken.update(pieces[:n])
                    break
        if not fixed:
            return records, []
        rows = pl.Series(list(fixed), dtype=pl.UInt32)
        records = records.with_columns(
            records["msg"].scatter(rows, [b for b, _ in fixed.values()]),
            records["kind"].scatter(rows, [k for _, k in fixed.values()]),
        )
        return records, continued

    def _tables(self, records: pl.DataFrame, fields: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """The NCCL tables of some records (a whole file's, or one chunk's as it is spilled) and their
        fields by line; communicators take their process's NCCL version from any record so far."""
        quality = pl.when(pl.col("ts").is_not_null()).then(pl.lit("exact")).otherwise(pl.lit("none"))
        records = records.with_columns(file=pl.lit(self.source.name), ts_quality=quality)
        detail = records.filter(
            ~pl.col("kind").is_in([*EVENTS_ONLY, UNKNOWN]) | pl.col("level").is_in(["WARN", "ABORT"])
        )
        detail = _with_fields(detail.join(fields, on=["line", "part"], how="left", maintain_order="left"), self._parsed)
        versions = detail.filter(pl.col("kind") == "version").select(
            file_of(pl.col("line")).alias("in_file"), "host", "pid", version="nccl_version"
        )
        self._versions = pl.concat([self._versions, versions], how="vertical_relaxed")
        tables = {"nccl_events": _events(records), "nccl_comms": _comms(detail, self._versions)}
        return tables | {name: build(detail) for name, build in DETAIL_TABLES.items()}

    def finish(self, result: IngestResult) -> None:
        if self._spill is not None:
            tables = self._spill.scans()
        elif self._records:
            tables = self._tables(
                pl.concat(self._records, rechunk=False), pl.concat(self._vector_fields, how="diagonal")
            )
        else:
            return
        for name, frame in tables.items():
            result.add(name, frame)


def _warn_blank_lines(records: pl.DataFrame, texts: pl.Series) -> pl.Series:
    """Indexes of the blank or prefix-only lines NCCL writes before each WARN (its leading '\\n')."""
    warns = records.filter((pl.col("level") == "WARN") & (pl.col("idx") > 0) & (pl.col("part") == 0))
    warns = warns.select("prefix", before=pl.col("idx") - 1)
    if not warns.height:  # most chunks: no join to run
        return warns["before"]
    warns = warns.join(records.select(before="idx"), on="before", how="anti")
    previous = texts.gather(warns["before"]).str.strip_chars()
    blank = (previous == "") | (previous == warns["prefix"].str.strip_chars())
    return warns["before"].filter(blank)


def _with_fields(records: pl.DataFrame, parsed: dict[str, tuple[str, dict]]) -> pl.DataFrame:
    """Add the fields lark found for each distinct body, and null columns for every field absent."""
    rows = [{"msg": body, **fields} for body, (_, fields) in parsed.items() if fields]
    if rows:
        facts = pl.from_dicts(rows, infer_schema_length=None)
        shared = [c for c in facts.columns if c in records.columns and c != "msg"]
        records = records.join(facts, on="msg", how="left", suffix="_lark", maintain_order="left")
        records = records.with_columns(pl.coalesce(c, f"{c}_lark").alias(c) for c in shared).drop(
            f"{c}_lark" for c in shared
        )
    missing = [f for f in sorted(FIELDS) if f not in records.columns]
    return records.with_columns(
        pl.lit(None, dtype=pl.List(pl.String) if f in LIST_FIELDS else pl.String).alias(f) for f in missing
    )


# ------------------------------------------------------------------ tables

PROVENANCE = ["file", "line", "host", "ts", "ts_quality", "ts_text"]

# ibv_wc_status (infiniband/verbs.h), for completion errors printed as a bare number.
IBV_WC_STATUS = [
    "SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR", "MW_BIND_ERR",
    "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR",
    "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
]  # fmt: skip

# grammar kind -> nccl_errors kind (WARN records of other kinds are "warn").
ERROR_KINDS = {
    "ib_completion": "ib_completion",
    "ib_async_event": "ib_async_event",
    "verbs_call": "verbs_call",
    "libibverbs_missing": "ib_unavailable",
    "ib_no_device": "ib_unavailable",
    "ib_no_ip_interface": "ib_unavailable",
    "socket_error": "socket",
    "foreign_connection": "foreign_connection",
    "ofi_error": "plugin",
    "ofi_no_nic": "plugin",
    "ofi_gdr": "gdr_disabled",
    "bootstrap_error": "bootstrap",
    "proxy_error": "proxy",
    "version_mismatch": "version_mismatch",
    "pt_watchdog_timeout": "watchdog_timeout",
    "pt_watchdog_exception": "watchdog_exception",
    "pt_blocking_wait_timeout": "blocking_wait_timeout",
    "pt_watchdog_stuck": "watchdog_stuck",
    "pt_nccl_error": "nccl_runtime_error",
    "pt_process_down": "watchdog_abort",
    "cuda_failure": "cuda",
    "nvml_failure": "nvml",
    "pt_cuda_error": "cuda",
    "ib_fatal": "ib_async_event",
    "ib_device_error": "ib_device",
}
# `unhandled cuda error` / ncclUnhandledCudaError raised to PyTorch is a CUDA problem, not a network one;
# out-of-memory, whatever reports it, is its own kind.
_CUDA_RESULT = r"unhandled cuda error|ncclUnhandledCudaError|Cuda failure"
_OUT_OF_MEMORY = r"(?i)out of memory|Failed to CUDA (?:calloc|malloc|host alloc)"
# ibv_event_type texts of the subnet manager's own events (an SM restart or handover reregisters
# clients, moves LIDs): IB async events that break nothing
_SM_EVENT = r"(?i)LID change|P_?key change|SM change|client reregistration|GID table change|port active"
# kinds that are failures at any level: PyTorch's, and the plugin's INFO that precedes its init's failure
ERRORS_AT_ANY_LEVEL = [k for k in ERROR_KINDS if k.startswith("pt_")] + ["pt_watchdog_terminated", "ofi_no_nic"]

COMM_EVENTS = {"START": "init_start", "COMPLETE": "init_complete", "Destroy": "destroy", "Abort": "abort"}


def _events(records: pl.DataFrame) -> pl.DataFrame:
    return records.select(
        *PROVENANCE, "pid", "tid", "cuda_dev", "level", "kind", "prefix", "clock", message=pl.col("msg")
    )


def _channels(records: pl.DataFrame) -> pl.DataFrame:
    via = pl.col("via")
    net = via.str.extract_groups(r"^(?:NET|COLLNET)/(?P<net>[^/(]+)/(?P<nic>\d+)(?:\((?P<proxy_rank>\d+)\))?")
    is_net = via.str.contains(r"^(?:NET|COLLNET)/")
    transport = (
        pl.when(via.str.starts_with("NET/")).then(pl.lit("NET"))
        .when(via.str.starts_with("COLLNET/")).then(pl.lit("COLLNET"))
        .when(via.str.starts_with("SHM") | via.str.starts_with("direct shared memory")).then(pl.lit("SHM"))
        .otherwise(via.str.extract(r"^(P2P/[A-Za-z]+)"))
    )  # fmt: skip
    return records.filter(pl.col("kind") == "channel_conn").select(
        *PROVENANCE, "pid",
        channel=pl.col("channel").cast(pl.Int32, strict=False), conn=pl.col("conn").cast(pl.Int32, strict=False),
        src_rank=pl.col("src_rank").cast(pl.Int64, strict=False),
        dst_rank=pl.col("dst_rank").cast(pl.Int64, strict=False),
        src_dev="src_dev", dst_dev="dst_dev", direction="direction", transport=transport,
        net=net.struct.field("net"), nic=net.struct.field("nic").cast(pl.Int32, strict=False),
        proxy_rank=net.struct.field("proxy_rank").cast(pl.Int64, strict=False),
        gdr=pl.when(is_net).then(via.str.contains("/GDRDMA", literal=True)), via=via,
    )  # fmt: skip


def _comms(records: pl.DataFrame, versions: pl.DataFrame) -> pl.DataFrame:
    """Communicator members; `versions` (in_file, host, pid, version): the `NCCL version` records, which
    name their process's version, or without a pid their file's (a batch of small files holds many:
    `in_file` is lines.file_of their line)."""
    per_process = versions.filter(pl.col("pid").is_not_null()).unique(["in_file", "host", "pid"], keep="first")
    per_file = (
        versions.filter(pl.col("pid").is_null())
        .unique("in_file", keep="first")
        .select("in_file", file_version="version")
    )
    comms = records.filter(pl.col("kind").is_in(["comm_init", "comm_teardown", "comm_info", "comm_rank"]))
    comms = comms.with_columns(in_file=file_of(pl.col("line")))
    comms = comms.join(per_process, on=["in_file", "host", "pid"], how="left", nulls_equal=False, maintain_order="left")
    comms = comms.join(per_file, on="in_file", how="left", maintain_order="left")
    return comms.select(
        *PROVENANCE, "pid", "comm_id", "comm_hash",
        rank=pl.col("rank").cast(pl.Int64, strict=False), nranks=pl.col("nranks").cast(pl.Int64, strict=False),
        cuda_dev=pl.coalesce(pl.col("comm_cuda_dev").cast(pl.Int32, strict=False), "cuda_dev"),
        nvml_dev=pl.col("nvml_dev").cast(pl.Int32, strict=False), bus_id="bus_id",
        event=pl.col("comm_event").replace_strict(COMM_EVENTS, default="rank_info"),
        nccl_version=pl.coalesce("version", "file_version"),
    )  # fmt: skip


# The network a `CUDA Dev N, <net> ...` line names, by the word it uses (2.3's socket network says `IP Interfaces`).
DISTANCE_NETS = {"IP": "Socket"}


def _net(records: pl.DataFrame) -> pl.DataFrame:
    kind = pl.col("kind")
    base = [*PROVENANCE, "pid"]
    iface_what = {"bootstrap_ifs": "bootstrap_if", "socket_ifs": "socket_if", "net_if": "socket_if"}
    missing = {
        "ib_no_device": "no_device",
        "libibverbs_missing": "no_libibverbs",
        "ib_no_ip_interface": "no_ip_interface",
    }
    named = [
        *iface_what, "network", "net_distance", "ib_sideband", "ib_devices", "ib_device", *missing,
        "gdr_hca", "gdr_gpu", "ofi_gdr", "plugin",
    ]  # fmt: skip
    records = records.filter(kind.is_in(named) | pl.col("oob").is_not_null())  # the rows any part below reads
    if records.is_empty():
        return records  # no network record (most chunks of a big log): its eight parts are not built
    ifaces = pl.concat([
        records.filter(kind.is_in(list(iface_what)))
        .select(*base, what=kind.replace_strict(iface_what), iface="ifaddr").explode("iface"),
        records.filter(pl.col("oob").is_not_null())
        .select(*base, what=pl.lit("oob_if"), iface=pl.concat_list("oob")).explode("iface"),
    ])  # fmt: skip
    iface = pl.col("iface").str.extract_groups(r"^(?P<name>[^:]+):(?P<address>.*)<\d+>$")
    dev = pl.col("dev").str.extract_groups(r"^(?P<name>[^:]+)(?::[^:]+)?:(?P<port>\d+)/(?P<link_layer>[A-Za-z]+)")
    plugin = pl.coalesce("plugin_name", pl.when(pl.col("internal_plugin").is_not_null()).then(pl.lit("internal")))
    parts = [
        records.filter(kind == "network").select(*base, what=pl.lit("network"), name="net_name"),
        records.filter(kind == "net_distance").select(
            *base, what=pl.lit("network"), name=pl.col("distance_net").replace(DISTANCE_NETS)
        ),
        ifaces.select(*base, "what", name=iface.struct.field("name"), address=iface.struct.field("address")),
        records.filter(kind == "ib_sideband").select(*base, what=pl.lit("oob_if"), name="oob_name"),
        records.filter(kind.is_in(["ib_devices", "ib_device"])).select(*base, dev="ibdev").explode("dev").select(
            *base, what=pl.lit("ib_device"), name=dev.struct.field("name"),
            port=dev.struct.field("port").cast(pl.Int32, strict=False), link_layer=dev.struct.field("link_layer"),
        ),
        records.filter(kind.is_in(list(missing))).select(
            *base, what=pl.lit("ib_missing"), name=kind.replace_strict(missing)
        ),
        records.filter(
            kind.is_in(["gdr_hca", "gdr_gpu"]) & ~pl.col("gdr_net").fill_null("").str.contains("(?i)^socket$|libfabric")
        ).select(
            *base, what=pl.lit("gdr_") + pl.col("gdr_state").str.to_lowercase(), name="gdr_name"
        ),
        records.filter(kind == "ofi_gdr").select(*base, what=pl.lit("gdr_disabled"), name=pl.lit("OFI")),
        records.filter((kind == "plugin") & plugin.is_not_null()).select(*base, what=pl.lit("plugin"), name=plugin),
    ]  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed").sort("line", maintain_order=True)


def _env(records: pl.DataFrame) -> pl.DataFrame:
    """Settings NCCL echoed, and those a launcher's command line gives every rank."""
    value = pl.col("env_value")
    echoed = records.filter(pl.col("kind").is_in(["env_set", "env_ib_hca"])).select(
        *PROVENANCE,
        "pid",
        name="env_name",
        value=pl.when(value.str.contains(r"^-?\d+\.$")).then(value.str.strip_suffix(".")).otherwise(value),
    )
    pair = pl.col("pair")
    launched = (
        records.filter(pl.col("kind") == "launch_command")
        .select(*PROVENANCE, "pid", pair=pl.col("msg").str.extract_all(_LAUNCH_ENV))
        .explode("pair")
        .drop_nulls("pair")
        .select(
            *PROVENANCE,
            "pid",
            name=pair.str.extract(r"(NCCL_[A-Z0-9_]+)"),
            value=pair.str.extract(r"NCCL_[A-Z0-9_]+(?:=|\s+)(.*)$").str.strip_chars("'\""),
        )
    )
    return pl.concat([echoed, launched])


def _errors(records: pl.DataFrame) -> pl.DataFrame:
    kind = pl.col("kind")
    errors = records.filter(pl.col("level").is_in(["WARN", "ABORT"]) | kind.is_in(ERRORS_AT_ANY_LEVEL))
    terminated = (
        pl.when(pl.col("ran_ms").is_not_null()).then(pl.lit("watchdog_timeout")).otherwise(pl.lit("watchdog_exception"))
    )
    status = pl.col("status").cast(pl.Int32, strict=False)
    status_name = pl.when(kind == "ib_completion").then(
        pl.coalesce(
            "status_sym",
            pl.lit("IBV_WC_")
            + status.replace_strict(dict(enumerate(IBV_WC_STATUS)), default=None, return_dtype=pl.String),
        )
    )
    return errors.select(
        *PROVENANCE, "pid", "tid",
        kind=pl.when(kind == "pt_watchdog_terminated").then(terminated)
        .when(kind.is_in(["cuda_failure", "pt_cuda_error", "pt_nccl_error"])
              & pl.col("msg").str.contains(_OUT_OF_MEMORY)).then(pl.lit("oom"))
        .when((kind == "pt_nccl_error") & pl.col("msg").str.contains(_CUDA_RESULT)).then(pl.lit("cuda"))
        .when((kind == "ib_async_event") & pl.col("async_event").str.contains(_SM_EVENT)).then(pl.lit("ib_sm_event"))
        .otherwise(kind.replace_strict(ERROR_KINDS, default="warn")),
        async_event=pl.when(kind == "ib_fatal").then(pl.lit("communicator fatal error")).otherwise("async_event"),
        status=status, status_name=status_name,
        opcode=pl.col("opcode").cast(pl.Int64, strict=False),
        vendor_err=pl.col("vendor_err").cast(pl.Int64, strict=False), peer="peer",
        rank=pl.when(kind.str.starts_with("pt_")).then(pl.col("rank").cast(pl.Int64, strict=False)),
        seq=pl.col("seq").cast(pl.Int64, strict=False), op_type="op_type",
        # the heartbeat monitor's timeout is in seconds
        timeout_ms=pl.coalesce(
            pl.col("timeout_ms").cast(pl.Int64, strict=False), pl.col("heartbeat_s").cast(pl.Int64, strict=False) * 1000
        ),
        ran_ms=pl.col("ran_ms").cast(pl.Int64, strict=False), message="msg",
    )  # fmt: skip


# Tables built from the records whose fields matter (not the per-op chatter).
DETAIL_TABLES = {  # and nccl_comms, which needs the versions too
    "nccl_channels": _channels,
    "nccl_net": _net,
    "nccl_env": _env,
    "nccl_errors": _errors,
}
