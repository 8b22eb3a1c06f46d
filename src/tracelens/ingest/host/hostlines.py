"""What the host-evidence formats (nvidia-smi, dcgmi, kernel logs, ip/ifconfig/show_gids,
perftest) share: the account from a per-line status, the provenance of their rows, and the
grammar of their line shapes. The context lines around a tool's output (`date`, prompts,
host lines) are read by tracelens.ingest.text.shell_context, as for the fabric dumps.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

import polars as pl
from lark import Lark, LarkError

from tracelens.ingest import Account, InputFile
from tracelens.ingest.text.lines import IGNORED, NOT_MINE, PARSED, UNRECOGNIZED
from tracelens.resources import grammar_text


def account(lines: pl.DataFrame, status: pl.Series) -> Account:
    """Count each line under its status and keep samples of the unrecognized. A line no kind fits
    is unrecognized, unless it starts with `#`: a comment of the collecting script or a fixture's
    marker (dumps.py reads them the same way)."""
    return accounts(lines.with_columns(idx=pl.lit(0, pl.Int64)), status).get(0, Account())


def accounts(lines: pl.DataFrame, status: pl.Series) -> dict[int, Account]:
    """`account` of each file of several read as one frame (the column `idx` tells them apart; their
    `line` is the line number in the file), by idx."""
    comment = lines["text"].str.strip_chars_start().str.starts_with("#")
    status = pl.select(
        pl.when(status.is_null() & comment).then(pl.lit(IGNORED, pl.UInt8)).otherwise(status)
    ).to_series()
    status = status.fill_null(UNRECOGNIZED).replace(NOT_MINE, UNRECOGNIZED)
    lines = lines.select("idx", "line", "text", status=status)
    counts = lines.group_by("idx").agg(
        pl.len(),
        parsed=(pl.col("status") == PARSED).sum(),
        ignored=(pl.col("status") == IGNORED).sum(),
        unrecognized=(pl.col("status") == UNRECOGNIZED).sum(),
    )
    found = {
        idx: Account(lines=n, parsed=parsed, ignored=ignored, unrecognized=unrecognized)
        for idx, n, parsed, ignored, unrecognized in counts.iter_rows()
    }
    bad = lines.filter(pl.col("status") == UNRECOGNIZED).group_by("idx", maintain_order=True).head(20)
    for idx, line, text in bad.select("idx", "line", "text").iter_rows():
        found[idx].add_samples([(line, text)])
    return found


def merge(total: Account, part: Account) -> None:
    """Add a chunk's account to the file's."""
    total.lines += part.lines
    total.parsed += part.parsed
    total.ignored += part.ignored
    total.unrecognized += part.unrecognized
    total.errors += part.errors
    total.add_samples(part.samples)


def provenance(source: InputFile, rows: pl.DataFrame, ts: pl.Expr | None = None, zoned: bool = False) -> pl.DataFrame:
    """Add file, host (from a prompt or host line), ts and ts_quality to rows that carry `line`,
    `stamp` and `prompt_host`; `ts` overrides the `date` line's time where it is not null."""
    when = pl.coalesce(ts, pl.col("stamp")) if ts is not None else pl.col("stamp")
    return rows.with_columns(
        file=pl.lit(source.name),
        host=pl.col("prompt_host"),
        ts=when.cast(pl.Datetime("ns", "UTC")),
        zoned=pl.lit(zoned),
    ).with_columns(ts_quality=pl.when(pl.col("ts").is_null()).then(pl.lit("none")).otherwise(pl.lit("exact")))


def local_time(text: pl.Expr, fmt: str) -> pl.Expr:
    """A printed local wall time read as UTC (the timeline moves it to the logs' zone)."""
    return text.str.strip_chars().str.to_datetime(fmt, strict=False, time_unit="ns").dt.replace_time_zone("UTC")


# The longest line a host tool prints: the widest `--query-gpu` CSV header (every field, with units)
# is under half of it.
SHAPE_CHARS = 16 << 10


class ShapeGrammar:
    """A lark grammar of a format's line kinds, applied to line shapes: numbers that start
    a word masked to 0 (`inet6` and `mlx5_0` keep theirs), so that a loop's thousands of lines
    cost one parse per distinct shape. Earley, because the kinds of a free-form tool output
    share terminals; the parse says the kind, the values are then taken from every line of that
    kind with vectorized splits."""

    def __init__(self, name: str) -> None:
        self.name = name

    @cached_property
    def _lark(self) -> Lark:
        return Lark(grammar_text(self.name), parser="earley")

    @lru_cache(maxsize=100_000)  # noqa: B019 (one instance per grammar, alive for the whole run)
    def kind(self, shape: str) -> str | None:
        """The grammar's kind of a line shape, or None when no rule fits or it is longer than
        any line of these tools (Earley's cost grows with the square of a line's length)."""
        if len(shape) > SHAPE_CHARS:
            return None
        try:
            return self._lark.parse(shape).data
        except LarkError:
            return None

    def kinds(self, lines: pl.DataFrame) -> pl.DataFrame:
        """Add `kind` to lines (context lines get none), one parse per distinct shape."""
        masked = pl.col("text").str.replace_all(r"\b\d+", "0").str.strip_chars()
        todo = lines.filter(pl.col("ctx").is_null()).select(masked.alias("shape")).unique()
        table = todo.with_columns(kind=pl.col("shape").map_elements(self.kind, return_dtype=pl.String))
        return lines.with_columns(shape=masked).join(table, on="shape", how="left", maintain_order="left").drop("shape")
