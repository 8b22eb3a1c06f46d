"""Real Linux TCP retransmissions (tests/captures/kernel_retransmissions, made by
make_kernel_retransmissions.py in two network namespaces) analysed per flow as tshark does:
retransmissions, fast retransmissions and duplicate ACKs within 10% of tshark's count."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.helpers import tshark
from tests.helpers.tshark import FLOW, needs_tshark
from tracelens.derived.flows import analyze
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
from tracelens.tables import conform

CAPTURES = Path(__file__).parent / "captures" / "kernel_retransmissions"
NAMES = ["loss-seen.pcap", "loss-unseen-reorder.pcap", "duplicates.pcap"]
COMPARED = {  # tracelens column: tshark display filter
    "retransmissions": "tcp.analysis.retransmission",
    "fast_retransmissions": "tcp.analysis.fast_retransmission",
    "dup_acks": "tcp.analysis.duplicate_ack",
}


def analysed(name: str):
    path = CAPTURES / name
    result = pcap.ingest(InputFile(path, name, "pcap"))
    assert result.account.errors == [] and result.account.unrecognized == 0
    return analyze(conform("packets", result.tables["packets"]))


@needs_tshark
@pytest.mark.parametrize("name", NAMES)
def test_per_flow_counts_match_tshark(name):
    analysis = analysed(name)
    # tshark counts a frame seen twice as a retransmission or a dup ACK; tracelens sets it apart as a
    # capture duplicate, so a flow's duplicates widen its tolerance
    duplicates = analysis.events.filter(pl.col("kind") == "capture duplicate").group_by("flow").len("duplicates")
    mine = analysis.tcp.join(duplicates, on="flow", how="left").with_columns(pl.col("duplicates").fill_null(0))
    for column, display_filter in COMPARED.items():
        theirs = tshark.per_flow(CAPTURES / name, display_filter)
        joined = mine.select(*FLOW, column, "duplicates").join(theirs, on=FLOW, how="full", coalesce=True).fill_null(0)
        for row in joined.iter_rows(named=True):
            assert abs(row[column] - row["len"]) <= 0.1 * row["len"] + row["duplicates"], (column, row)


def test_captures_hold_real_retransmissions():
    totals = {
        name: analysed(name).tcp.select(pl.col("retransmissions", "fast_retransmissions").sum()).row(0)
        for name in NAMES
    }
    assert all(retx >= 20 and fast >= 3 for retx, fast in totals.values()), totals
