"""The format registry: every reader registers itself with `@input_format`, in one sniffing order,
and the registry refuses what would make a format unreachable or its reader wrongly called; every
parser of a format found inside text logs registers itself with `@line_format`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tracelens.ingest import (
    IngestResult,
    InputFile,
    find_format,
    formats,
    input_format,
    line_format,
    line_formats,
    sniff_format,
)

FORMATS = [
    "kineto",
    "flight_recorder",
    "fr_analyzer",
    "pcap",
    "ds_config",
    "nvidia_smi",
    "interfaces",
    "perftest",
    "kernel_log",
    "ethtool",
    "hw_counters",
    "ibstat",
    "ibstatus",
    "ibv_devinfo",
    "perfquery",
    "log",
]


def test_every_format_is_found_in_its_family_package_in_sniffing_order():
    found = formats()
    assert [f.name for f in found] == FORMATS
    assert [f.priority for f in found] == sorted(f.priority for f in found)
    assert {f.name for f in found if f.splits} == {"log"}
    assert {f.name for f in found if not f.reads_lines} == {"kineto", "flight_recorder", "pcap", "ds_config"}
    assert find_format("pcap").ingest.__module__ == "tracelens.ingest.packets.pcap"
    assert find_format("perfquery").ingest.__module__ == "tracelens.ingest.fabric.perfquery"


def test_the_first_sniffer_by_priority_names_the_format():
    # a Kineto trace is JSON, as a Flight Recorder dump is: the trace's sniffer is asked first
    trace = b'{"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": ['
    assert find_format("kineto").sniff(trace) and sniff_format(trace) == "kineto"
    assert sniff_format(b"NCCL INFO hello\n") == "log"


def _reader(source: InputFile) -> IngestResult:
    return IngestResult()


def test_a_format_name_is_registered_once_and_never_one_discovery_gives():
    with pytest.raises(ValueError, match="registered twice"):
        input_format("pcap", priority=1, sniff=lambda head: False)(_reader)
    for taken in ("config", "binary", "empty", "utf16"):
        with pytest.raises(ValueError, match="discovery gives"):
            input_format(taken, priority=1, sniff=lambda head: False)(_reader)


def test_a_splitting_reader_must_take_jobs_and_workers():
    with pytest.raises(ValueError, match="jobs= and workers="):
        input_format("test-splitting", priority=1, sniff=lambda head: False, splits=True)(_reader)


def test_no_format_module_declares_itself_by_module_constants():
    """What a format is lives in its @input_format registration only: a module constant FORMAT,
    PRIORITY, SPLITS or READS_LINES would look like a declaration and be read by nothing."""
    package = Path(__file__).resolve().parents[1] / "src" / "tracelens" / "ingest"
    declared = [
        f"{path.relative_to(package)}: {line.split('=')[0].strip()}"
        for path in sorted(package.rglob("*.py"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.match(r"(FORMAT|PRIORITY|SPLITS|READS_LINES)\s*(:[^=]*)?=", line)
    ]
    assert not declared, declared


def test_every_line_format_is_found_in_its_family_package():
    found = {f.name: f for f in line_formats()}
    assert list(found) == ["deepspeed", "nccl", "nccl_tests", "rendezvous", "stacks"]
    assert {name for name, f in found.items() if f.spills} == {"deepspeed", "nccl"}
    # NCCL's records wrap onto lines of any text: its parser reads every line, the others their candidates'
    assert {name for name, f in found.items() if not f.candidates} == {"nccl"}
    assert found["stacks"].parser.__module__ == "tracelens.ingest.hangs.stacks"


def test_a_line_format_is_registered_once_with_a_parser_that_feeds_and_finishes():
    class Feeds:
        def feed(self, chunk):
            return chunk["line"]

    with pytest.raises(ValueError, match="registered twice"):
        line_format("nccl")(Feeds)
    with pytest.raises(ValueError, match="Feeds has no finish"):
        line_format("test-no-finish")(Feeds)
