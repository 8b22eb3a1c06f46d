"""ds_config.json: the DeepSpeed configuration a run was started with.

Its settings go to the `deepspeed_settings` table under dotted keys (`zero_optimization.overlap_comm`),
the same keys the log's echo of the user config gets, with source "ds_config.json" and
the line each key is on. Values are kept as text: JSON for non-strings (`true`, `5e8` as
`500000000.0`), HF's `"auto"` as it is.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right

import polars as pl

from tracelens.ingest import IngestResult, InputFile, input_format
from tracelens.ingest.deepspeed.assemble import flatten, render
from tracelens.small_read import TooBig, read_small

MAX_BYTES = 16 << 20  # a DeepSpeed config is a few KB

MARKERS = (
    b'"zero_optimization"',
    b'"train_micro_batch_size_per_gpu"',
    b'"train_batch_size"',
    b'"gradient_accumulation_steps"',
)


def sniff(head: bytes) -> bool:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") and any(m in head for m in MARKERS)


def _unread(result: IngestResult, error: str) -> IngestResult:
    """A file that is no config: its error, and every line it has counted unrecognised."""
    result.account.errors.append(error)
    result.account.unrecognized = result.account.lines
    return result


# before the text-log catch-all; JSON that names DeepSpeed's own sections
@input_format("ds_config", priority=50, sniff=sniff, reads_lines=False)
def ingest(source: InputFile) -> IngestResult:
    result = IngestResult()
    try:
        text = read_small(source.path, MAX_BYTES, "DeepSpeed config").decode("utf-8", errors="replace")
    except TooBig as exc:
        return _unread(result, f"{source.name}: {exc}")
    result.account.lines = text.count("\n") + 1
    try:
        settings = json.loads(text.lstrip("\ufeff"))
    except json.JSONDecodeError as exc:
        return _unread(result, f"{source.name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except RecursionError:
        return _unread(result, f"{source.name}: JSON nested too deeply to be a DeepSpeed config")
    if not isinstance(settings, dict):
        return _unread(result, f"{source.name}: not a DeepSpeed config (the JSON is not an object)")
    pairs = flatten(settings)
    rows = [
        {"line": line, "key": key, "value": render(value)} for (key, value), line in zip(pairs, _key_lines(text, pairs))
    ]
    result.account.parsed = len(rows)
    result.account.ignored = result.account.lines - len(rows)
    result.add(
        "deepspeed_settings",
        pl.DataFrame(rows, schema={"line": pl.Int64, "key": pl.String, "value": pl.String}).with_columns(
            pl.lit(source.name).alias("file"),
            pl.lit("ds_config.json").alias("source"),
            pl.lit("none").alias("ts_quality"),
        ),
    )
    return result


def _key_lines(text: str, pairs: list[tuple[str, object]]) -> list[int | None]:
    """The line of each flattened key: the first line, from the previous key's, that names its last
    part. One pass finds every `"name":` in the text; each key then takes the next occurrence of its
    name by bisection, so a 20,000-key config (even on one line) takes milliseconds, not minutes."""
    occurrences: dict[str, list[int]] = {}
    lines_at: list[int] = []
    for n, name in enumerate(re.finditer(r'"((?:[^"\\]|\\.)*)"\s*:', text)):
        occurrences.setdefault(name.group(1), []).append(n)
        lines_at.append(name.start())
    line_starts = [m.end() for m in re.finditer("\n", text)]
    found: list[int | None] = []
    at = 0
    for key, _ in pairs:
        positions = occurrences.get(key.rsplit(".", 1)[-1], [])
        i = bisect_left(positions, at)
        if i == len(positions):
            found.append(None)
            continue
        at = positions[i]
        found.append(bisect_right(line_starts, lines_at[at]) + 1)
    return found
