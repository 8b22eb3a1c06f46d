"""The report's hang section: a lane per rank of its last collectives and where the ranks diverge."""

from __future__ import annotations

import json

from tracelens.analyze import analyze
from tracelens.report.html import render


def test_lanes_show_where_the_ranks_diverge(analysis_of):
    html = render(analysis_of("lab-hang-sleep"))
    assert 'id="hang"' in html and "Process group 0 (default_pg): stuck at #21" in html
    lane = html[html.index("stuck at #21") :]
    rank2 = lane[lane.index("<tr><td>2</td>") : lane.index("</tr>", lane.index("<tr><td>2</td>"))]
    assert 'class="lane-never diverge"' in rank2 and "never started" in rank2
    assert rank2.count("lane-completed") == 5  # #16 to #20 completed, then nothing at #21
    rank0 = lane[lane.index("<tr><td>0</td>") : lane.index("</tr>", lane.index("<tr><td>0</td>"))]
    assert 'class="lane-waiting diverge"' in rank0 and "all_reduce scheduled" in rank0
    assert "<strong>Rank 2 stopped first</strong>" in html and "Loader.next_batch (worker.py:47)" in html


def test_killed_rank_has_a_no_dump_lane(analysis_of):
    html = render(analysis_of("lab-hang-kill"))
    lane = html[html.index("stuck at #21") :]
    rank2 = lane[lane.index("<tr><td>2</td>") : lane.index("</tr>", lane.index("<tr><td>2</td>"))]
    assert rank2.count("lane-nodump") == 6 and "no dump" in rank2


def test_healthy_dumps_show_completed_lanes_without_divergence(analysis_of):
    html = render(analysis_of("lab-hang-healthy"))
    assert "Process group 0 (default_pg): every collective completed" in html
    assert 'diverge"' not in html.split('id="hang"')[1].split("</section>")[0].replace('class="num"', "")


def test_no_dumps_no_section_and_frames_are_escaped(tmp_path, analysis_of):
    assert 'id="hang"' not in render(analysis_of("watchdog-hang"))
    entry = {
        "record_id": 1,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_700_000_000_000_000_000,
        "input_sizes": [[1]],
        "output_sizes": [[1]],
        "state": "started",
        "frames": [{"name": "<script>alert(1)</script>", "filename": "t.py", "line": 1}],
    }
    (tmp_path / "trace_rank_0.json").write_text(json.dumps({"version": "2.4", "pg_config": {}, "entries": [entry]}))
    (tmp_path / "trace_rank_1.json").write_text(
        json.dumps(
            {"version": "2.4", "pg_config": {}, "entries": [{**entry, "collective_seq_id": 0, "state": "completed"}]}
        )
    )
    html = render(analyze(tmp_path))
    assert 'id="hang"' in html and "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_p2p_only_hang_renders(tmp_path):
    base = {
        "pg_id": 2,
        "process_group": ["2", "pp_group"],
        "collective_seq_id": 0,
        "is_p2p": True,
        "input_sizes": [[4]],
        "output_sizes": [[4]],
        "time_created_ns": 1_700_000_000_000_000_000,
        "frames": [],
    }
    send = {**base, "record_id": 1, "p2p_seq_id": 1, "profiling_name": "nccl:send 0->1", "state": "started"}
    other = {**base, "record_id": 1, "p2p_seq_id": 1, "profiling_name": "nccl:recv 1<-0", "state": "completed"}
    (tmp_path / "trace_rank_0.json").write_text(json.dumps({"version": "2.4", "entries": [send]}))
    (tmp_path / "trace_rank_1.json").write_text(json.dumps({"version": "2.4", "entries": [{**other, "p2p_seq_id": 0}]}))
    analysis = analyze(tmp_path)
    assert [f.ranks for f in analysis.findings if f.rule_id == "TL420"] == [[1]]
    assert 'id="hang"' in render(analysis)
