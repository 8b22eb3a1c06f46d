"""Helpers the test modules share: where the fixtures and the real corpus are, small RunTables built
from rows, and one rule fired on them. Domain builders live beside this (steps, host, fabric, nccl,
pcap); session-wide fixtures (the analysis of each committed fixture) are in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from tracelens.derived import RunContext
from tracelens.rules import all_rules
from tracelens.tables import RunTables
from tracelens.timeline import Timeline

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"
FIXTURES = REPO / "fixtures"
SCENARIOS = sorted(p.name for p in FIXTURES.glob("scenario-*") if p.is_dir())
# Every committed run the tests analyse: a folder under fixtures/, at any depth, that holds an
# expected.json (the generator's runs, fixtures/pairs/<run>, the lab's runs, however they are grouped).
RUNS = sorted({p.parent for p in FIXTURES.rglob("expected.json")}, key=lambda p: p.relative_to(FIXTURES).as_posix())

# What a report section reads from an analysis when a test gives it no findings.
NO_FINDINGS = SimpleNamespace(findings=[], timeline=Timeline(), notes=[])


def corpus_dir(kind: str) -> Path:
    """A corpus folder, or skip the test when the corpus is not beside the repository."""
    path = CORPUS / kind
    if not path.is_dir():
        pytest.skip(f"real-log corpus not found at {path} (it lives in ../shared/corpus beside the repo)")
    return path


def tables_from(**rows: list[dict]) -> RunTables:
    """RunTables with the given rows per table; provenance defaults so tests stay short."""
    tables = RunTables()
    for name, items in rows.items():
        filled = [{"file": "t.log", "line": i + 1, **item} for i, item in enumerate(items)]
        tables.add(name, pl.DataFrame(filled, infer_schema_length=None))
    return tables


def fire(tables: RunTables, rule_id: str, **settings):
    """The findings of one rule on `tables` (as they are: not aligned), with its default settings
    except those given."""
    (chosen,) = [r for r in all_rules() if r.id == rule_id]
    return chosen.run(RunContext(tables), settings)
