"""DeepSpeed training logs: steps, timers, throughput, comms logger, config echo, launcher.

A line parser for `textlog` (see tracelens.ingest.LineParser): every line of a launcher's stdout
comes through here, and only lines in DeepSpeed's shapes are claimed. How a line is read
(formats: docs/formats/deepspeed.md):

1. The envelope is split off, vectorized: a launcher's tag (pdsh `host: `, torchrun
   `[default0]:` / `[rank3]:`, Open MPI `[1,3]<stdout>:`), any junk (tqdm bars), the logger
   prefix anywhere in the line (`[2023-04-18 01:46:59,142] [INFO] [logging.py:96:log_dist] `,
   v0.1's `[INFO 2020-02-06 19:53:56] `, or a loguru / HF Trainer wrapper), then log_dist's
   `[Rank N] ` (also without a logger prefix, as 0.19 prints its timers). What is left is the body.
   A line's rank is its `[Rank N]`, else its tag's,
   else that of a per-rank log (`--enable_each_rank_log`: `..._rank3.log`).
2. The body's kind is chosen by its first words (grammar.HEADS). Lines printed without a prefix
   (v0.1-v0.3 timers, the comms summary table, Megatron and pipeline-engine lines) are
   claimed only for the kinds that DeepSpeed prints that way.
3. Hot kinds, whose bodies are nearly all distinct, are read by vectorized regexes
   (HOT); the tests prove them equal to grammars/deepspeed.lark. The other kinds are
   parsed by the grammar (`grammar`), once per distinct body.
4. Multi-line records continue on lines without a prefix: JSON values of the config
   echo, the v0.1 echo, the comms summary table. Such lines belong to the record that
   opened them (`owner`, the opener's line number).

Claims: PARSED; IGNORED for loss-scale messages (counted by `skipped`) and empty
messages; UNRECOGNIZED for a line with DeepSpeed's logger prefix whose body is no known
kind, or a body of a known kind that does not parse. The tables are assembled by
`assemble` when the file ends.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import polars as pl

from tracelens.ingest import IngestResult, InputFile, line_format
from tracelens.ingest.deepspeed import assemble
from tracelens.ingest.deepspeed.grammar import HEADS, SIZE_UNITS, parse_body
from tracelens.ingest.text import glued
from tracelens.ingest.text.lines import (
    IGNORED,
    NOT_MINE,
    PARSED,
    UNRECOGNIZED,
    byte_slice,
    file_of,
    number,
    within_datetime_range,
)
from tracelens.ingest.text.shapes import MARK, masked
from tracelens.tables import Spill

# ---------------------------------------------------------------- envelope

_TS = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
# Where the envelope starts (after a launcher tag, tqdm junk ...), then the whole envelope from there
ENVELOPE_START = (
    rf"\[{_TS},\d{{3}}\] \[[A-Z]+\] \["  # the logger, v0.2+
    rf"|\[[A-Z]+ {_TS}\] "  # v0.1
    rf"|{_TS}\.\d{{3}} \| [A-Z]+ *\| "  # applications' loguru log_dist
    rf"|\[[A-Z]+\|[^\]\s]+\] {_TS},"  # HF Trainer
)
ENVELOPE = (
    r"^(?:\[[^\]]+\] \[[A-Z]+\] \[[^\]\s:]+:\d+:[^\]\s]+\] ?"
    r"|\[[A-Z]+ [^\]]+\] "
    r"|[\d\-]+ [\d:.]+ \| [A-Z]+ *\| \S+ - "
    r"|\[[A-Z]+\|[^\]\s]+\] [\d\-]+ [\d:,]+ >> )"
)
FOREIGN = r"^(?:\d|\[[A-Z]+\|)"  # loguru and HF Trainer: other loggers that may carry DeepSpeed's messages
# What launchers put before a process's line: pdsh `host: `, then torchrun `[default0]:` (role
# and local rank) or `[rank3]:` (global rank), or Open MPI's --tag-output `[1,3]<stdout>:` (job, rank)
HOST_TAG = r"[\w.\-]+"
LAUNCHER_TAG = rf"^(?:{HOST_TAG}: )?(?:\[[A-Za-z_]*\d+\]:|\[\d+,\d+\]<std(?:out|err)>:)?"
TAG_RANK = r"\[(?:rank|\d+,)(\d+)\]"
RANK_FILE = r"(?:^|[/_])rank(\d+)\.log$"  # --enable_each_rank_log: `<log dir>/20230621073909_rank3.log`


def file_rank(name: str) -> int | None:
    """The rank of a per-rank log by its file name, None for others."""
    found = re.search(RANK_FILE, name)
    return int(found.group(1)) if found else None


def _nulls(like: pl.Series, dtype: pl.DataType = pl.String) -> pl.Series:
    return pl.repeat(None, like.len(), dtype=dtype, eager=True)


def _patched(fast: pl.Series, wrong: pl.Series, slow: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """`fast`, with the rows where `wrong` is true computed again by `slow` (given their indices)."""
    rows = wrong.fill_null(False).arg_true()
    return fast.scatter(rows, slow(rows)) if rows.len() else fast


def _envelope(text: pl.Series) -> pl.Series:
    """Each line from where its envelope starts; null without one. Nearly always it starts the line:
    only the other lines are searched."""
    at_start = text.str.contains(f"^(?:{ENVELOPE_START})")

    def search(rows: pl.Series) -> pl.Series:
        lines = text.gather(rows)
        found = lines.str.find(ENVELOPE_START)
        # str.find counts bytes and str.slice characters: lines with non-ASCII junk (tqdm bars) are cut again
        wide = found.is_not_null() & (lines.str.len_bytes() != lines.str.len_chars())
        return _patched(
            lines.str.slice(found), wide, lambda w: lines.gather(w).str.replace(rf"^.*?({ENVELOPE_START})", "$1")
        )

    return _patched(text.zip_with(at_start, _nulls(text)), ~at_start, search)


def _dated(stamps: pl.Series) -> pl.Series:
    """Stamps whose year a nanosecond time can hold (see lines.within_datetime_range), others null."""
    return pl.select(within_datetime_range(pl.lit(stamps))).to_series()


_ANY_STAMP = rf"({_TS}(?:[,.]\d{{3}})?)"


def _search_stamps(envelopes: pl.Series) -> pl.Series:
    """The local time in envelopes of any shape (v0.1's has no milliseconds, loguru's has a `.`)."""
    stamp = _dated(envelopes.str.extract(_ANY_STAMP, 1).str.replace(".", ",", literal=True))
    with_ms = stamp.str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S,%3f", strict=False)
    return with_ms.fill_null(stamp.str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S", strict=False))


def split_envelope(chunk: pl.DataFrame, rank: int | pl.Series | None = None) -> pl.DataFrame:
    """Columns line, host, ts (UTC), ts_text (the stamp as printed), rank, prefix ("deepspeed",
    "foreign" or null), body.

    `rank` is that of the lines that name none (a per-rank log's; per line, for a batch of files).
    Vectorized in cheap steps (anchored regexes, literal finds, slices), searching only the few lines
    that do not have the common shape: one regex with capture groups over every line costs ten times more."""
    text = chunk["text"]
    rest = text.str.replace(LAUNCHER_TAG, "")
    tag = byte_slice(text, 0, text.str.len_bytes() - rest.str.len_bytes())  # what the anchored replace took off
    colon = tag.str.find(": ", literal=True)
    host = pl.select(pl.when(colon.is_not_null()).then(byte_slice(pl.lit(tag), 0, pl.lit(colon)))).to_series()
    # `steps: 100 loss: ...` (the pipeline engine's bare print) is not a host called "steps"
    pipe = (host == "steps").fill_null(False)
    if pipe.any():
        pipe &= rest.str.contains(r"^\d+ loss: ")
        rest, host = text.zip_with(pipe, rest), _nulls(host).zip_with(pipe, host)
    envelope = _envelope(rest)
    # DeepSpeed 0.19 prints its timer lines as bare `[Rank 1] time (ms) | ...`: no envelope, the rank tag still there
    message = envelope.str.replace(ENVELOPE, "").fill_null(rest)
    ranked = message.str.starts_with("[Rank ").fill_null(False)
    rank_end = message.str.find("] ", literal=True)
    # DeepSpeed's logger (v0.2+) has its stamp at a fixed place; other envelopes are a few lines, searched
    fixed = envelope.str.slice(1, 23)
    ts = _dated(fixed).str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S,%3f", strict=False)
    others = ts.is_null() & envelope.is_not_null()
    ts = _patched(ts, others, lambda rows: _search_stamps(envelope.gather(rows)))
    printed = _patched(fixed, others, lambda rows: envelope.gather(rows).str.extract(_ANY_STAMP, 1))
    prefix = pl.repeat("deepspeed", text.len(), eager=True).zip_with(envelope.is_not_null(), _nulls(text))
    body = byte_slice(message, rank_end + 2).zip_with(ranked, message).fill_null(rest)
    at = glued.line_starts(body)  # a glued line's next line is not this body's (one that starts the body is the body)
    body, _ = glued.cut(body, at.zip_with(at > 0, _nulls(at, pl.UInt32)))
    return pl.DataFrame(
        {
            "line": chunk["line"],
            "host": host,
            "ts": ts.dt.replace_time_zone("UTC"),
            "ts_text": printed.zip_with(ts.is_not_null(), _nulls(printed)),  # as printed, where a time was read
            "rank": byte_slice(message.zip_with(ranked, _nulls(message)), 6, rank_end.cast(pl.Int64, strict=False) - 6)
            .zip_with(ranked, _nulls(message))
            .cast(pl.Int64, strict=False)
            .fill_null(tag.str.extract(TAG_RANK, 1).cast(pl.Int64, strict=False))
            .fill_null(rank if isinstance(rank, pl.Series) else pl.lit(rank, pl.Int64)),
            "prefix": _patched(
                prefix,
                others,
                lambda rows: (
                    envelope.gather(rows).str.contains(FOREIGN).replace_strict({True: "foreign", False: "deepspeed"})
                ),
            ),
            "body": body,
        }
    )


# ---------------------------------------------------------------- kinds (grammar.HEADS)

NOISE = {"overflow", "chatter", "blank"}  # known, but nothing to keep: IGNORED

# A line can be DeepSpeed's only if it has a logger envelope or starts (after a pdsh tag) like a kind
# printed without one: a cheap test that spares the full reading of the NCCL and application lines.
CANDIDATE = (
    ENVELOPE_START
    + "|"
    + LAUNCHER_TAG
    + r"(?:\[Rank -?\d+\] )?(?:"
    + "|".join(head.removeprefix("^") for head, printed_bare in HEADS.values() if printed_bare)
    + ")"
)


_BARE_HEADS = "|".join(head.removeprefix("^") for head, printed_bare in HEADS.values() if printed_bare)
_AT_START = rf"{LAUNCHER_TAG}(?:{ENVELOPE_START}|(?:\[Rank -?\d+\] )?(?:{_BARE_HEADS}))"


def candidate_lines(text: pl.Series) -> pl.Series:
    """`text.str.contains(CANDIDATE)`, cheaper: the envelope anywhere in a line is searched only in
    lines that do not have it (or a bare head) right after the launcher tag and that hold a time
    stamp, which every envelope does (an unanchored search over every NCCL line costs the most)."""
    hit = text.str.contains(_AT_START)
    rows = (~hit & text.str.contains(_TS)).arg_true()
    return hit.scatter(rows, text.gather(rows).str.contains(ENVELOPE_START)) if rows.len() else hit


def may_open_block(text: pl.Series) -> bool:
    """Whether a line may open a multi-line record (see BLOCKS): a chunk with one is read in full."""
    json_open = text.str.strip_chars_end().str.tail(1).is_in(["{", "["])
    return (
        text.str.contains("configuration:", literal=True) | text.str.contains("Comm. Op", literal=True) | json_open
    ).any()


# Continuation lines (no prefix) of multi-line records: block -> (openers, line shapes -> kind)
_INDENTED = r"^(?:\s+\S|[}\]])"
BLOCKS: dict[str, tuple[pl.Expr, dict[str, str]]] = {
    # the v0.1 echo (entries without a prefix) and JSON values (`  json = {` ... `}`)
    "indented": (
        (pl.col("kind") == "config_header")
        | ((pl.col("kind") == "config_entry") & pl.col("body").str.contains(r"[{\[]\s*$")),
        {"config_entry": HEADS["config_entry"][0], "json_line": _INDENTED},
    ),
    # log_summary(): op name lines and 20-character-cell rows, banners before the straggler table
    "comms": (
        pl.col("kind") == "comms_header",
        {
            "comms_op": r"^[A-Za-z_][\w.]*(?: \| \[Caller Func: [^\]\s]+\])? *$",
            "comms_row": r"^ {2,}\d",
            "straggler_banner": r"^(?:_{5,}|-{5,}|Breakdown with straggler effect) *$",
        },
    ),
}

# ---------------------------------------------------------------- hot kinds: vectorized

N = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
# The progress line's lists as the grammar reads them (numbers, and lists or tuples of numbers, blanks
# anywhere): a line whose lists are malformed is one the grammar refuses, so the regex refuses it too.
_S = r"[ \t]*"
_FLAT = rf"(?:\[{_S}(?:{N}(?:{_S},{_S}{N})*)?{_S}\]|\({_S}(?:{N}(?:{_S},{_S}{N})*)?{_S}\))"
_ITEM = rf"(?:{N}|{_FLAT})"
_LIST = rf"\[{_S}(?:{_ITEM}(?:{_S},{_S}{_ITEM})*)?{_S}\]"
_LR = rf"\[{_S}(?:(?:(?P<lr>{N})|{_FLAT})(?:{_S},{_S}{_ITEM})*)?{_S}\]"  # the first learning rate kept
HOT: dict[str, str] = {
    "progress": rf"^(?:rank:(?P<rank0>\d+) )?step=(?P<step>\d+), skipped=(?P<skipped>\d+), lr={_LR}, mom={_LIST} *$",
    "timers": rf"^(?:rank=(?P<rank0>-?\d+) )?time \(ms\)(?: \| [A-Za-z_][\w.]*: {N})+ *$",
    "throughput": (
        r"^(?:epoch=(?P<epoch>\d+)/micro_step=(?P<micro_step>\d+)/global_step=(?P<step>\d+)"
        r"|(?P<epoch_v07>\d+)/(?P<step_v07>\d+)), "
        rf"(?:RunningAvgSamplesPerSec=(?P<avg>{N}), CurrSamplesPerSec=(?P<curr>{N})|SamplesPerSec=(?P<avg_v06>{N}))"
        rf"(?:, MemAllocated={N}GB, MaxMemAllocated={N}GB)?(?:, vm percent: {N}, swap percent: {N})? *$"
    ),
    "pipe_step": (
        rf"^steps: (?P<step>\d+) loss: {N}(?: [A-Za-z_][\w.]*: {N})* iter time \(s\): "
        rf"(?P<iter_s>{N}) samples/sec: (?P<sps>{N}) *$"
    ),
    "iteration": r"^ *iteration +(?P<step>\d+)/ *\d+ *(?:\| *[A-Za-z][^:|]*:[^|]+)*\|? *$",
    "comm_op": (
        r"^(?:rank=(?P<rank0>-?\d+) \| )?comm op: (?P<op>[A-Za-z_][\w.]*)"
        r"(?: \| \[Caller Func: (?P<caller>[^\]\s]+)\])?"
        rf" \| time \(ms\): (?P<latency>{N}) \| msg size: (?P<size>{N}) ?(?P<unit>[KMGTPEZY]?B)"
        rf" \| algbw \(Gbps\): (?P<algbw>{N}) +\| busbw \(Gbps\): (?P<busbw>{N}) *$"
    ),
}

# Timer names, both schemes (0.10.1 shortened them), `_microstep` suffix optional -> steps column
TIMERS = {
    "fwd_ms": ("fwd", "forward"),
    "bwd_ms": ("bwd", "backward"),
    "bwd_inner_ms": ("bwd_inner", "backward_inner"),
    "bwd_allreduce_ms": ("bwd_allreduce", "backward_allreduce"),
    "step_ms": ("step",),
    "optimizer_allgather_ms": ("optimizer_allgather",),
    "optimizer_gradients_ms": ("optimizer_gradients",),
    "optimizer_step_ms": ("optimizer_step",),
}
# Megatron iteration fields -> steps column
MEGATRON = {
    "iter_ms": "elapsed time per iteration (ms)",
    "lr": "learning rate",
    "samples_per_sec": "samples per second",
    "skipped_iterations": "number of skipped iterations",
}


def timer_column(name: str) -> str | None:
    """The steps column of a timer name (`fwd_microstep`, `forward`, ...), None for others."""
    base = name.removesuffix("_microstep")
    return next((col for col, names in TIMERS.items() if base in names), None)


def msg_bytes(size: pl.Expr, unit: pl.Expr) -> pl.Expr:
    scale = unit.replace_strict(SIZE_UNITS, [float(1024**i) for i in range(len(SIZE_UNITS))], return_dtype=pl.Float64)
    return (number(size) * scale).round(0).cast(pl.Int64, strict=False)


def _int(text: pl.Expr) -> pl.Expr:
    return text.cast(pl.Int64, strict=False)


def _hot_fields(kind: str) -> dict[str, tuple[pl.Expr, Callable[[pl.Expr], pl.Expr]]]:
    """The numbers a hot kind's body holds: column -> (its text, how it is read)."""
    col = pl.col
    if kind == "progress":
        return {"step": (col("step"), _int), "skipped": (col("skipped"), _int), "lr": (col("lr"), number)}
    if kind == "throughput":
        return {
            "epoch": (pl.coalesce("epoch", "epoch_v07"), _int),
            "micro_step": (col("micro_step"), _int),
            "step": (pl.coalesce("step", "step_v07"), _int),
            "samples_per_sec": (col("curr"), number),
            "avg_samples_per_sec": (pl.coalesce("avg", "avg_v06"), number),
        }
    if kind == "pipe_step":
        return {
            "step": (col("step"), _int),
            "iter_ms": (col("iter_s"), number),
            "samples_per_sec": (col("sps"), number),
        }
    if kind == "iteration":
        megatron = {
            c: (col("body").str.extract(rf"\| *{_escape(label)}: *({N}) *(?:\||$)", 1), number)
            for c, label in MEGATRON.items()
        }
        return {"step": (col("step"), _int), **megatron}
    return {  # comm_op
        "latency_ms": (col("latency"), number),
        "msg_bytes": (col("size"), number),
        "algbw_gbps": (col("algbw"), number),
        "busbw_gbps": (col("busbw"), number),
    }


def extract_hot(kind: str, recs: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """Fields of the hot `kind` from records (line, host, ts, rank, body) known to match HOT[kind], and
    the lines of records with a bad value (a number out of range): those are left out."""
    if kind == "timers":
        return _timers(recs)
    groups = recs.with_columns(pl.col("body").str.extract_groups(HOT[kind]).alias("g")).unnest("g")
    rank = (
        pl.coalesce(pl.col("rank0").cast(pl.Int64, strict=False), pl.col("rank"))
        if "rank0" in groups.columns
        else pl.col("rank")
    )
    base = [pl.col("line"), pl.col("host"), pl.col("ts"), pl.col("ts_text"), rank.alias("rank")]
    if kind != "comm_op":  # the text a step row shows as its evidence
        base.append(pl.col("body"))
    fields = _hot_fields(kind)
    read = {name: parse(text) for name, (text, parse) in fields.items()}
    bad = pl.any_horizontal(text.is_not_null() & read[name].is_null() for name, (text, _) in fields.items())
    if kind == "progress":  # the grammar refuses the line for any number of its lists out of range, not only lr's first
        lists = pl.col("body").str.extract(r"lr=(\[.*)$", 1).str.extract_all(N)
        bad = bad | lists.list.eval(number(pl.element()).is_null()).list.any()
    if kind == "pipe_step":
        read["iter_ms"] = read["iter_ms"] * 1000
    elif kind == "comm_op":
        read = {"op": pl.col("op"), "caller": pl.col("caller"), **read}
        read["msg_bytes"] = msg_bytes(pl.col("size"), pl.col("unit"))
    rows = groups.select(*base, *(value.alias(name) for name, value in read.items()), bad.alias("_bad"))
    return rows.filter(~pl.col("_bad")).drop("_bad"), rows.filter(pl.col("_bad"))["line"]


def _timers(recs: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """Timer records: the bodies split into their cells, not one regex per column (see _timer_columns)."""
    body = pl.col("body")
    columns, bad = _timer_columns(recs["body"])
    rows = recs.select(
        "line",
        "host",
        "ts",
        "ts_text",
        body.str.extract(r"^rank=(-?\d+) ", 1).cast(pl.Int64, strict=False).fill_null(pl.col("rank")).alias("rank"),
        body,
        _timer_role(body).alias("role"),
    ).with_columns(**columns)
    return rows.filter(~bad), rows.filter(bad)["line"]


def _timer_columns(body: pl.Series) -> tuple[dict[str, pl.Series], pl.Series]:
    """The TIMERS columns of timer bodies, and which bodies hold a bad value. After `time (ms) | `,
    a body is `name: value` cells joined by ` | `."""
    cells = byte_slice(body, body.str.find("time (ms) | ", literal=True) + len("time (ms) | "))
    return _same_cells(cells) or _any_cells(cells)


def _same_cells(cells: pl.Series) -> tuple[dict[str, pl.Series], pl.Series] | None:
    """_timer_columns where every body has the first one's timers in its order (a log prints the same
    timers at every step): each cell a column of its own, no tokens exploded; None for other bodies."""
    first = cells[0] if cells.len() else None
    if first is None:
        return None
    names = [cell.split(": ")[0] for cell in first.split(" | ")]
    taken = [timer_column(name) for name in names]
    if len({c for c in taken if c is not None}) < sum(c is not None for c in taken):
        return None  # a column given twice: the general reading decides which value it keeps
    parts = cells.str.split_exact(" | ", len(names)).struct.unnest()  # one field more: null where no extra cell
    if parts[:, len(names)].null_count() != cells.len() or parts[:, len(names) - 1].null_count():
        return None
    columns = {col: _nulls(cells, pl.Float64) for col in TIMERS}
    bad = pl.repeat(False, cells.len(), eager=True)
    for i, (name, col) in enumerate(zip(names, taken, strict=True)):
        cell = parts[:, i]
        if not cell.str.starts_with(f"{name}: ").all():
            return None
        text = cell.str.strip_prefix(f"{name}: ")
        value = pl.select(number(pl.lit(text))).to_series()
        bad |= value.is_null() & text.is_not_null()
        if col is not None:
            columns[col] = value.alias(col)
    return columns, bad


def _any_cells(cells: pl.Series) -> tuple[dict[str, pl.Series], pl.Series]:
    """_timer_columns for bodies of any timers: as one list of tokens, they alternate name, value. The
    distinct names are mapped to their columns once, the values scattered back to their bodies' rows."""
    tokens = (
        pl.DataFrame({"token": cells.str.replace_all(" | ", ": ", literal=True).str.split(": ")})
        .with_row_index("row")
        .explode("token")
    )
    row, name, text = (
        tokens["row"].gather_every(2),
        tokens["token"].gather_every(2),
        tokens["token"].gather_every(2, 1),
    )
    column = name.replace_strict({n: timer_column(n) for n in name.unique()}, return_dtype=pl.String)
    value = pl.select(number(pl.lit(text))).to_series()
    bad = pl.repeat(False, cells.len(), eager=True).scatter(row.filter(value.is_null() & text.is_not_null()), True)
    columns = {
        col: _nulls(cells, pl.Float64).scatter(row.filter(column == col), value.filter(column == col)) for col in TIMERS
    }
    return columns, bad


def _timer_role(body: pl.Expr) -> pl.Expr:
    """micro (every micro-step), global (per optimizer step), optimizer (ZeRO) or other (pipeline)."""
    step_timers = "|".join(TIMERS["fwd_ms"] + TIMERS["bwd_ms"] + TIMERS["step_ms"])
    return (
        pl.when(body.str.contains("_microstep: ", literal=True))
        .then(pl.lit("micro"))
        .when(body.str.contains(rf"\| (?:{step_timers}): "))
        .then(pl.lit("global"))
        .when(body.str.contains("| optimizer_", literal=True))
        .then(pl.lit("optimizer"))
        .otherwise(pl.lit("other"))
    )


def _escape(label: str) -> str:
    return label.replace("(", r"\(").replace(")", r"\)")


# ---------------------------------------------------------------- the line parser


def _hot_ok(recs: pl.DataFrame) -> pl.Series:
    """Whether each record of a hot kind matches its HOT pattern (each pattern runs on its kind's records only)."""
    ok = pl.repeat(False, recs.height, eager=True).alias("ok")
    for kind in set(HOT) & set(recs["kind"].unique().to_list()):
        rows = (recs["kind"] == kind).fill_null(False).arg_true()
        ok.scatter(rows, recs["body"].gather(rows).str.contains(HOT[kind]))
    return ok


def classify(recs: pl.DataFrame) -> pl.Expr:
    """The kind of each record by its body's first words; null when none fits."""
    bare = pl.col("prefix").is_null()
    kind = pl.when(pl.col("prefix").is_not_null() & (pl.col("body").str.strip_chars() == "")).then(pl.lit("blank"))
    for name, (head, printed_bare) in HEADS.items():
        matches = pl.col("body").str.contains(head)
        kind = kind.when(matches if printed_bare else matches & ~bare).then(pl.lit(name))
    return kind.otherwise(None)


@line_format("deepspeed", candidates=(CANDIDATE,), spills=True, reads_names=True)
class DeepSpeedParser:
    """One per file, or per batch of small files (`files`, their lines keyed by file, lines.FILE_SHIFT):
    `feed` each chunk in order, then `finish` adds steps, comm_ops and deepspeed_settings."""

    def __init__(self, source: InputFile, spill: Spill | None = None, files: list[InputFile] | None = None) -> None:
        self.source = source
        # the rank of the lines that name none, by the file they are in
        self._ranks = pl.Series([file_rank(f.name) for f in files or [source]], dtype=pl.Int64)
        self._spill = spill  # where the step lines' text goes, when set: the bulk of a training log's records
        self._hot: dict[str, list[pl.DataFrame]] = {kind: [] for kind in HOT}
        self._cold: list[pl.DataFrame] = []
        self._parsed: dict[tuple[str, str], dict | None] = {}
        self._open: dict[str, int | None] = {block: None for block in BLOCKS}  # block still open at chunk end

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        """Claim the chunk's DeepSpeed lines; only candidate lines are read, unless a block is open."""
        block_open = any(owner is not None for owner in self._open.values())
        candidates = candidate_lines(chunk["text"])
        if not block_open and not candidates.any():  # an NCCL or application chunk: nothing to read
            return pl.repeat(NOT_MINE, chunk.height, dtype=pl.UInt8, eager=True)
        if block_open or may_open_block(chunk.filter(candidates)["text"]):
            return self._feed(chunk)  # continuation lines look like anything: read every line
        status = self._feed(chunk.filter(candidates))
        return pl.Series(chunk.height * [NOT_MINE], dtype=pl.UInt8).scatter(candidates.arg_true(), status)

    def _feed(self, chunk: pl.DataFrame) -> pl.Series:
        recs = split_envelope(chunk, self._ranks.gather(chunk.select(file_of(pl.col("line"))).to_series()))
        recs = recs.with_columns(classify(recs).alias("kind"))
        recs = self._continuations(recs)
        recs = recs.with_columns(ok=_hot_ok(recs) | self._parse_cold(recs))
        kept = recs.filter(pl.col("ok") & ~pl.col("kind").is_in(NOISE))
        present = set(kept["kind"].unique().to_list())  # a chunk has one or two of the six hot kinds
        bad: list[pl.Series] = []
        for kind in (kind for kind in HOT if kind in present):
            hot, bad_lines = extract_hot(kind, kept.filter(pl.col("kind") == kind))
            bad.append(bad_lines)
            if self._spill is not None and kind in assemble.STEP_SOURCES:  # assembled from disk (assemble)
                self._spill.write(assemble.ROWS + kind, hot)
            else:
                self._hot[kind].append(hot)
        cold = kept.filter(~pl.col("kind").is_in(list(HOT)))
        if cold.height:
            self._cold.append(cold.select("line", "host", "ts", "ts_text", "rank", "kind", "body", "owner"))
        status = (
            pl.when(pl.col("ok") & pl.col("kind").is_in(NOISE))
            .then(IGNORED)
            .when(pl.col("ok") & ~pl.col("line").is_in(pl.concat([pl.Series([], dtype=pl.Int64), *bad]).implode()))
            .then(PARSED)
            .when(pl.col("kind").is_not_null() | (pl.col("prefix") == "deepspeed"))
            .then(UNRECOGNIZED)
            .otherwise(NOT_MINE)
        )
        return recs.select(status.cast(pl.UInt8, strict=False)).to_series()

    def _continuations(self, recs: pl.DataFrame) -> pl.DataFrame:
        """Give prefix-less continuation lines the kind of their shape and the line of their opener."""
        recs = recs.with_columns(pl.lit(None, pl.Int64).alias("owner"))
        for block, (opens, shapes) in BLOCKS.items():
            opens = opens.fill_null(False)
            if self._open[block] is None and not recs.select(opens.any()).item():
                continue  # nothing to continue in this chunk
            bare = pl.col("prefix").is_null()
            shape = pl.lit(None, pl.String)
            for kind, pattern in reversed(shapes.items()):
                shape = pl.when(bare & pl.col("body").str.contains(pattern)).then(pl.lit(kind)).otherwise(shape)
            cont = shape.is_not_null() & ~opens
            runs = recs.with_columns(
                shape.alias("shape"),
                cont.alias("cont"),
                pl.when(opens).then(pl.col("line")).alias("opener"),
                (~cont).cum_sum().alias("run"),
            )
            # a run is a non-continuation line and the continuation lines after it; run 0 is
            # what continues from the previous chunk
            first = pl.col("opener").first().over("run")
            runs = runs.with_columns(
                pl.when(pl.col("run") == 0).then(pl.lit(self._open[block])).otherwise(first).alias("block")
            )
            last = runs.row(-1, named=True) if runs.height else None
            self._open[block] = last["block"] if last and (last["cont"] or last["opener"] is not None) else None
            inside = pl.col("cont") & pl.col("block").is_not_null()
            recs = runs.select(
                *(c for c in recs.columns if c not in ("kind", "owner")),
                pl.when(inside).then(pl.col("shape")).otherwise(pl.col("kind")).alias("kind"),
                pl.when(inside).then(pl.col("block")).otherwise(pl.col("owner")).alias("owner"),
            )
        return recs

    def _parse_cold(self, recs: pl.DataFrame) -> pl.Series:
        """Parse the distinct bodies of the grammar-read kinds; whether each record is one that parsed."""
        is_cold = (recs["kind"].is_not_null() & ~recs["kind"].is_in(list(HOT))).alias("ok")
        cold = recs.select("kind", "body").filter(is_cold)  # two columns filtered, not the whole frame
        # Noise is only counted, and its rules read numbers as numbers: one parse per shape (numbers
        # masked, shapes.py) tells every body of it, however many loss-scale lines a run prints.
        by_shape = cold["kind"].is_in(list(NOISE)) & ~cold["body"].str.contains(MARK, literal=True)
        if by_shape.any():
            cold = cold.with_columns(key=cold["body"].zip_with(~by_shape, masked(cold["body"])))
        else:
            cold = cold.with_columns(key=pl.col("body"))
        firsts = cold.unique(["kind", "key"], keep="first", maintain_order=True)
        for kind, key, body in firsts.select("kind", "key", "body").iter_rows():
            if (kind, key) not in self._parsed:
                self._parsed[(kind, key)] = {} if kind in ("json_line", "blank") else parse_body(kind, body)
        good = [f"{k}\x00{b}" for (k, b), parsed in self._parsed.items() if parsed is not None]
        parsed = cold.select(pl.concat_str("kind", pl.lit("\x00"), "key").is_in(good)).to_series()
        return is_cold.scatter(is_cold.arg_true(), parsed)

    def finish(self, result: IngestResult) -> None:
        hot = {kind: pl.concat(parts) for kind, parts in self._hot.items() if parts}
        cold = pl.concat(self._cold) if self._cold else None
        for name, frame in assemble.tables(self.source, hot, cold, self._parsed, self._spill).items():
            result.add(name, frame)
