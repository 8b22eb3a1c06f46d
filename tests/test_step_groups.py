"""A big run's step series computed and read a group of whole streams at a time gives exactly what one
pass over the whole series in memory gives: the series, the slow windows and episodes, every finding,
the report's step sections and the comparison's pace, with groups of one stream, of a few and of all."""

from __future__ import annotations

import polars as pl
import pytest

from tracelens.analyze import run_rules
from tracelens.compare.timing import pace
from tracelens.derived import RunContext, stream_groups
from tracelens.derived.step_times import STREAM
from tracelens.derived.stream_groups import StreamGroups, split
from tracelens.report.sections import steps as steps_section
from tracelens.report.sections import timeline as timeline_section

# every step rule fires on one of these: spikes and slow windows (TL401, TL402, TL410, on timers and on
# timestamps), throughput drops (TL403), stragglers (TL404, 8 ranks on two hosts), a hang (TL411), a
# socket fallback (TL412, TL504), GPU utilisation and kernel events in slow windows (TL601, TL605),
# and 56 streams of several runs (pairs)
FOLDERS = [
    "ds-slow-window",
    "lab-checkpoint",
    "lab-clock-skew",
    "lab-straggler",
    "pairs",
    "scenario-congestion",
    "scenario-gpu-idle-bad-link",
    "scenario-hang",
    "scenario-socket-fallback",
    "scenario-straggler",
]


def _grouped(analysis, tmp_path) -> RunContext:
    """The analysis's tables with its steps as a lazy scan of Parquet (a big run's, spilled), and a
    context with a working folder to write the step series' groups to."""
    path = tmp_path / "steps.parquet"
    analysis.tables["steps"].write_parquet(path)
    tables = analysis.tables.with_frames({"steps": pl.scan_parquet(path)})
    return RunContext(tables, analysis.config.shared, workdir=tmp_path / "derived")


def _whole(groups: StreamGroups) -> pl.DataFrame:
    return pl.concat(groups.frames())


# groups of one stream on the smaller runs (one step's rows in the comparison's groups of steps), of a
# few hundred rows on all: two-stream lab runs in two groups, many-stream runs in several (the 56
# streams of 100 steps of pairs in six groups of 1,000 rows: groups of 150 would make the test slow)
CASES = [(folder, 1) for folder in FOLDERS if folder.startswith(("ds-", "scenario-"))] + [
    (folder, 1000 if folder == "pairs" else 150) for folder in FOLDERS
]


@pytest.mark.parametrize(("folder", "group_rows"), CASES)
def test_step_analysis_by_groups_of_streams_equals_one_pass_in_memory(
    folder, group_rows, analysis_of, tmp_path, monkeypatch
):
    analysis = analysis_of(folder)
    memory = analysis.context
    monkeypatch.setattr(stream_groups, "GROUP_ROWS", group_rows)
    monkeypatch.setattr(stream_groups, "SLICE_ROWS", 97)  # the table split a slice of rows at a time
    grouped = _grouped(analysis, tmp_path)
    streams = analysis.tables["steps"].select(STREAM).unique().height
    groups = len(grouped.step_series.parts)
    assert groups == streams if group_rows == 1 else 1 <= groups <= streams
    assert len(memory.step_series.parts) == 1
    for name in ("step_series", "wall_series"):
        assert _whole(getattr(grouped, name)).equals(_whole(getattr(memory, name)), null_equal=True), name
    for name in ("slow_windows", "sustained_windows", "slow_episodes", "run_time_s"):
        assert getattr(grouped, name) == getattr(memory, name), name
    findings = run_rules(grouped, analysis.rules, analysis.config).findings
    assert [f.to_json() for f in findings] == [f.to_json() for f in analysis.findings]
    for section in (steps_section, timeline_section):
        assert section.context(grouped, analysis) == section.context(memory, analysis), section.__name__
    mine, theirs = pace(grouped), pace(memory)
    assert (mine is None) == (theirs is None)
    if mine:
        assert mine.per_step.equals(theirs.per_step, null_equal=True)
        assert (mine.samples_per_sec, mine.comm_share) == (theirs.samples_per_sec, theirs.comm_share)


def test_frames_by_a_key_hold_each_value_whole_in_table_order(tmp_path, monkeypatch):
    """`by(keys)`: a value of the keys whose streams two groups hold comes back whole, read by filter."""
    monkeypatch.setattr(stream_groups, "SLICE_ROWS", 3)
    monkeypatch.setattr(stream_groups, "GROUP_ROWS", 3)
    rows = pl.DataFrame(
        {
            "file": ["a"] * 6 + ["b"] * 4,
            "host": ["h1", "h1", "h2", "h2", "h1", None, "h1", "h1", "h3", None],
            "rank": [0, 0, 1, 1, 2, 3, 0, 0, 5, 6],
            "row": range(10),
        }
    )
    groups = split(rows.lazy(), ["file", "host", "rank"], tmp_path)
    assert len(groups.parts) > 2
    whole = pl.concat(groups.frames())
    assert whole.equals(rows.sort("file", "host", "rank", nulls_last=True, maintain_order=True))
    for keys in (["host"], ["host", "rank"], ["file"]):
        frames = list(groups.by(keys))
        owner = {}
        for i, frame in enumerate(frames):
            for value in frame.select(keys).unique().iter_rows():
                assert owner.setdefault(value, i) == i, (keys, value)
            assert frame["row"].to_list() == sorted(frame["row"].to_list(), key=whole["row"].to_list().index)
        assert sorted(pl.concat(frames)["row"].to_list()) == list(range(10))
    assert groups.stream(("a", None, 3))["row"].to_list() == [5]
    assert groups.stream(("b", "h9", 0)).height == 0


def test_a_big_run_whose_step_rows_have_no_step_number_has_no_step_findings(analysis_of, tmp_path, monkeypatch):
    """Spilled step rows none of which names its step (every row dropped from the series): the rules and
    the report's sections run on an empty series, as on a run without steps."""
    analysis = analysis_of("scenario-straggler")
    monkeypatch.setattr(stream_groups, "GROUP_ROWS", 1)
    path = tmp_path / "steps.parquet"
    analysis.tables["steps"].with_columns(step=pl.lit(None, pl.Int64)).write_parquet(path)
    context = RunContext(analysis.tables.with_frames({"steps": pl.scan_parquet(path)}), workdir=tmp_path / "derived")
    assert _whole(context.step_series).height == 0 and context.slow_episodes == []
    findings = run_rules(context, analysis.rules, analysis.config).findings
    assert not [f for f in findings if f.rule_id in {"TL401", "TL402", "TL403", "TL404", "TL410", "TL412"}]
    assert steps_section.context(context, analysis)["streams"] == []
    assert pace(context) is None
