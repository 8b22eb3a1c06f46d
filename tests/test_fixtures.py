"""The fixtures are the generator's output, and each one fires exactly the rules it was made to show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth.runs import write
from synth.scenarios import SCENARIOS
from tests.helpers import FIXTURES, RUNS

# The generator's runs at the top of fixtures/ (fixtures/pairs has its own generator and tests); real
# lab runs (expected.json "real": true) have their own tests.
FOLDERS = [
    p for p in RUNS if p.parent == FIXTURES and not json.loads((p / "expected.json").read_text()).get("real", False)
]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_scenario_has_a_fixture_and_back():
    assert {s.name for s in SCENARIOS} == {p.name for p in FOLDERS}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_fixture_is_the_generators_output(scenario, tmp_path):
    fresh = _tree(write(scenario, tmp_path))
    committed = _tree(FIXTURES / scenario.name)
    assert sorted(fresh) == sorted(committed), "regenerate with: python -m synth fixtures/"
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert not changed, f"differ from the generator's output: {changed}; regenerate with python -m synth fixtures/"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_fixture_says_it_is_synthetic(folder):
    assert "synthetic" in (folder / "README.md").read_text().lower()
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".md", ".json")]
    texts = [p for p in files if b"\x00" not in p.read_bytes()[:4096]]  # a capture has no room for a marker
    assert texts
    for text in texts:
        assert text.read_text().startswith(f"# tracelens synthetic fixture: {folder.name} "), text


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_fixture_fires_exactly_its_rules(folder, analysis_of):
    expected = json.loads((folder / "expected.json").read_text())
    assert expected["synthetic"] is True
    fired = {f.rule_id for f in analysis_of(folder).findings}
    assert fired == set(expected["rules"])


def test_frames_patched_from_a_shape_are_the_bytes_scapy_builds():
    """synth.pcap builds the first packet of each shape with scapy and patches the rest: every frame of
    conversations with every fault (NAKs, RNR, CNPs, PSN wrap, TCP loss, mirrored frames) is scapy's."""
    from synth import pcap

    made = [
        lambda: pcap.roce_conversation(faults=pcap.RoceFaults(lost=(50, 200), rnr=(120,), congested=(10, 11, 12))),
        lambda: pcap.roce_conversation(pcap.RoceQp(first_psn=0xFFFF00), messages=300),
        lambda: pcap.tcp_stream(lost=(40, 150, 151), mirrored=True),
    ]
    for make in made:
        packets, fresh = make(), make()
        shapes: dict[tuple, bytes] = {}
        patched = [pcap._frame(packet, shapes) for packet in packets]
        assert 3 <= len(shapes) < len(packets) / 10, "most frames are patched"
        assert patched == [bytes(packet) for packet in fresh]
