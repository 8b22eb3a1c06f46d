"""The report's step-time section: charts, slow windows, left out when a run has no steps."""

from __future__ import annotations

from tests.helpers import NO_FINDINGS, tables_from
from tracelens.analyze import analyze
from tracelens.derived import RunContext
from tracelens.report.html import render
from tracelens.report.sections import steps as section


def test_section_for_a_slow_window(analysis_of):
    analysis = analysis_of("ds-slow-window")
    ctx = section.context(analysis.context, analysis)
    (chart,) = ctx["charts"]
    assert chart["time"].startswith("<svg") and chart["phases"].startswith("<svg")
    (window,) = ctx["windows"]
    assert window["label"] == "steps 120-159" and window["steps"] == 40 and window["basis"] == "timers"
    assert ctx["streams"][0]["steps"] == 300


def test_section_left_out_without_steps():
    assert section.context(RunContext(tables_from(nccl_events=[{"message": "x"}])), NO_FINDINGS) is None


def test_rendered_page_escapes_log_text(tmp_path):
    run = tmp_path / "<b>run"
    run.mkdir()
    (run / "train.log").write_text(
        "".join(
            (
                f"[2024-01-01 00:00:{i:02d},000] [INFO] [logging.py:96:log_dist]"
                " [Rank 0] time (ms) | fwd: 1.00 | bwd: 2.00 | step: 1.00\n"
            )
            for i in range(20)
        )
    )
    page = render(analyze(run))
    assert "Step time" in page and "<b>run" not in page
