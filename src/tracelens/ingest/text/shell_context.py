"""The context lines people paste around a tool's output, read once for every format that meets them.

Dumps and host evidence are collected with small scripts or pasted into tickets, so around the tool's
own lines a file may hold `date` output, a `hostname` line or the output of `hostname`, the shell
prompt and command that made it, blank lines and `...` where a paste was shortened. `marks` finds
them (vectorized) and what each states; `filled` gives every line the time of the last `date` line
above it (else the first below) and the host of the last prompt or host line above it (else the
first below). A format reads the lines that are not context, then `filled` (dumps.read_dumps adds
the tool command lines it meets among the rest, which name a host and a network device).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

import polars as pl

from tracelens.ingest.text.lines import IGNORED, PARSED

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


# `user@host:~$ cmd`, `[user@host dir]# cmd`, `$ cmd`, `(venv) user@host$ cmd`
PROMPT = r"^\s*(?:\([^)]*\)\s*)?(?:\[?[\w.-]+@(?P<host>[A-Za-z0-9][\w.-]*)[^$#]*?\]?\s*[$#]|\$)\s+\S"
HOST_LINE = r"(?i)^\s*(?:#\s*)?(?:host|hostname|node)\s*[:=]\s*(?P<host>[A-Za-z0-9][\w.-]*)\s*$"
USER_AT_HOST = r"[\w.-]+@(?P<host>[A-Za-z0-9][\w.-]*)"  # `ssh root@node05 perfquery`: the host it ran on
_HOSTNAME_OUTPUT = r"^\s*[A-Za-z0-9][\w.-]*\s*$"
_RAN_HOSTNAME = r"(?:^|[\s$#>%/])hostname(?:\s+-\S+)*\s*$"  # `$ hostname`: the next line is the host's name
ELISION = r"^[.…\s]*$"  # blank, or `...` where a paste was shortened
_CLOCKISH = r"\d:\d\d|^\D{0,20}1\d{9}(?:\.\d+)?$"
STAMP = pl.Datetime("us", "UTC")


def marks(lines: pl.DataFrame) -> pl.DataFrame:
    """Add to lines (`line`, `text`) `ctx` (a status for context lines, null for others), `is_date`,
    and what a line states: `stamp` (the UTC-as-read time of a `date` line) and `prompt_host` (the
    host of a prompt, host line or `hostname` output), null elsewhere. Only the few lines that can
    be context are parsed further: a kernel log is millions of lines."""
    text = pl.col("text")
    roles = lines.select(
        "line",
        elided=text.str.contains(ELISION),
        prompt=text.str.contains(PROMPT),
        host_line=text.str.contains(HOST_LINE),
        named=text.str.contains(_HOSTNAME_OUTPUT) & text.shift(1).str.contains(_RAN_HOSTNAME).fill_null(False),
        clockish=text.str.contains(_CLOCKISH) & (text.str.len_chars() < 60),
    )
    at = lines.with_columns(roles.drop("line"))
    candidates = at.filter(~pl.col("elided") & ~pl.col("prompt") & pl.col("clockish"))
    stamps = {n: parse_time(t) for n, t in candidates.select("line", "text").iter_rows()}
    hosts = at.filter(pl.col("prompt") | pl.col("host_line") | pl.col("named")).select(
        "line",
        host=pl.coalesce(
            text.str.extract(PROMPT, 1),
            pl.when("prompt").then(text.str.extract(USER_AT_HOST, 1)),
            text.str.extract(HOST_LINE, 1),
            pl.when("named").then(text.str.strip_chars()),
        ),
    )
    return at.with_columns(
        _by_line(lines, {n: t for n, t in stamps.items() if t is not None}, "stamp", STAMP),
        _by_line(lines, dict(hosts.drop_nulls().iter_rows()), "prompt_host", pl.String),
    ).select(
        *lines.columns,
        "stamp",
        "prompt_host",
        is_date=pl.col("stamp").is_not_null(),
        ctx=pl.when(pl.col("stamp").is_not_null() | pl.col("host_line") | pl.col("named"))
        .then(pl.lit(PARSED, pl.UInt8))
        .when(pl.col("elided") | pl.col("prompt"))
        .then(pl.lit(IGNORED, pl.UInt8)),
    )


def _by_line(lines: pl.DataFrame, values: dict, name: str, dtype: pl.DataType) -> pl.Series | pl.Expr:
    """A column of `values` (line -> value), null on the other lines."""
    if not values:
        return pl.lit(None, dtype).alias(name)
    return pl.Series(name, [values.get(n) for n in lines["line"]], dtype=dtype)


def filled(lines: pl.DataFrame, over: str | None = None) -> pl.DataFrame:
    """Each line's `stamp` and `prompt_host`: the last stated above it, else the first below (in its
    file, where the column `over` tells several files' lines apart)."""
    columns = [pl.col(c).forward_fill().fill_null(strategy="backward") for c in ("stamp", "prompt_host")]
    return lines.with_columns(c.over(over) if over else c for c in columns)


def context(lines: pl.DataFrame, over: str | None = None) -> pl.DataFrame:
    """`marks`, then `filled` (`over`: see filled): for a format whose own lines name no host or time."""
    return filled(marks(lines), over)
