"""Glued lines: a line printed without its newline, then another process's line on the same line.

Two processes writing to one terminal or file glue their lines (`... NCCL WARN Cuda failure 'out of
memory'node03:812:901 [5] NCCL INFO Channel 01/0 : ...`). Read as one line, the first record's body
carries the second line's text, so it fits no shape and is new on every such line. The parsers
cut a body at the next line start it holds (NCCL's host:pid:tid head, DeepSpeed's logger stamp,
PyTorch's c10 record, each with a launcher tag or a timestamp before it) and read the rest as a
line of its own.
"""

from __future__ import annotations

import polars as pl

from tracelens.ingest.text.lines import byte_slice

# A literal one of which every line start holds: a cheap whole-column test before the full pattern.
MARKS = (
    r"NCCL (?:INFO|WARN|TRACE|CALL|ABORT) |\] \[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\] \[|NCCL(?:Utils)?\.[ch]pp:\d+\]"
)
_TAG = r"(?:\[[A-Za-z_]*\d+\]:|\[\d+,\d+\]<std(?:out|err)>:)?"  # torchrun `[default3]:`, Open MPI `[1,3]<stdout>:`
_STAMP = r"(?:\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?\]? ?)?"  # a launcher's or shipper's time
LINE_START = (
    _TAG + _STAMP + r"(?:(?:[A-Za-z0-9][\w.-]*:\d+:\d+ )?\[\d+\] (?:\d+\.\d+ \S+:\d+ )?(?:\S+:\d+ (?:\([^)]*\) )?)?"
    r"NCCL (?:INFO|WARN|TRACE|CALL|ABORT) "  # NCCL's head and mark
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[[A-Z]+\] \["  # DeepSpeed's logger
    r"|(?:\[rank\d+\]:)?\[[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ (?:ProcessGroupNCCL|NCCLUtils)\.[ch]pp:\d+\])"  # c10
)


def line_starts(text: pl.Series) -> pl.Series:
    """The byte offset of the first line start in each text, null where it holds none. The pattern
    runs only on the texts holding one of its MARKS."""
    found = pl.repeat(None, text.len(), dtype=pl.UInt32, eager=True)
    rows = text.str.contains(MARKS).fill_null(False).arg_true()
    if not rows.len():
        return found
    return found.scatter(rows, text.gather(rows).str.find(LINE_START))


def cut(text: pl.Series, at: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Each text before and from its offset in `at` (where `at` is null: the whole text, and null).
    Only the glued rows are sliced: the others are no copy."""
    rows = at.is_not_null().arg_true()
    rest = pl.repeat(None, text.len(), dtype=pl.String, eager=True).alias(text.name)
    if not rows.len():
        return text, rest
    glued, at_ = pl.col("text"), pl.col("at")
    head, tail = pl.DataFrame({"text": text.gather(rows), "at": at.gather(rows)}).select(
        head=byte_slice(glued, 0, at_), tail=byte_slice(glued, at_)
    )
    return text.clone().scatter(rows, head), rest.scatter(rows, tail)
