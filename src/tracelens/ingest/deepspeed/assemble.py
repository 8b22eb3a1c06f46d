"""DeepSpeed records -> the steps, comm_ops and deepspeed_settings tables of one file.

`log.DeepSpeedParser` reads the lines (`grammar` the bodies); this module puts the records of a whole
file together, because a step's facts are spread over several lines:

- `step=N` (progress), the ThroughputTimer line (`global_step=N`), Megatron's `iteration
  N` and the pipeline engine's `steps: N` name their step. Timer lines do not: a global
  timer line belongs to the step of the progress line before it (the n-th one after
  `step=N` to step N+n-1), a ZeRO `optimizer_*` line to the step it precedes; with no
  progress line before, counting back from the next one; with none at all, by count.
  Micro-step timer lines are kept only where no global ones exist (the global line holds
  their sum over the accumulation window).
- Several engines in one log (RLHF actor and critic, DPO actor and reference) print
  their own progress lines with the same step numbers: the n-th `step=N` line of a rank
  is engine n-1. Timer, throughput and Megatron lines go with the engine whose progress
  line came last.
- All lines of one (host, rank, engine, step) become one row; lines without a rank
  (ThroughputTimer, plain prints) are rank 0's, the only rank that prints them.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import polars as pl

from tracelens.ingest import InputFile
from tracelens.ingest.deepspeed.grammar import parse_body
from tracelens.ingest.text.lines import file_of
from tracelens.tables import Frame, Spill

STEP_SOURCES = ("progress", "timers", "throughput", "iteration", "pipe_step")
STEP_COLUMNS = [
    "skipped", "lr", "samples_per_sec", "avg_samples_per_sec", "epoch", "micro_step", "iter_ms",
    "fwd_ms", "bwd_ms", "bwd_inner_ms", "bwd_allreduce_ms", "step_ms",
    "optimizer_allgather_ms", "optimizer_gradients_ms", "optimizer_step_ms",
]  # fmt: skip
F = TypeVar("F", pl.DataFrame, pl.LazyFrame)
# Where the row's time comes from, most telling first: its `message` is that line's text
MESSAGE_PRIORITY = {"timers": 0, "iteration": 1, "pipe_step": 2, "progress": 3, "throughput": 4}


ROWS = "ds_rows_"  # + a step kind: a big file's step records (with their text), spilled chunk by chunk
PIECE_ROWS = 1 << 18  # a big file's step records are assembled about this many at a time, in line order
# one rank's lines in one file (_file: of a batch of small files read as one; rank_key: a line that
# names no rank is rank 0's)
STREAM = ["_file", "host", "rank_key"]
KEY = [*STREAM, "engine", "step"]  # one step row


def tables(
    source: InputFile,
    hot: dict[str, pl.DataFrame],
    cold: pl.DataFrame | None,
    parsed: dict,
    spill: Spill | None = None,
) -> dict[str, Frame]:
    """The file's tables from its hot records (per kind) and grammar-read records. With `spill` (a big
    file's parser), the step records and their text were written there chunk by chunk instead: the
    steps are then assembled from it (spilled_steps) and come back as a lazy scan."""
    provenance = [
        pl.lit(source.name).alias("file"),
        pl.col("ts").is_not_null().replace_strict({True: "exact", False: "none"}).alias("ts_quality"),
    ]
    out: dict[str, Frame] = {
        "comm_ops": comm_ops(hot.get("comm_op"), cold, parsed),
        "deepspeed_settings": deepspeed_settings(cold, parsed),
    }
    out = {name: frame.with_columns(provenance) for name, frame in out.items() if frame.height}
    merged = spilled_steps(spill) if spill is not None else steps(hot)
    if merged is not None:
        out["steps"] = merged.with_columns(provenance)
    return out


def steps(hot: dict[str, pl.DataFrame]) -> pl.DataFrame | None:
    """One row per logged step: the progress, throughput, timer and Megatron lines of one step,
    which DeepSpeed prints separately, merged by stream (host, rank), engine and step, with the text
    of the line its timing comes from (`message`). None when the file logs no step."""
    rows = _tagged(hot)
    if rows is None:
        return None
    rows = _in_line_order(rows)
    merged = _merged(_assembled(rows, _stream_facts(rows), None))
    if not merged.height:
        return None
    bodies = pl.concat([part.select("line", "body") for part in hot.values() if "body" in part.columns])
    return _finished(_with_text(merged, bodies))


def spilled_steps(spill: Spill) -> pl.LazyFrame | None:
    """A big file's steps from its spilled step records, in memory that follows PIECE_ROWS records, not
    the file nor its biggest stream: the records are assembled a range of lines at a time, each piece
    starting where the one before left every stream (_StreamCarry), with what a stream's steps need from all
    of it read first (_stream_facts). The pieces' rows, written back, are merged in line order, a step
    whose lines fell in two pieces joined into one row: exactly the rows `steps` gives over the file."""
    parts = {kind: spill.parts[ROWS + kind] for kind in STEP_SOURCES if ROWS + kind in spill.parts}
    if not parts:
        return None
    facts = _stream_facts(_tagged({kind: _scan(paths).drop("body") for kind, paths in parts.items()}))
    carry: _StreamCarry | None = None
    written = []
    for in_piece, holding in _pieces(parts):
        # read once, text and all: a second, filtered read of the text cost more than holding a piece's
        kinds = {kind: _scan(paths).filter(in_piece).collect() for kind, paths in holding.items()}
        rows = _tagged({kind: frame.drop("body") for kind, frame in kinds.items()})
        if rows is None:
            continue
        assembled = _assembled(_in_line_order(rows), facts, carry)
        carry = _carried(assembled, carry)
        bodies = pl.concat([frame.select("line", "body") for frame in kinds.values()])
        written.append(spill.write("steps", _with_text(_merged(assembled), bodies)))
    return _rejoined(spill, [path for path in written if path is not None])


def _scan(paths: list[Path]) -> pl.LazyFrame:
    """Spilled parts of one kind as one scan (a chunk without some column wrote none)."""
    return pl.concat([pl.scan_parquet(path) for path in paths], how="diagonal_relaxed")


def _pieces(parts: dict[str, list[Path]]) -> Iterator[tuple[pl.Expr, dict[str, list[Path]]]]:
    """Ranges of lines of about PIECE_ROWS records each, cut where a part begins (a part holds one chunk's
    records of a kind, so a range holds at most a part more): a filter for each range's lines, and the
    parts, per kind, that hold some (a piece reads those alone: reading every part per piece made the
    assembly quadratic in the file's size)."""
    line = pl.col("line")
    spans = pl.concat(
        pl.scan_parquet(path).select(
            kind=pl.lit(kind), path=pl.lit(str(path)), first=line.min(), last=line.max(), rows=pl.len()
        )
        for kind, paths in parts.items()
        for path in paths
    )
    spans = spans.collect().sort("first")
    cuts: list[int] = []
    since = PIECE_ROWS
    for first, rows in spans.select("first", "rows").iter_rows():
        if since >= PIECE_ROWS:
            cuts.append(first)
            since = 0
        since += rows
    for lo, hi in zip(cuts, [*cuts[1:], None]):
        in_piece = (line >= lo) if hi is None else (line >= lo) & (line < hi)
        holding = spans.filter((pl.col("last") >= lo) & (pl.col("first") < hi if hi is not None else True))
        yield (
            in_piece,
            {kind: [Path(p) for p in paths] for kind, paths in holding.group_by("kind").agg("path").iter_rows()},
        )


def _rejoined(spill: Spill, written: list[Path]) -> pl.LazyFrame | None:
    """The steps table from the pieces' rows (each piece's in line order, and after the one before), a
    step whose lines fell in two pieces (its progress line at the end of one, its timer line at the
    start of the next) merged into one row again."""
    if not written:
        return None
    rows = pl.concat([pl.scan_parquet(path) for path in written])
    # candidates by a hash of the key (a group-by on the key itself would hold every step's key);
    # merging a candidate that is no half leaves it as it is, so a collision costs nothing
    hashed = pl.struct(KEY).hash()
    twice = rows.group_by(hashed.alias("key")).len().filter(pl.col("len") > 1).collect(engine="streaming")
    halves = rows.filter(hashed.is_in(twice["key"].implode())).collect(engine="streaming").sort("line")
    if halves.height:
        texts = halves.select("message_line", "message")
        joined = _merged(halves).join(texts, on="message_line", how="left", maintain_order="left")
        # a row's first line is no other row's: the halves are filtered out by it, which streams in order
        # (an anti-join on the key would hold every row)
        kept = rows.filter(~pl.col("line").is_in(halves["line"].implode()))
        rows = kept.merge_sorted(pl.scan_parquet(spill.write("steps", joined)), key="line")
    return _finished(rows)


def _with_text(merged: pl.DataFrame, bodies: pl.DataFrame) -> pl.DataFrame:
    """Step rows with the text of the line their timing comes from (`message`, joined on `message_line`)."""
    text = bodies.select(message_line="line", message="body")
    return merged.join(text, on="message_line", how="left", maintain_order="left")


def _collected(query: pl.LazyFrame, source: Frame) -> pl.DataFrame:
    """`query` over `source`, collected by the streaming engine when `source` is spilled (a scan), in
    memory when it is a small file's DataFrame (the streaming engine's set-up would cost it more than the query)."""
    return query.collect(engine="in-memory" if isinstance(source, pl.DataFrame) else "streaming")


def _finished(merged: F) -> F:
    """The steps table's rows: without the assembly's keys, the engine as text."""
    return merged.drop("_file", "rank_key", "message_line", "_priority").with_columns(pl.col("engine").cast(pl.String))


# ---------------------------------------------------------------- steps


def _tagged(kinds: dict[str, F]) -> F | None:
    """The step records of every kind in one frame, each with its `source` (the kind) and `rank_key`."""
    parts = [kinds[kind].with_columns(source=pl.lit(kind)) for kind in STEP_SOURCES if kind in kinds]
    if not parts:
        return None
    rows = pl.concat(parts, how="diagonal_relaxed")
    names = rows.collect_schema().names()
    optional = {"role": pl.String, "skipped_iterations": pl.Float64, "skipped": pl.Int64, "step": pl.Int64}
    missing = [pl.lit(None, dtype).alias(col) for col, dtype in optional.items() if col not in names]
    return rows.with_columns(*missing, _file=file_of(pl.col("line")), rank_key=pl.col("rank").fill_null(0))


def _in_line_order(rows: pl.DataFrame) -> pl.DataFrame:
    """The records in line order, by a gather, not DataFrame.sort: the same rows, for about half the
    memory on top."""
    return rows[rows["line"].arg_sort()]


def _counted() -> pl.Expr:
    """1 for a timer line that stands for one step (global, or micro-step where no global ones are
    logged), 0 for any other record."""
    return ((pl.col("source") == "timers") & (pl.col("role") != "optimizer")).cast(pl.Int64, strict=False)


def _kept() -> pl.Expr:
    """Records of known roles, micro-step timer lines only in streams that log no global ones (the global
    line holds their sum over the accumulation window)."""
    role = pl.col("role")
    return role.is_null() | role.is_in(["global", "optimizer"]) | ((role == "micro") & ~pl.col("_has_global"))


def _stream_facts(records: Frame) -> pl.DataFrame:
    """What each stream's steps need from all of it, wherever a piece of it is assembled: whether it logs
    global timer lines, its first progress line and that line's step, and the number of counted timer
    lines before it (their steps are counted back from it). One query, _collected (each query
    is a fixed cost, paid once per small file of a folder of thousands)."""
    rows = records.lazy()
    first = (
        rows.filter(pl.col("source") == "progress")
        .group_by(STREAM)
        .agg(_first_line=pl.col("line").min(), _first_step=pl.col("step").sort_by("line").first())
    )
    has_global = rows.filter(pl.col("role") == "global").select(STREAM).unique().with_columns(_has_global=pl.lit(True))
    facts = first.join(has_global, on=STREAM, how="full", coalesce=True, nulls_equal=True)
    facts = facts.with_columns(pl.col("_has_global").fill_null(False))
    before_first = (
        rows.filter(pl.col("source") == "timers")
        .join(facts, on=STREAM, nulls_equal=True)
        .filter(_kept() & (_counted() == 1) & (pl.col("line") < pl.col("_first_line")))
    )
    counted = before_first.group_by(STREAM).agg(_before_first=pl.len().cast(pl.Int64))
    facts = facts.join(counted, on=STREAM, how="left", nulls_equal=True)
    return _collected(facts.with_columns(pl.col("_before_first").fill_null(0)), records)


@dataclass(frozen=True)
class _StreamCarry:
    """Where the records assembled so far left each stream, for the next piece: its engine, its last
    progress step and the counted timer lines since that and in all (`streams`), how many progress lines
    each of its step numbers had (`progress`: the n-th is engine n-1), and Megatron's skipped iterations
    so far per host and engine (`skipped`)."""

    streams: pl.DataFrame
    progress: pl.DataFrame
    skipped: pl.DataFrame


def _assembled(rows: pl.DataFrame, facts: pl.DataFrame, carry: _StreamCarry | None) -> pl.DataFrame:
    """The records of a piece (all of a file's, or a range of its lines), in line order, each with its
    engine and step, ready to merge, and what `_carried` reads of where the piece leaves each stream."""
    rows = rows.join(facts, on=STREAM, how="left", nulls_equal=True, maintain_order="left")
    rows = rows.with_columns(pl.col("_has_global").fill_null(False)).filter(_kept())
    rows = _engines(_at_start(rows, carry))
    rows = _timer_steps(rows)
    if carry is None:
        rows = rows.with_columns(_skipped0=pl.lit(0.0))
    else:
        rows = rows.join(carry.skipped, on=["host", "engine"], how="left", nulls_equal=True, maintain_order="left")
        rows = rows.with_columns(pl.col("_skipped0").fill_null(0.0))
    # Megatron counts skipped iterations per logging interval; `skipped` is cumulative
    skipped = pl.col("skipped_iterations").cum_sum().over("host", "engine") + pl.col("_skipped0")
    rows = rows.with_columns(pl.coalesce("skipped", skipped).cast(pl.Int64, strict=False).alias("skipped"))
    by_priority = (
        pl.when(pl.col("role") == "optimizer")
        .then(9)
        .otherwise(pl.col("source").replace_strict(MESSAGE_PRIORITY, return_dtype=pl.Int8))
    )
    return rows.with_columns(message_line="line", _priority=by_priority)


CARRIED = ["_engine0", "_since0", "_timers0", "_seen0"]  # counts a piece starts from, 0 in the first


def _at_start(rows: pl.DataFrame, carry: _StreamCarry | None) -> pl.DataFrame:
    """The records with where their stream stood when the piece began (nothing before the first piece)."""
    if carry is not None:
        rows = rows.join(carry.streams, on=STREAM, how="left", nulls_equal=True, maintain_order="left")
        rows = rows.join(carry.progress, on=[*STREAM, "step"], how="left", nulls_equal=True, maintain_order="left")
    else:
        rows = rows.with_columns(pl.lit(None, pl.Int64).alias("_last0"), *(pl.lit(0).alias(c) for c in CARRIED))
    return rows.with_columns(pl.col(c).fill_null(0).cast(pl.Int64) for c in CARRIED)


def _carried(rows: pl.DataFrame, carry: _StreamCarry | None) -> _StreamCarry:
    """Where this piece leaves each stream: the carry for the next one."""
    g, segment = pl.col("_g"), pl.col("_sf")
    before = pl.when(segment.max() == 0).then(pl.col("_since0").first()).otherwise(0)  # no progress line here
    streams = rows.group_by(STREAM, maintain_order=True).agg(
        _engine0=pl.col("engine").last(),
        _last0=pl.col("_last").last(),
        _since0=g.filter(segment == segment.max()).sum() + before,
        _timers0=pl.col("_timers0").first() + g.sum(),
    )
    progress = rows.filter(pl.col("source") == "progress").group_by(*STREAM, "step").agg(_seen0=pl.len().cast(pl.Int64))
    skipped = rows.group_by("host", "engine").agg(
        _skipped0=pl.col("_skipped0").first() + pl.col("skipped_iterations").sum()
    )
    if carry is not None:
        streams = pl.concat([carry.streams, streams]).unique(STREAM, keep="last", maintain_order=True)
        progress = pl.concat([carry.progress, progress]).group_by(*STREAM, "step").agg(pl.col("_seen0").sum())
        skipped = pl.concat([carry.skipped, skipped]).unique(["host", "engine"], keep="last", maintain_order=True)
    return _StreamCarry(streams, progress, skipped)


def _merged(rows: pl.DataFrame) -> pl.DataFrame:
    """The records (or pieces' rows) of one (host, rank, engine, step) in one row: the first value of each
    column in line order, the line the row's text comes from (`message_line`: the most telling source,
    MESSAGE_PRIORITY). Merging merged rows again gives the same row, which is what joins a split step."""
    present = [c for c in STEP_COLUMNS if c in rows.columns]
    return rows.group_by(KEY, maintain_order=True).agg(
        pl.col("line").min(),
        pl.col("ts").drop_nulls().first(),
        pl.col("ts_text").filter(pl.col("ts").is_not_null()).first(),  # that time as printed
        pl.col("rank").drop_nulls().first(),
        *(pl.col(c).drop_nulls().first() for c in present),
        pl.col("message_line").sort_by("_priority", maintain_order=True).first(),
        pl.col("_priority").min(),
    )


def _engines(rows: pl.DataFrame) -> pl.DataFrame:
    """Number the engines of each rank by repeats of its progress step numbers."""
    progress = pl.col("source") == "progress"
    repeat = pl.int_range(pl.len()).over(*STREAM, "step", "source") + pl.col("_seen0")
    engine = pl.when(progress).then(repeat).forward_fill().over(STREAM).fill_null(pl.col("_engine0"))
    return rows.with_columns(engine.alias("engine"))


def _timer_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """The step of each timer line, from the progress lines around it (see the module doc): after one, the
    last one's step plus the counted timer lines since it; before the first, that one's step less those
    still to come before it; in a stream without any, by count."""
    is_p = (pl.col("source") == "progress").cast(pl.Int64, strict=False)
    segment = is_p.cum_sum().over(STREAM)  # 0 until the piece's first progress line
    rows = rows.with_columns(
        _g=_counted(),
        _sf=segment,
        _last=pl.when(is_p == 1).then(pl.col("step")).forward_fill().over(STREAM).fill_null(pl.col("_last0")),
    )
    g = pl.col("_g")
    before = g.cum_sum().over(STREAM) - g + pl.col("_timers0")  # counted timer lines before this one
    since = g.cum_sum().over(*STREAM, "_sf") - g + pl.when(pl.col("_sf") == 0).then(pl.col("_since0")).otherwise(0)
    forward = pl.col("_last") + since
    backward = pl.col("_first_step") - (pl.col("_before_first") - before)
    counted = before + 1
    return rows.with_columns(
        pl.when(pl.col("source") == "timers")
        .then(pl.coalesce(forward, backward, counted))
        .otherwise(pl.col("step"))
        .cast(pl.Int64, strict=False)
        .alias("step")
    )


# ---------------------------------------------------------------- comm_ops


def comm_ops(verbose: pl.DataFrame | None, cold: pl.DataFrame | None, parsed: dict) -> pl.DataFrame:
    """Comms-logger records: verbose per-op lines and the summary and straggler tables, one row each."""
    parts = []
    if verbose is not None:
        parts.append(
            verbose.select(
                "line",
                "host",
                "ts",
                "ts_text",
                "rank",
                "op",
                "caller",
                "msg_bytes",
                pl.lit(1).alias("count"),
                pl.col("latency_ms").alias("total_ms"),
                pl.col("latency_ms").alias("avg_ms"),
                "algbw_gbps",
                "busbw_gbps",
                pl.lit("op").alias("kind"),
            )  # fmt: skip
        )
    if cold is not None:
        summary = _summary_rows(cold.filter(pl.col("kind").is_in(["comms_header", "comms_op", "comms_row"])), parsed)
        if summary:
            parts.append(pl.DataFrame(summary, infer_schema_length=None))
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _summary_rows(rows: pl.DataFrame, parsed: dict) -> list[dict]:
    """log_summary() tables: each row under its op name line and its table's header."""
    tables: dict[int, bool] = {}  # header line -> is the straggler table
    op: dict = {}
    out = []
    for r in rows.sort("line").iter_rows(named=True):
        fields = parsed[(r["kind"], r["body"])]
        if r["kind"] == "comms_header":
            tables[r["line"]] = fields["straggler"]
        elif r["kind"] == "comms_op":
            op = fields
        elif r["owner"] in tables:
            row = {"line": r["line"], "host": r["host"], "ts": r["ts"], "ts_text": r["ts_text"]}
            row |= {"op": op.get("op"), "caller": op.get("caller")}
            row |= {"msg_bytes": fields["msg_bytes"], "count": fields["count"], "total_ms": fields["c1"]}
            if tables[r["owner"]]:
                row |= {
                    "kind": "straggler",
                    "straggler_total_ms": fields["c2"],
                    "avg_ms": fields["c3"],
                    "straggler_avg_ms": fields["c4"],
                }
            else:
                row |= {
                    "kind": "summary",
                    "avg_ms": fields["c2"],
                    "algbw_gbps": fields["c3"],
                    "busbw_gbps": fields["c4"],
                }
            out.append(row)
    return out


# ---------------------------------------------------------------- config

CONFIG_KINDS = ["config_header", "config_entry", "json_line", "zero_init", "version", "launcher"]
ZERO = "zero_optimization"


def deepspeed_settings(cold: pl.DataFrame | None, parsed: dict) -> pl.DataFrame:
    """Settings as `key`/`value` strings. The echo's user JSON (`json = {...}`) and zero_config
    are flattened to the dotted keys of ds_config.json (`zero_optimization.overlap_comm`)."""
    if cold is None:
        return pl.DataFrame()
    rows = cold.filter(pl.col("kind").is_in(CONFIG_KINDS)).sort("line").with_columns(_file=file_of(pl.col("line")))
    out = [row for part in rows.partition_by("_file", maintain_order=True) for row in _file_settings(part, parsed)]
    return pl.DataFrame(out, infer_schema_length=None) if out else pl.DataFrame()


def _file_settings(rows: pl.DataFrame, parsed: dict) -> list[dict]:
    """The settings of one file's config records, in line order (its engines numbered from 0)."""
    out: list[dict] = []
    engine = -1
    pending: tuple[dict, str, list[str]] | None = None  # an entry whose JSON value continues

    def emit(r: dict, key: str, value, source: str, eng: int | None = None) -> None:
        out.append(
            {
                "line": r["line"],
                "host": r["host"],
                "ts": r["ts"],
                "ts_text": r["ts_text"],
                "engine": None if eng is None else str(eng),
                "key": key,
                "value": render(value),
                "source": source,
            }
        )

    def close(entry: tuple[dict, str, list[str]]) -> None:
        r, key, text = entry
        try:
            value, _ = json.JSONDecoder().raw_decode("\n".join(text))
        except ValueError:
            emit(r, key, "\n".join(text), "echo", engine)
            return
        prefix, source = ("", "echo_json") if key == "json" else (ZERO if key == "zero_config" else key, "echo")
        for k, v in flatten(value, prefix):
            emit(r, k, v, source, engine)

    for r in rows.iter_rows(named=True):
        if pending and r["kind"] != "json_line":
            close(pending)
            pending = None
        fields = parsed.get((r["kind"], r["body"]), {})
        if r["kind"] == "config_header":
            engine += 1
        elif r["kind"] == "json_line" and pending:
            pending[2].append(r["body"])
        elif r["kind"] == "config_entry":
            key, value = fields["key"], fields.get("value", "")
            if value in ("{", "["):
                pending = (r, key, [value])
                continue
            emit(r, key, value, "echo", max(engine, 0))
            if key == "zero_config":
                for k, v in flatten(_zero_config(value), ZERO):
                    emit(r, k, v, "echo", max(engine, 0))
        elif r["kind"] == "zero_init":
            for k, v in fields.items():
                emit(r, f"{ZERO}.{k}", v, "log")
        elif r["kind"] == "version":
            emit(r, "deepspeed_version", fields["deepspeed_version"], "log")
        elif r["kind"] == "launcher":
            if "env_name" in fields:
                emit(r, fields["env_name"], fields["env_value"].lstrip("= "), "launcher_env")
            else:
                for k, v in fields.items():
                    emit(r, f"launcher.{k}", v, "launcher")
    if pending:
        close(pending)
    return out


def _zero_config(value: str) -> dict:
    """zero_config as printed: a pydantic repr (`stage=2 overlap_comm=False ...`) or a dict repr."""
    if value.startswith("{"):
        try:
            literal = ast.literal_eval(value)
            return literal if isinstance(literal, dict) else {}
        except (ValueError, SyntaxError):
            return {}
    return parse_body("pyrepr", value) or {}


def flatten(value, prefix: str = "") -> list[tuple[str, object]]:
    """Nested dicts -> (dotted key, leaf) pairs; lists stay leaves."""
    if not isinstance(value, dict):
        return [(prefix, value)]
    pairs = []
    for k, v in value.items():
        pairs.extend(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return pairs


def render(value) -> str:
    """A setting as text: strings as they are, other JSON values as JSON (true, 5e8 as 500000000.0)."""
    return value if isinstance(value, str) else json.dumps(value)
