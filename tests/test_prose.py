"""The shared wording helper: plurals, numbers with units and separators, one time format."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from tests.helpers import SCENARIOS
from tracelens.prose import count, duration, labelled, listing, number, plural_of, some, span
from tracelens.report.markdown import render as markdown


@pytest.mark.parametrize(
    ("n", "noun", "expected"),
    [
        (144, "RoCE retransmission", "144 RoCE retransmissions"),
        (1, "RoCE retransmission", "1 RoCE retransmission"),
        (72, "PSN gap", "72 PSN gaps"),
        (36, "NAK (PSN sequence error)", "36 NAKs (PSN sequence error)"),
        (2, "IB completion (IBV_WC_RETRY_EXC_ERR) line", "2 IB completion (IBV_WC_RETRY_EXC_ERR) lines"),
        (3, "independent source", "3 independent sources"),
        (2, "process", "2 processes"),
        (4, "capture copy", "4 capture copies"),
        (8123, "SymbolErrorCounter", "8,123 SymbolErrorCounter"),
        (220, "ECN-CE", "220 ECN-CE marks"),
        (0, "finding", "0 findings"),
    ],
)
def test_counts_agree_with_their_number(n, noun, expected):
    assert count(n, noun) == expected


def test_numbers_have_separators_units_and_no_spurious_decimals():
    assert number(3545912563) == "3,545,912,563"
    assert number(1175.4, "ms") == "1,175 ms"
    assert number(3.84, "x") == "3.8x"
    assert number(0.0114, "ms") == "0.011 ms"
    assert number(41, "%") == "41%"
    assert number(2.0, "s") == "2 s"


def test_times_read_one_way():
    start = datetime(2024, 12, 6, 18, 31, 23, tzinfo=timezone.utc)
    assert span(start, start.replace(minute=35, second=1)) == "2024-12-06 18:31:23 to 18:35:01 UTC"
    assert span(start, start.replace(day=7)) == "2024-12-06 18:31:23 to 2024-12-07 18:31:23 UTC"
    assert duration(132.8) == "2.2 min" and duration(41.2) == "41.2 s" and duration(5400) == "1.5 h"


def test_lists():
    assert listing(["node01"]) == "node01" and listing(["a", "b", "c"]) == "a, b and c"
    assert plural_of("rank") == "ranks"


@pytest.mark.parametrize("name", SCENARIOS)
def test_findings_read_as_written_by_a_person(name, analysis_of):
    """No '(s)' plurals, no word written twice, one time format (no ISO 'T' times) in what the ticket gets."""
    text = markdown(analysis_of(name))
    assert "(s)" not in text
    assert not re.search(r"\b([A-Za-z]{2,})\s+\1\b", text, re.I), re.search(r"\b([A-Za-z]{2,})\s+\1\b", text, re.I)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # log lines are quoted as they were
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", prose)


def test_long_lists_say_how_many_more():
    hosts = [f"node{i:03d}" for i in range(1, 41)]
    assert some(hosts) == "node001, node002, node003 and 37 more"
    assert some(hosts[:4]) == "node001, node002, node003 and node004"


def test_items_follow_their_noun_in_number():
    assert labelled("rank", [2]) == "rank 2" and labelled("rank", [0, 1, 3]) == "ranks 0, 1 and 3"
    assert labelled("rank", list(range(20)), 4) == "ranks 0, 1, 2 and 17 more" and labelled("peer", []) == "no peer"


def test_number_runs_name_three_or_more_in_a_row_as_a_range():
    from tracelens.prose import number_runs, run_label

    runs = number_runs([7, 0, 1, 2, 3, 9, 10, 3])
    assert runs == [[0, 1, 2, 3], [7], [9], [10]] and [run_label(r) for r in runs] == ["0-3", "7", "9", "10"]
    assert number_runs([]) == [] and number_runs([5]) == [[5]]


def test_numbers_text_counts_the_numbers_it_leaves_out():
    from tracelens.prose import numbers_text

    assert numbers_text([3, 0, 1]) == "0, 1 and 3" and numbers_text(list(range(64))) == "0-63"
    assert numbers_text([*range(4), 7, 9, 10, 11, 40, 42, *range(44, 50)], limit=4) == "0-3, 7, 9-11 and 8 more"
