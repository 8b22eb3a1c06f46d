"""Findings snapshots: every committed fixture run (tests.helpers.RUNS) has its findings written in
tests/snapshots/<run>.json (rule, severity, title, hosts, ranks, ports, window in UTC), so that any
change to a verdict shows in review as a change to that file. After a change that means to move a
verdict, rewrite them all with

    python -m pytest tests/test_snapshots.py --snapshot-update

and read the diff before committing it."""

from __future__ import annotations

import difflib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, RUNS
from tracelens.analyze import Analysis
from tracelens.findings import Finding

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = "--snapshot-update"  # the option conftest.py adds
COMMAND = f"python -m pytest tests/test_snapshots.py {UPDATE}"


def _name(run: Path) -> str:
    return run.relative_to(FIXTURES).as_posix()


def _path(run: Path) -> Path:
    return SNAPSHOTS / f"{_name(run)}.json"


def _utc(t: datetime) -> str:
    return (
        (t if t.tzinfo else t.replace(tzinfo=timezone.utc))
        .astimezone(timezone.utc)
        .strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    )


def _finding(f: Finding) -> dict:
    return {
        "rule": f.rule_id,
        "severity": f.severity.label,
        "title": f.title,
        "hosts": f.hosts,
        "ranks": f.ranks,
        "ports": sorted(f.ports),
        "window": [_utc(t) for t in f.window] if f.window else None,
    }


def _place(row: dict) -> tuple:
    """Where a finding sits in its file: by rule, then window and scope, what changes least, so that a
    changed severity or title shows as that line changing in place."""
    return (row["rule"], row["window"] or [], row["hosts"], row["ranks"], row["ports"], row["title"], row["severity"])


def snapshot(analysis: Analysis) -> str:
    """The findings as the snapshot file holds them: in a fixed order (_place), not the one the rules
    rank them in (which the scenario tests check); one field a line, so that a diff names the field
    that moved."""
    rows = sorted((_finding(f) for f in analysis.findings), key=_place)
    objects = [
        "    {\n"
        + ",\n".join(f"      {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in row.items())
        + "\n    }"
        for row in rows
    ]
    return '{\n  "findings": [' + (("\n" + ",\n".join(objects) + "\n  ") if objects else "") + "]\n}\n"


@pytest.mark.parametrize("run", RUNS, ids=_name)
def test_findings_match_the_snapshot(run: Path, analysis_of, request):
    analysis = analysis_of(run)
    failed = "\n".join(f"{f.rule.id}: {f.traceback}" for f in analysis.failed)
    assert not failed, f"{_name(run)}: rules failed\n{failed}"
    fresh, path = snapshot(analysis), _path(run)
    if request.config.getoption(UPDATE):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh, encoding="utf-8")
        return
    assert path.is_file(), f"{_name(run)} has no snapshot; write it with: {COMMAND}"
    committed = path.read_text(encoding="utf-8")
    if fresh != committed:
        diff = difflib.unified_diff(
            committed.splitlines(), fresh.splitlines(), f"{path.name} (committed)", f"{path.name} (now)", lineterm=""
        )
        pytest.fail(
            f"the findings of fixtures/{_name(run)} changed (if that is meant: {COMMAND}):\n" + "\n".join(diff),
            pytrace=False,
        )


def test_every_snapshot_has_its_run(request):
    """A snapshot whose run is gone (or moved) is stale; --snapshot-update removes it."""
    expected = {_path(run) for run in RUNS}
    stale = sorted(p for p in SNAPSHOTS.rglob("*.json") if p not in expected)
    if request.config.getoption(UPDATE):
        for path in stale:
            path.unlink()
        return
    assert not stale, f"snapshots of no fixture run (removed by {COMMAND}): {[str(p) for p in stale]}"
