"""Numbers, counts and times as a person writes them, for rules and report alike.

One place decides how "144 RoCE retransmissions", "1,444", "2.2 min" and
"2024-12-06 18:31:23 to 18:35:01 UTC" are written, so that findings, the verdict,
the terminal and the Markdown all read the same and no rule pluralises by hand.
"""

from __future__ import annotations

import re
from datetime import datetime

_IRREGULAR = {"was": "were", "is": "is", "has": "have", "this": "these", "its": "their", "does": "do"}
_UNCOUNTED = {"data", "evidence", "information", "traffic", "hardware", "software"}
# The noun to inflect is the last word, or the word before a closing parenthetical:
# "NAK (PSN sequence error)" -> "NAKs (PSN sequence error)".
_HEAD = re.compile(r"^(?P<head>.*?)(?P<noun>[A-Za-z_]+)(?P<tail>\s*(?:\([^()]*\))?)$", re.S)


_PHRASES = {"ECN-CE": "ECN-CE marks"}  # names of events that are not nouns


def plural_of(noun: str) -> str:
    """The plural of an English noun phrase ("PSN gap" -> "PSN gaps", "NAK (other)" -> "NAKs (other)")."""
    if noun in _PHRASES:
        return _PHRASES[noun]
    match = _HEAD.match(noun)
    if not match:
        return noun
    word = match["noun"]
    lower = word.lower()
    if lower in _IRREGULAR:
        plural = _IRREGULAR[lower]
    elif lower in _UNCOUNTED or word.endswith("Counter") or word.endswith("_err") or "_" in word:
        return noun  # counter names stay as the tool prints them
    elif word.isupper():
        plural = word + "s"  # NAKs, CNPs, QPs, HCAs
    elif re.search(r"(s|x|z|ch|sh)$", lower):
        plural = word + "es"
    elif re.search(r"[^aeiou]y$", lower):
        plural = word[:-1] + "ies"
    else:
        plural = word + "s"
    return f"{match['head']}{plural}{match['tail']}"


def count(n: float, noun: str, plural: str | None = None) -> str:
    """`1 rank`, `144 RoCE retransmissions`, `8,123 symbol errors`: a number and its noun, agreed."""
    word = noun if n == 1 else (plural or plural_of(noun))
    return f"{number(n)} {word}"


def number(value: float, unit: str = "", digits: int | None = None) -> str:
    """Thousands separators, no spurious decimals: 8123 -> '8,123', 1175.4 -> '1,175', 3.84 -> '3.8'.
    A unit follows after a space ('1,175 ms'), except '%' and 'x'."""
    if digits is None:
        digits = 0 if float(value).is_integer() or abs(value) >= 100 else 1 if abs(value) >= 1 else 3
    text = f"{value:,.{digits}f}"
    if not unit:
        return text
    return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}"


def duration(seconds: float) -> str:
    """`41.2 s`, `2.2 min`, `1.5 h`: a time lost or a length of time."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def clock(moment: datetime) -> str:
    """A moment on the run's UTC axis, to the second: '2024-12-06 18:31:23 UTC'."""
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def span(start: datetime, end: datetime) -> str:
    """'2024-12-06 18:31:23 to 18:35:01 UTC' (the end's date only when it differs)."""
    end_text = f"{end:%H:%M:%S}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M:%S}"
    return f"{start:%Y-%m-%d %H:%M:%S} to {end_text} UTC"


def during(start: datetime, end: datetime) -> str:
    """'from 2024-12-06 18:31:23 to 18:35:01 UTC', or 'at 2024-12-06 18:31:23 UTC' within one second."""
    return (
        f"at {clock(start)}"
        if end.replace(microsecond=0) == start.replace(microsecond=0)
        else f"from {span(start, end)}"
    )


def listing(items: list[str], conjunction: str = "and") -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def some(items: list[str], limit: int = 4) -> str:
    """Up to `limit` items, then how many more: 'node001, node009, node017 and 5 more hosts' style
    ('a, b and c' when they all fit)."""
    items = [i for i in items if i]
    if len(items) <= limit:
        return listing(items)
    return f"{', '.join(items[: limit - 1])} and {len(items) - limit + 1} more"


def number_runs(numbers: list[int], shortest: int = 3) -> list[list[int]]:
    """Distinct integers, sorted, in groups: runs of `shortest` or more in a row together, the others
    alone ([0, 1, 2, 3, 7, 9, 10] -> [[0, 1, 2, 3], [7], [9], [10]]): 64 ranks read as 'ranks 0-63'."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return [group for r in runs for group in ([r] if len(r) >= shortest else [[n] for n in r])]


def run_label(run: list[int]) -> str:
    """'0-63' for a run, '7' for one number."""
    return f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0])


def numbers_text(numbers: list[int], limit: int = 16) -> str:
    """'0, 1 and 3', '0-63', '0-3, 7, ... and 20 more': numbers as a person lists them (runs as ranges,
    past `limit` pieces the count of those left out)."""
    runs = number_runs(numbers)
    labels = [run_label(r) for r in runs]
    if len(runs) <= limit:
        return listing(labels)
    return f"{', '.join(labels[: limit - 1])} and {sum(map(len, runs[limit - 1 :]))} more"


def ranks_text(ranks: list[int], limit: int = 16) -> str:
    """`rank 2`, `ranks 0, 1 and 3`, `ranks 0-63`, `ranks 0-3, 7, ... and 20 more`: ranks as a person lists them."""
    distinct = set(ranks)
    if not distinct:
        return "no rank"
    return f"{'rank' if len(distinct) == 1 else 'ranks'} {numbers_text(ranks, limit)}"


def labelled(noun: str, items: list, limit: int | None = None) -> str:
    """'rank 2', 'ranks 0, 1 and 3', 'ranks 0, 1, 2 and 13 more', or 'no rank': items after their noun."""
    names = [str(i) for i in items]
    if not names:
        return f"no {noun}"
    shown = some(names, limit) if limit else listing(names)
    return f"{noun if len(names) == 1 else plural_of(noun)} {shown}"
