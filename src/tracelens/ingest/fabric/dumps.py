"""What the fabric dump formats (perfquery, ibstat, ibstatus, ibv_devinfo, ethtool -S,
hw_counters) share: reading a dump's lines with the time and host each belongs to.

People collect these dumps with small scripts, so around the tool's own lines a file
may hold `date` output, a `hostname` line, the shell prompt and command that made it,
`#` comments, blank lines and `...` where a paste was shortened. Those context lines are read by
tracelens.ingest.text.shell_context, as for the host evidence; each format module only gives a line
parser (usually its lark grammar, see `LineGrammar`) and turns the parsed lines into rows.

Time of a dump block: the last timestamp line before it (the first one in the file for
blocks above any), else a time in the file name, else the file's modification time;
`ts_quality` says which ("exact", "filename", "mtime"). Host: a host line or a
`user@host` prompt in the file, else null (the pipeline then takes the host from the path).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import cached_property
from typing import Any

import polars as pl
from lark import Lark, LarkError, Transformer

from tracelens.ingest import Account, Batch, InputFile
from tracelens.ingest.text.lines import FILE_SHIFT, IGNORED, LINE_MASK, PARSED, read_files, read_lines
from tracelens.ingest.text.shell_context import USER_AT_HOST, filled, marks
from tracelens.resources import grammar_text

EXACT, FILENAME, MTIME = "exact", "filename", "mtime"

_NAME_DATETIME = re.compile(
    r"(?<![\dA-Za-z])(?P<y>20\d\d)-?(?P<mo>[01]\d)-?(?P<d>[0-3]\d)[T_.\- ]?"
    r"(?P<h>[0-2]\d)[:\-]?(?P<mi>[0-5]\d)(?:[:\-]?(?P<s>[0-5]\d))?(?!\d)"
)
_NAME_EPOCH = re.compile(r"(?<![\dA-Za-z])(?P<epoch>1\d{9})(?!\d)")
_NAME_CLOCK = re.compile(r"(?<![\dA-Za-z])(?P<h>[01]\d|2[0-3])(?P<mi>[0-5]\d)(?P<s>[0-5]\d)?(?![\dA-Za-z])")

_TOOLS = r"perfquery|ibstat|ibstatus|ibv_devinfo|ethtool|grep|cat|hostname|date|rdma|ibqueryerrors"
_COMMAND = re.compile(rf"(?:^|[\s$#>%/])(?P<tool>{_TOOLS})(?:\s|$)")
_USER_AT_HOST = re.compile(USER_AT_HOST)


def file_time(source: InputFile) -> tuple[datetime, str]:
    """The time of a dump with no timestamp line: from its file name, else its modification time."""
    mtime = datetime.fromtimestamp(source.path.stat().st_mtime, timezone.utc)
    name = source.name.rsplit("/", 1)[-1].rsplit("!", 1)[-1]
    if m := _NAME_DATETIME.search(name):
        try:
            stamp = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"] or 0))
            return stamp.replace(tzinfo=timezone.utc), FILENAME
        except ValueError:
            pass
    if m := _NAME_EPOCH.search(name):
        return datetime.fromtimestamp(int(m["epoch"]), timezone.utc), FILENAME
    if m := _NAME_CLOCK.search(name):  # `perfquery-0915.txt`: a time of day, on the file's date
        day: date = mtime.date()
        stamp = datetime(day.year, day.month, day.day, int(m["h"]), int(m["mi"]), int(m["s"] or 0))
        return stamp.replace(tzinfo=timezone.utc), FILENAME
    return mtime, MTIME


@dataclass(frozen=True)
class DumpLine:
    """A line of a dump that its format's parser understood, with where and when it was taken."""

    number: int
    text: str
    value: Any  # what the format's line parser returned
    ts: datetime
    ts_quality: str
    host: str | None
    command: str | None = None  # the last command line above it (`$ ethtool -S ens1f0`), if the file shows one

    def provenance(self, source: InputFile) -> dict[str, Any]:
        """The provenance columns every row of this line carries."""
        return {
            "file": source.name,
            "line": self.number,
            "host": self.host,
            "ts": self.ts,
            "ts_quality": self.ts_quality,
            "dump_ts": self.ts,
        }


ParseLine = Callable[[str], Any]  # a line's text -> its value, or None if not a line of the format


def _numbers_fit(value: Any) -> bool:
    """Whether every integer in a parsed line fits a 64-bit column (a counter of 2^64 does not: that
    line is unrecognised, the rest of the file is read)."""
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, dict):
        return all(_numbers_fit(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_numbers_fit(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return all(_numbers_fit(getattr(value, f)) for f in value.__dataclass_fields__)
    return True


def _lines(sources: list[InputFile]) -> pl.DataFrame:
    """Columns idx, line (its key, lines.FILE_SHIFT) and text of the files' lines: one file's as
    read_lines gives them, several small files' as one frame (read_keyed)."""
    if len(sources) == 1:
        return read_lines(sources[0]).with_columns(idx=pl.lit(0, pl.Int64))
    return read_files([source.path for source in sources])


def read_dumps(sources: list[InputFile], parse_line: ParseLine) -> list[tuple[list[DumpLine], Account]]:
    """Read dumps: of each, the lines `parse_line` understood, with time and host, and the file's
    account. Of the other lines, a tool's command (`perfquery -x`, `ssh root@node05 ethtool -S ens1f0`)
    names the host of the output below it (`user@host`) and is each line's `command`; `#` comments
    are ignored. Several small dumps are read as one frame, what a line takes from the lines around
    it (a time, a host, a command) from its own file only."""
    lines = marks(_lines(sources)).filter((pl.col("line") & LINE_MASK) > 0)  # not the rows between files
    parsed: dict[int, Any] = {}  # by line key
    commands: dict[int, tuple[str, str | None]] = {}
    unrecognized: list[list[tuple[int, str]]] = [[] for _ in sources]
    rest = lines.filter(pl.col("ctx").is_null() | (pl.col("ctx") == IGNORED))  # a prompt line shows its command
    for key, raw, status in rest.select("line", "text", "ctx").iter_rows():
        if status is None and (value := parse_line(raw)) is not None and _numbers_fit(value):
            parsed[key] = value
        elif m := _COMMAND.search(text := raw.strip()):
            host = _USER_AT_HOST.search(text[: m.start() + 1])
            commands[key] = (text[m.start("tool") :], host["host"] if host else None)
        elif status is None and not text.startswith("#"):  # a comment of the collecting script
            unrecognized[key >> FILE_SHIFT].append((key & LINE_MASK, raw))
    accounts = [Account() for _ in sources]
    parsed_in = Counter(key >> FILE_SHIFT for key in parsed)
    counts = lines.group_by("idx").agg(pl.len(), context=(pl.col("ctx") == PARSED).sum())
    for idx, n, n_context in counts.iter_rows():
        account = accounts[idx]
        account.lines, account.parsed = n, n_context + parsed_in[idx]
        account.unrecognized = len(unrecognized[idx])
        account.ignored = account.lines - account.parsed - account.unrecognized
        account.add_samples(unrecognized[idx])
    out: list[list[DumpLine]] = [[] for _ in sources]
    if not parsed:
        return list(zip(out, accounts))
    ran = pl.DataFrame(
        [(key, command, host) for key, (command, host) in commands.items()],
        schema={"line": pl.Int64, "command": pl.String, "ran_on": pl.String},
        orient="row",
    )
    lines = filled(
        lines.join(ran, on="line", how="left", maintain_order="left").with_columns(
            prompt_host=pl.coalesce("prompt_host", "ran_on"), command=pl.col("command").forward_fill().over("idx")
        ),
        over="idx",
    )
    fallback = {idx: file_time(sources[idx]) for idx in parsed_in}
    for key, raw, stamp, host, command in (
        lines.filter(pl.col("line").is_in(list(parsed)))
        .select("line", "text", "stamp", "prompt_host", "command")
        .iter_rows()
    ):
        ts, quality = (stamp, EXACT) if stamp is not None else fallback[key >> FILE_SHIFT]
        out[key >> FILE_SHIFT].append(DumpLine(key & LINE_MASK, raw, parsed[key], ts, quality, host, command))
    return list(zip(out, accounts))


def read_batch(
    sources: list[InputFile],
    parse_line: ParseLine,
    rows_of: Callable[[InputFile, list[DumpLine]], dict[str, list[dict]]],
    frame: Callable[[list[dict]], pl.DataFrame] = lambda rows: pl.DataFrame(rows, infer_schema_length=None),
) -> Batch:
    """A dump format's files read at once (read_dumps): each file's account, and the tables of the
    rows `rows_of` makes of each file's parsed lines (table name -> rows), as `frame` makes them."""
    batch = Batch()
    rows: dict[str, list[dict]] = {}
    for source, (lines, account) in zip(sources, read_dumps(sources, parse_line)):
        batch.accounts[source.name] = account
        for table, made in rows_of(source, lines).items():
            rows.setdefault(table, []).extend(made)
    batch.tables = {table: frame(made) for table, made in rows.items() if made}
    return batch


class LineGrammar:
    """A lark grammar of one line of a format (grammars/<name>.lark), with its transformer.

    Calling it parses a line and returns the transformer's value, or None when the line
    is not one of the format's. Distinct lines are parsed once: fleets of dumps repeat
    most of their lines (zero counters, port attributes), so the cache carries the load.
    """

    def __init__(self, name: str, transformer: type[Transformer]) -> None:
        self.name = name
        self.transformer = transformer
        self._cache: dict[str, Any] = {}

    @cached_property
    def _lark(self) -> Lark:
        return Lark(grammar_text(self.name), parser="lalr", transformer=self.transformer())

    def __call__(self, text: str) -> Any:
        text = text.strip()
        if not text:
            return None
        if text not in self._cache:
            try:
                self._cache[text] = self._lark.parse(text)
            except LarkError:
                self._cache[text] = None
            if len(self._cache) > 100_000:
                self._cache.clear()
        return self._cache[text]


def blocks(lines: list[DumpLine], starts: Callable[[DumpLine], bool]) -> Iterator[list[DumpLine]]:
    """Split parsed lines into blocks, each beginning at a line for which `starts` is true.

    Lines before the first start form a block of their own (a dump whose header was lost).
    """
    block: list[DumpLine] = []
    for line in lines:
        if starts(line) and block:
            yield block
            block = []
        block.append(line)
    if block:
        yield block


def counter_frame(rows: list[dict]) -> pl.DataFrame:
    """ib_counters rows as a frame (counter values are unsigned 64-bit)."""
    return pl.DataFrame(rows, schema_overrides={"value": pl.UInt64}, infer_schema_length=None)
