"""DeepSpeed records -> the steps, comm_ops and config tables of one file.

`deepspeed.DeepSpeedParser` reads the lines (ds_grammar the bodies); this module puts the records of a whole
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
import shutil
import tempfile
from functools import reduce
from pathlib import Path

import polars as pl

from tracelens.ingest import InputFile
from tracelens.ingest.ds_grammar import parse_body
from tracelens.tables import Frame, Spill

STEP_SOURCES = ("progress", "timers", "throughput", "iteration", "pipe_step")
STEP_COLUMNS = [
    "skipped", "lr", "samples_per_sec", "avg_samples_per_sec", "epoch", "micro_step", "iter_ms",
    "fwd_ms", "bwd_ms", "bwd_inner_ms", "bwd_allreduce_ms", "step_ms",
    "optimizer_allgather_ms", "optimizer_gradients_ms", "optimizer_step_ms",
]  # fmt: skip
# Where the row's time comes from, most telling first: its `message` is that line's text
MESSAGE_PRIORITY = {"timers": 0, "iteration": 1, "pipe_step": 2, "progress": 3, "throughput": 4}


ROWS = "ds_rows_"  # + a step kind: a big file's step records (with their text), spilled chunk by chunk
STREAM_ROWS = 1 << 19  # a big file's step records are assembled a group of whole streams of about this many at a time
GROUPED_ROWS = 1 << 14  # rows each group's file holds in memory while the records are sorted out (a row group)


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
    out: dict[str, Frame] = {"comm_ops": comm_ops(hot.get("comm_op"), cold, parsed), "config": config(cold, parsed)}
    out = {name: frame.with_columns(provenance) for name, frame in out.items() if frame.height}
    if spill is not None:
        lazy = spilled_steps(spill, provenance)
        if lazy is not None:
            out["steps"] = lazy
        return out
    merged = steps(hot)
    if merged.height:
        bodies = pl.concat([part.select("line", "body") for part in hot.values() if "body" in part.columns]).lazy()
        out["steps"] = _with_text(merged.with_columns(provenance), bodies)
    return out


def _with_text(merged: pl.DataFrame, bodies: pl.LazyFrame) -> pl.DataFrame:
    """Step rows with the text of the line their timing comes from (`message`, joined on `message_line`).
    The lines are picked from `bodies` by a filter: a semi-join held every body it read (over a 3 GB
    log's spilled step text: 2.8 GB)."""
    wanted = pl.col("message_line").is_in(merged["message_line"].implode())
    text = bodies.select(message_line="line", message="body").filter(wanted)
    joined = merged.lazy().join(text, on="message_line", how="left", maintain_order="left")
    return joined.drop("message_line").collect(engine="streaming")


def spilled_steps(spill: Spill, provenance: list[pl.Expr]) -> pl.LazyFrame | None:
    """A big file's steps from its spilled step records, in memory that follows a group of streams,
    not the file: every step of a stream (host, rank) depends only on that stream's lines (Megatron's
    skipped count on its host's), so whole streams are assembled STREAM_ROWS records at a time, written
    back, and merged in line order, which gives exactly the rows `steps` gives over the whole file.
    The records are first sorted out by group in one pass (a file per group and kind): a scan of
    every record per group made the assembly quadratic (a 3 GB log: 19 groups, 24 s)."""
    kinds = {
        kind: pl.concat([pl.scan_parquet(path) for path in spill.parts[ROWS + kind]], how="diagonal_relaxed")
        for kind in STEP_SOURCES
        if ROWS + kind in spill.parts
    }
    if not kinds:
        return None
    rank_key = pl.col("rank").fill_null(0).alias("rank_key")
    iteration = kinds.get("iteration")
    per_host = (
        iteration is not None
        and "skipped_iterations" in iteration.collect_schema().names()
        and iteration.select(pl.col("skipped_iterations").is_not_null().any()).collect().item()
    )
    key = ["host"] if per_host else ["host", "rank_key"]
    records = pl.concat([frame.select("host", rank_key) for frame in kinds.values()])
    counts = records.group_by(key).len().sort(key, nulls_last=True).collect(engine="streaming")
    owner = counts.select(*key, _group=(pl.col("len").cum_sum() - pl.col("len")) // STREAM_ROWS)
    by_group = Path(tempfile.mkdtemp(dir=spill.folder, prefix="by-group-"))
    for kind, frame in kinds.items():  # in line order within each group's file
        grouped = frame.with_columns(rank_key).join(owner.lazy(), on=key, nulls_equal=True, maintain_order="left")
        grouped.drop("rank_key").sink_parquet(
            pl.PartitionBy(by_group / kind, key="_group", include_key=False),
            compression="lz4",
            mkdir=True,
            row_group_size=GROUPED_ROWS,
        )
    written = []
    for group in range(owner["_group"].max() + 1):
        # the records without their text (a stream of millions of records is held whole): the text of
        # the lines the steps show is read back after, from the group's files
        of_group = {kind: scan for kind in kinds if (scan := _of_group(by_group / kind, group)) is not None}
        merged = steps({kind: scan.drop("body").collect() for kind, scan in of_group.items()})
        if merged.height:
            bodies = pl.concat([scan.select("line", "body") for scan in of_group.values()])
            written.append(spill.write("steps", _with_text(merged.with_columns(provenance), bodies)))
        for kind in kinds:  # read: memory and disk follow a group
            shutil.rmtree(by_group / kind / f"_group={group}", ignore_errors=True)
    scans = [pl.scan_parquet(path) for path in written if path is not None]
    return reduce(lambda a, b: a.merge_sorted(b, key="line"), scans) if scans else None


def _of_group(folder: Path, group: int) -> pl.LazyFrame | None:
    """One group's records of a kind, as sorted out by spilled_steps (its files in the order written);
    None when it has none."""
    files = sorted((folder / f"_group={group}").glob("*.parquet"))
    return pl.scan_parquet(files, hive_partitioning=False) if files else None


# ---------------------------------------------------------------- steps


def steps(hot: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """One row per logged step: the progress, throughput, timer and Megatron lines of one step,
    which DeepSpeed prints separately, merged by stream (host, rank, engine) and step."""
    parts = [hot[k].with_columns(pl.lit(k).alias("source")) for k in STEP_SOURCES if k in hot]
    if not parts:
        return pl.DataFrame()
    rows = pl.concat(parts, how="diagonal_relaxed")
    # in line order by a gather, not DataFrame.sort: the same rows, for about half the memory on top
    # (3.2M timer records of one stream, 621 MB: +775 MB, where sort took +1,418 MB)
    rows = rows[rows["line"].arg_sort()]
    for col, dtype in {
        "role": pl.String,
        "skipped_iterations": pl.Float64,
        "skipped": pl.Int64,
        "step": pl.Int64,
    }.items():
        if col not in rows.columns:
            rows = rows.with_columns(pl.lit(None, dtype).alias(col))
    rows = rows.with_columns(pl.col("rank").fill_null(0).alias("rank_key"))
    rows = _drop_shadowed_micro_timers(rows)
    rows = _engines(rows)
    rows = _timer_steps(rows)
    # Megatron counts skipped iterations per logging interval; `skipped` is cumulative
    rows = rows.with_columns(
        pl.coalesce("skipped", pl.col("skipped_iterations").cum_sum().over("host", "engine"))
        .cast(pl.Int64, strict=False)
        .alias("skipped")
    )
    key = ["host", "rank_key", "engine", "step"]
    present = [c for c in STEP_COLUMNS if c in rows.columns]
    by_priority = (
        pl.when(pl.col("role") == "optimizer")
        .then(9)
        .otherwise(pl.col("source").replace_strict(MESSAGE_PRIORITY, return_dtype=pl.Int8))
    )
    merged = rows.group_by(key, maintain_order=True).agg(
        pl.col("line").min(),
        pl.col("ts").drop_nulls().first(),
        pl.col("ts_text").filter(pl.col("ts").is_not_null()).first(),  # that time as printed
        pl.col("rank").drop_nulls().first(),
        *(pl.col(c).drop_nulls().first() for c in present),
        pl.col("line").sort_by(by_priority).first().alias("message_line"),  # its text is joined by `tables`
    )
    return merged.drop("rank_key").with_columns(pl.col("engine").cast(pl.String)).sort("line")


def _drop_shadowed_micro_timers(rows: pl.DataFrame) -> pl.DataFrame:
    """Drop micro-step timer lines of streams that also log global ones; keep only known roles."""
    has_global = (pl.col("role") == "global").any().over("host", "rank_key")
    micro = pl.col("role") == "micro"
    return rows.filter(pl.col("role").is_null() | pl.col("role").is_in(["global", "optimizer"]) | (micro & ~has_global))


def _engines(rows: pl.DataFrame) -> pl.DataFrame:
    """Number the engines of each rank by repeats of its progress step numbers."""
    progress = pl.col("source") == "progress"
    repeat = pl.when(progress).then(pl.int_range(pl.len()).over("host", "rank_key", "step", "source"))
    return rows.with_columns(repeat.alias("engine")).with_columns(
        pl.col("engine").forward_fill().over("host", "rank_key").fill_null(0)
    )


def _timer_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """The step of each timer line, from the progress lines around it (see the module doc)."""
    stream = ["host", "rank_key"]
    is_p = (pl.col("source") == "progress").cast(pl.Int64, strict=False)
    is_g = ((pl.col("source") == "timers") & (pl.col("role") != "optimizer")).cast(pl.Int64, strict=False)
    p_step = pl.when(is_p == 1).then(pl.col("step"))
    seg_fwd = is_p.cum_sum().over(stream)
    seg_bwd = is_p.cum_sum(reverse=True).over(stream)
    rows = rows.with_columns(
        is_p.alias("_p"), is_g.alias("_g"), seg_fwd.alias("_sf"), seg_bwd.alias("_sb"),
        p_step.forward_fill().over(stream).alias("_last"), p_step.backward_fill().over(stream).alias("_next"),
    )  # fmt: skip
    forward = pl.col("_last") + pl.col("_g").cum_sum().over(*stream, "_sf") - pl.col("_g")
    backward = pl.col("_next") - pl.col("_g").cum_sum(reverse=True).over(*stream, "_sb")
    counted = pl.col("_g").cum_sum().over(stream) + 1 - pl.col("_g")
    timer_step = pl.coalesce(forward, backward, counted)
    return rows.with_columns(
        pl.when(pl.col("source") == "timers")
        .then(timer_step)
        .otherwise(pl.col("step"))
        .cast(pl.Int64, strict=False)
        .alias("step")
    ).drop("_p", "_g", "_sf", "_sb", "_last", "_next")


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


def config(cold: pl.DataFrame | None, parsed: dict) -> pl.DataFrame:
    """Settings as `key`/`value` strings. The echo's user JSON (`json = {...}`) and zero_config
    are flattened to the dotted keys of ds_config.json (`zero_optimization.overlap_comm`)."""
    if cold is None:
        return pl.DataFrame()
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

    for r in cold.filter(pl.col("kind").is_in(CONFIG_KINDS)).sort("line").iter_rows(named=True):
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
    return pl.DataFrame(out, infer_schema_length=None) if out else pl.DataFrame()


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
