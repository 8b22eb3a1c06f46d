"""Decoding packet captures: the record stream (records), its walk in a process of its own
(walker), byte gathering (gather) and the vectorized decoder (decode). The capture format's reader,
which makes the decoded frames into the `packets` table, is tracelens.ingest.packets.pcap.

This package stands apart from tracelens.ingest because the walker's child process imports it:
it needs numpy alone, and importing anything under tracelens.ingest would load polars and the
format registry into that process too. Flow analysis of the decoded packets is derived
(tracelens.derived.flows).
"""
