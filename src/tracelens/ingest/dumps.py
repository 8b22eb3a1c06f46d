"""What the fabric dump formats (perfquery, ibstat, ibstatus, ibv_devinfo, ethtool -S,
hw_counters) share: reading a dump's lines with the time and host each belongs to.

People collect these dumps with small scripts, so around the tool's own lines a file
may hold `date` output, a `hostname` line, the shell prompt and command that made it,
`#` comments, blank lines and `...` where a paste was shortened. Those context lines are read here,
once for every format; each format module only gives a line parser (usually its lark
grammar, see `LineGrammar`) and turns the parsed lines into rows.

Time of a dump block: the last timestamp line before it (the first one in the file for
blocks above any), else a time in the file name, else the file's modification time;
`ts_quality` says which ("exact", "filename", "mtime"). Host: a host line or a
`user@host` prompt in the file, else null (the pipeline then takes the host from the path).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import Any

import polars as pl
from lark import Lark, LarkError, Transformer

from tracelens.ingest import Account, InputFile
from tracelens.ingest.lines import read_chunks
from tracelens.resources import grammar_text

EXACT, FILENAME, MTIME = "exact", "filename", "mtime"

# Zone names `date` prints that have one meaning; any other name is read as UTC wall time
# (the offset between two dumps of one host, which is what deltas need, stays right).
_ZONES = {
    "UTC": 0,
    "GMT": 0,
    "Z": 0,
    "EST": -5,
    "EDT": -4,
    "CST": -6,
    "CDT": -5,
    "MST": -7,
    "MDT": -6,
    "PST": -8,
    "PDT": -7,
    "CET": 1,
    "CEST": 2,
    "EET": 2,
    "EEST": 3,
    "JST": 9,
    "KST": 9,
}
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_CLOCK = r"(?P<h>\d{1,2}):(?P<mi>\d\d):(?P<s>\d\d)\s*(?P<ampm>AM|PM)?"
_ZONE = r"(?P<zone>[A-Z]{1,5}|[+-]\d{4})"
_LABEL = re.compile(r"^(?:#\s*)?(?:timestamp|date|time|collected(?: at)?)\s*[:=]?\s*", re.I)
_EPOCH = re.compile(r"^(?P<epoch>1\d{9})(?:\.\d+)?$")
_ISO = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?"
    r"(?P<zone>Z|[+-]\d\d:?\d\d)?(?:\s+(?:UTC|GMT))?$"
)
_DATE_C = re.compile(rf"^{_DAY}\s+{_MON}\s+(?P<d>\d{{1,2}})\s+{_CLOCK}\s+(?:{_ZONE}\s+)?(?P<y>\d{{4}})$")
_DATE_LOCALE = re.compile(rf"^{_DAY},?\s+(?P<d>\d{{1,2}})\s+{_MON}\s+(?P<y>\d{{4}}),?\s+{_CLOCK}(?:\s+{_ZONE})?$")

_NAME_DATETIME = re.compile(
    r"(?<![\dA-Za-z])(?P<y>20\d\d)-?(?P<mo>[01]\d)-?(?P<d>[0-3]\d)[T_.\- ]?"
    r"(?P<h>[0-2]\d)[:\-]?(?P<mi>[0-5]\d)(?:[:\-]?(?P<s>[0-5]\d))?(?!\d)"
)
_NAME_EPOCH = re.compile(r"(?<![\dA-Za-z])(?P<epoch>1\d{9})(?!\d)")
_NAME_CLOCK = re.compile(r"(?<![\dA-Za-z])(?P<h>[01]\d|2[0-3])(?P<mi>[0-5]\d)(?P<s>[0-5]\d)?(?![\dA-Za-z])")

_HOST_LINE = re.compile(r"^(?:#\s*)?(?:host|hostname|node)\s*[:=]\s*(?P<host>[A-Za-z0-9][\w.-]*)$", re.I)
_PROMPT_HOST = re.compile(r"[\w.-]+@(?P<host>[A-Za-z0-9][\w.-]*)")
_TOOLS = r"perfquery|ibstat|ibstatus|ibv_devinfo|ethtool|grep|cat|hostname|date|rdma|ibqueryerrors"
_COMMAND = re.compile(rf"(?:^|[\s$#>%/])(?P<tool>{_TOOLS})(?:\s|$)")
_ELISION = re.compile(r"^[.…\s]*$")  # blank, or `...` where a paste was shortened


def _zone_offset(zone: str | None) -> timezone:
    if not zone:
        return timezone.utc
    if zone[0] in "+-":
        minutes = int(zone[1:3]) * 60 + int(zone[3:5])
        return timezone(timedelta(minutes=minutes if zone[0] == "+" else -minutes))
    return timezone(timedelta(hours=_ZONES.get(zone, 0)))


def _from_parts(m: re.Match) -> datetime:
    hour = int(m["h"]) % 12 + (12 if m["ampm"] == "PM" else 0) if m["ampm"] else int(m["h"])
    local = datetime(int(m["y"]), _MONTHS[m["mon"]], int(m["d"]), hour, int(m["mi"]), int(m["s"]))
    return local.replace(tzinfo=_zone_offset(m["zone"])).astimezone(timezone.utc)


_CANDIDATE = re.compile(r"\d:\d\d|^\D{0,20}1\d{9}(?:\.\d+)?$")  # a clock, or an epoch alone


def parse_time(text: str) -> datetime | None:
    """The UTC time a timestamp line states (`date` in its usual forms, ISO 8601, epoch), or None."""
    if not _CANDIDATE.search(text):
        return None
    text = _LABEL.sub("", text.strip())
    if m := _EPOCH.match(text):
        return datetime.fromtimestamp(int(m["epoch"]), timezone.utc)
    if m := _ISO.match(text):
        # in the one form Python 3.10's fromisoformat reads too: six fraction digits, `+HH:MM` for Z and +HHMM
        zone = (m["zone"] or "").replace("Z", "+00:00")
        zone = f"{zone[:3]}:{zone[-2:]}" if zone else ""
        stamp = datetime.fromisoformat(f"{m['date']}T{m['time']}.{(m['frac'] or '').ljust(6, '0')[:6]}{zone}")
        return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    if (m := _DATE_C.match(text)) or (m := _DATE_LOCALE.match(text)):
        try:
            return _from_parts(m)
        except ValueError:
            return None
    if "," in text and re.match(rf"^{_DAY},", text):  # date -R
        try:
            return parsedate_to_datetime(text).astimezone(timezone.utc)
        except (TypeError, ValueError):
            return None
    return None


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


class _Marks:
    """Values stated at some lines (times, hosts); each line takes the last one above it, else the first."""

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.values: list[Any] = []

    def add(self, line: int, value: Any) -> None:
        self.lines.append(line)
        self.values.append(value)

    def above(self, line: int) -> Any:
        """The last value stated above `line`, or None."""
        index = bisect_right(self.lines, line) - 1
        return self.values[index] if index >= 0 else None

    def at(self, line: int) -> Any:
        """The last value stated above `line`, else the first one stated below it, else None."""
        found = self.above(line)
        return found if found is not None or not self.values else self.values[0]


LineParser = Callable[[str], Any]  # a line's text -> its value, or None if not a line of the format


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


def read_dump(source: InputFile, parse_line: LineParser) -> tuple[list[DumpLine], Account]:
    """Read a dump: the lines `parse_line` understood, with time and host, and the file's account."""
    account = Account()
    parsed: list[tuple[int, str, Any]] = []
    times, hosts, commands = _Marks(), _Marks(), _Marks()
    unrecognized: list[tuple[int, str]] = []
    expect_host = False  # the line after a `hostname` command is its output
    for chunk in read_chunks(source.path):
        for number, raw in chunk.iter_rows():
            account.lines += 1
            text = raw.strip()
            if expect_host and re.fullmatch(r"[A-Za-z0-9][\w.-]*", text):
                hosts.add(number, text)
                account.parsed += 1
                expect_host = False
                continue
            expect_host = False
            if (stamp := parse_time(text)) is not None:
                times.add(number, stamp)
                account.parsed += 1
            elif m := _HOST_LINE.match(text):
                hosts.add(number, m["host"])
                account.parsed += 1
            elif (value := parse_line(raw)) is not None and _numbers_fit(value):
                parsed.append((number, raw, value))
                account.parsed += 1
            elif m := _COMMAND.search(text):
                expect_host = m["tool"] == "hostname"
                commands.add(number, text[m.start("tool") :])
                if prompt := _PROMPT_HOST.search(text[: m.start() + 1]):
                    hosts.add(number, prompt["host"])
                account.ignored += 1
            elif _ELISION.match(text) or text.startswith("#"):  # a comment of the collecting script
                account.ignored += 1
            else:
                account.unrecognized += 1
                unrecognized.append((number, raw))
    account.add_samples(unrecognized)
    fallback = None if len(times.values) == len(parsed) == 0 else file_time(source)
    lines = []
    for number, raw, value in parsed:
        stamp = times.at(number)
        ts, quality = (stamp, EXACT) if stamp is not None else fallback  # type: ignore[misc]
        lines.append(DumpLine(number, raw, value, ts, quality, hosts.at(number), commands.above(number)))
    return lines, account


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
