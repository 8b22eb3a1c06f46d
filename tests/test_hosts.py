"""Capture addresses tied to the run's hosts (derived.hosts), or said to be untied."""

from __future__ import annotations

from tests.helpers import tables_from
from tracelens.derived.hosts import host_names, untied

STEP = {"host": "node-a", "rank": 0, "step": 1}
PACKETS = [{"src": "10.99.0.1", "dst": "10.99.0.2", "frame": 1}, {"src": "10.99.0.2", "dst": "10.99.0.1", "frame": 2}]


def test_an_interface_listing_ties_a_capture_address_to_its_host():
    tables = tables_from(
        interfaces=[{"host": "node-a", "ipv4": "10.99.0.1/24"}, {"host": "node-b", "ipv4": "10.99.0.2/24"}],
        steps=[STEP],
        packets=PACKETS,
    )
    names = host_names(tables)
    assert names == {"10.99.0.1": "node-a", "10.99.0.2": "node-b"}
    assert untied(tables, names) == ""


def test_addresses_no_evidence_ties_are_said_to_be_untied():
    tables = tables_from(steps=[STEP, {**STEP, "host": "node-b"}], packets=PACKETS)
    note = untied(tables, host_names(tables))
    assert "10.99.0.1, 10.99.0.2 could not be tied to the run's hosts (node-a, node-b)" in note


def test_hosts_named_by_their_addresses_need_no_tie():
    tables = tables_from(steps=[{**STEP, "host": "10.99.0.1"}, {**STEP, "host": "10.99.0.2"}], packets=PACKETS)
    assert untied(tables, host_names(tables)) == ""
