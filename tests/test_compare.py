"""`tracelens diff`: the injected change ranks first, a rerun of a healthy job ranks nothing, a run
against itself has no difference, and the statistics behind "significant" hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synth.pairs import write_pairs
from tracelens.cli import app
from tracelens.compare import _changed_hosts, compare
from tracelens.stats import binomial_sf, mann_whitney_p, rate_rise_p

PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "pairs"
EXPECTED = json.loads((PAIRS / "pairs.json").read_text())


@pytest.fixture
def analysed(analysis_of):
    """`analysed(name)`: a pair run's analysis, shared by the whole session."""
    return lambda name: analysis_of(PAIRS / name)


def test_pairs_are_the_generators_output(tmp_path):
    fresh = write_pairs(tmp_path)
    tree = lambda root: {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}  # noqa: E731
    assert tree(fresh) == tree(PAIRS), "regenerate with the pairs generator (see fixtures/pairs/README.md)"


@pytest.mark.parametrize("pair", EXPECTED["pairs"], ids=lambda p: p["bad"])
def test_the_injected_change_ranks_first(pair, analysed):
    result = compare(analysed(pair["good"]), analysed(pair["bad"]))
    if pair["top"] is None:
        assert result.changes == [], [c.sentence for c in result.changes]
        assert result.pace is not None and not result.pace.significant
        assert result.verdict.startswith("No significant difference")
        return
    top = result.changes[0]
    assert (top.area, top.what) == (pair["top"]["area"], pair["top"]["what"]), [c.sentence for c in result.changes[:3]]
    # the slowdown is measured and put where it went: the all-reduce, which the change explains
    assert result.pace.significant and result.pace.delta_ms > 200
    assert top.explains_ms is not None and top.explains_ms > 0.8 * result.pace.delta_ms
    assert "all-reduce" in result.verdict and top.what in result.verdict


@pytest.mark.parametrize("name", sorted({p["bad"] for p in EXPECTED["pairs"]}))
def test_each_pair_run_fires_its_own_rules(name, analysed):
    expected = json.loads((PAIRS / name / "expected.json").read_text())
    assert {f.rule_id for f in analysed(name).findings} == set(expected["rules"])


def test_changes_on_some_hosts_name_them(analysed):
    result = compare(analysed("healthy"), analysed("gdr-lost"))
    top = result.changes[0]
    assert top.hosts == ("node03", "node04")
    assert top.coverage == pytest.approx(0.5)
    assert "NET/IB/GDRDMA -> NET/IB on 2 hosts (node03, node04)" in top.sentence


def test_a_run_against_itself_has_no_difference(analysed):
    run = analysed("port-half-rate")
    result = compare(run, run)
    assert result.changes == [] and not result.pace.significant
    assert set(result.unchanged) >= {"NCCL", "DeepSpeed", "fabric", "steps"}


def test_hosts_are_matched_by_role_when_the_names_differ():
    # 16 hosts on GDR in the good run; in the slow run, other host names, 8 of them without it
    good = {f"a{i:02}": "NET/IB/GDRDMA" for i in range(16)}
    bad = {f"b{i:02}": "NET/IB/GDRDMA" if i < 8 else "NET/IB" for i in range(16)}
    assert _changed_hosts(good, bad) == [f"b{i:02}" for i in range(8, 16)]
    # same values in other proportions: the hosts whose value gained share
    assert _changed_hosts({"a1": "X", "a2": "Y"}, {"b1": "Y", "b2": "Y"}) == ["b1", "b2"]
    assert _changed_hosts({"a1": "X"}, {"b1": "X"}) == []


def test_rate_test_weighs_counts_against_their_baseline():
    # 3 events against none over the same time is not evidence; 300 against 100 is
    assert rate_rise_p(3, 10.0, 0, 10.0) == pytest.approx(0.125)
    assert rate_rise_p(300, 10.0, 100, 10.0) < 1e-20
    # 300 against 280 over the same time is no rise
    assert rate_rise_p(300, 10.0, 280, 10.0) > 0.1
    # a longer baseline with the same rate is no rise either
    assert rate_rise_p(10, 10.0, 100, 100.0) > 0.3
    assert binomial_sf(0, 5, 0.5) == 1.0 and binomial_sf(6, 5, 0.5) == 0.0
    assert binomial_sf(5, 5, 0.5) == pytest.approx(1 / 32)


def test_mann_whitney_tells_shift_from_jitter():
    jitter = [100 + (i * 7919 % 11) for i in range(60)]
    assert mann_whitney_p(jitter, list(reversed(jitter))) == pytest.approx(1.0)
    assert mann_whitney_p(jitter, [x + 30 for x in jitter]) < 1e-10
    assert mann_whitney_p([1, 2], [3, 4]) == 1.0


def test_diff_command_writes_html_and_json(tmp_path):
    html, data = tmp_path / "diff.html", tmp_path / "diff.json"
    result = CliRunner().invoke(
        app, ["diff", str(PAIRS / "healthy"), str(PAIRS / "socket-some-hosts"), "-o", str(html), "--json", str(data)]
    )
    assert result.exit_code == 0, result.output
    assert "1. NCCL inter-node transport: NET/IB/GDRDMA -> NET/Socket on 2 hosts (node03, node04)" in result.output
    page = html.read_text()
    assert "What changed, most explaining first" in page and "<svg" in page and "Content-Security-Policy" in page
    report = json.loads(data.read_text())
    assert report["changes"][0]["what"] == "inter-node transport" and report["steps"]["significant"] is True


def test_analyze_with_a_baseline_adds_the_comparison(tmp_path):
    html, data = tmp_path / "r.html", tmp_path / "r.json"
    args = [
        "analyze",
        str(PAIRS / "port-half-rate"),
        "--baseline",
        str(PAIRS / "healthy"),
        "-o",
        str(html),
        "--json",
        str(data),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Against" in result.output and "port mlx5_1:1 rate" in result.output
    assert "Compared with the good run" in html.read_text()
    assert json.loads(data.read_text())["comparison"]["changes"][0]["change"] == "400 Gb/s -> 200 Gb/s"


def test_log_text_in_a_change_is_escaped(tmp_path):
    run = tmp_path / "bad"
    shutil.copytree(PAIRS / "healthy", run)
    log = run / "node01" / "train.log"
    text = log.read_text().replace(
        "NCCL_SOCKET_IFNAME set by environment to eth0",
        "NCCL_SOCKET_IFNAME set by environment to <img src=x onerror=alert(1)>",
    )
    log.write_text(text)
    html = tmp_path / "d.html"
    result = CliRunner().invoke(app, ["diff", str(PAIRS / "healthy"), str(run), "-o", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def _pace(times: list[float]):
    import polars as pl

    from tracelens.compare.timing import Pace

    return Pace(pl.DataFrame({"step": list(range(len(times))), "time_ms": times}), None, None)


def test_a_slow_stretch_counts_even_when_the_whole_run_is_not_slower():
    from tracelens.compare import Comparison
    from tracelens.compare.timing import compare_pace

    steady = [1000.0 + (i * 37 % 21) for i in range(200)]
    stretch = [800.0 + (i * 37 % 21) for i in range(170)] + [2400.0] * 30  # faster mostly, 30 steps at 2.4x
    change = compare_pace(_pace(steady), _pace(stretch))
    assert change.slow_steps.bad == 30 and change.slow_steps.good == 0
    assert not (change.significant and change.delta_ms > 0) and change.slower
    verdict = Comparison("good", "bad", change, []).verdict
    assert verdict.startswith("15% of the slow run's steps took over 1,515 ms") and "no change in set-up" in verdict


def test_a_faster_run_is_not_called_slower():
    from tracelens.compare import Comparison
    from tracelens.compare.timing import compare_pace

    change = compare_pace(_pace([1000.0 + i % 7 for i in range(100)]), _pace([700.0 + i % 7 for i in range(100)]))
    assert change.significant and not change.slower
    assert Comparison("good", "bad", change, []).verdict.startswith("The slow run's steps were not slower")


@pytest.mark.parametrize("impaired", ["lab-loss", "lab-bandwidth"])
def test_real_lab_pair_ranks_the_retransmissions_first_and_does_not_invent_a_slowdown(impaired, analysis_of):
    # Real runs (fixtures/lab-*): the clean run was itself slowed by the shared machine, so the
    # impaired run is not slower on the whole; the injected loss shows as a rise of TCP retransmissions.
    result = compare(analysis_of("lab-clean"), analysis_of(impaired))
    top = result.changes[0]
    assert (top.area, top.what) == ("packets", "TCP retransmission")
    assert not result.pace.slower
    assert result.verdict.startswith("The slow run's steps were not slower")
