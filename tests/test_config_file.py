"""The config file (tracelens.toml, [tool.tracelens] in pyproject.toml, --config): where it is found,
what it changes in the findings and reports, and the one-line error a wrong key gives."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from synth import pcap as synth_pcap
from tests.conftest import FIXTURES
from tracelens.cli import app
from tracelens.config_file import ConfigError, load
from tracelens.derived import RunContext
from tracelens.derived.baseline import Baseline
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
from tracelens.report.markdown import inline
from tracelens.rules import all_rules
from tracelens.tables import RunTables

runner = CliRunner()
ZERO_OFF = "ds-overlap-comm-off"  # fires TL501 only; its config echo has buckets of DeepSpeed's default size


@pytest.fixture
def run(tmp_path):
    """A copy of a small fixture run, so a config file can be put beside it."""
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / ZERO_OFF, folder)
    return folder


def analyse(run, tmp_path, *options: str) -> dict:
    """`tracelens analyze` on `run`: the JSON it writes (the command must succeed)."""
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), "--json", str(out), *options])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()) | {"stdout": result.stdout}


def rule_ids(report: dict) -> set[str]:
    return {f["rule_id"] for f in report["findings"]}


def test_without_a_config_the_defaults_apply_and_the_reports_say_none(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = analyse(run, tmp_path)
    assert rule_ids(report) == {"TL501"} and report["config"] is None
    assert "Config: none (defaults)" in report["stdout"]
    assert "config: <code>none (defaults)</code>" in (tmp_path / "r.html").read_text()


def test_a_threshold_in_tracelens_toml_makes_a_rule_fire_where_it_did_not(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text("[rules.TL502]\nsmall_bucket = 1_000_000_000  # above the run's 500,000,000\n")
    report = analyse(run, tmp_path)
    assert rule_ids(report) == {"TL501", "TL502"}
    assert report["config"] == str(run / "tracelens.toml")
    assert f"Config: {run / 'tracelens.toml'}" in report["stdout"]
    assert f"config: <code>{run / 'tracelens.toml'}</code>" in (tmp_path / "r.html").read_text()


def test_a_severity_in_the_config_changes_the_findings_severity(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text('[severity]\nTL501 = "critical"\n')
    (finding,) = analyse(run, tmp_path)["findings"]
    assert finding["rule_id"] == "TL501" and finding["severity"] == "critical"
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), "--fail-on", "critical"])
    assert result.exit_code == 1  # the configured severity is the one --fail-on sees


def test_host_aliases_name_the_hosts_in_findings_and_every_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "scenario-flaky-link", run)
    (run / "tracelens.toml").write_text('[hosts]\nnode02 = "gpu-b"\n')
    report = analyse(run, tmp_path, "--markdown", str(tmp_path / "r.md"), "--select", "TL2")
    (physical,) = [f for f in report["findings"] if f["rule_id"] == "TL201"]
    assert physical["hosts"] == ["gpu-b"]  # the marginal link is on node02's mlx5_1
    assert {h for f in report["findings"] for h in f["hosts"]} == {"gpu-b", "node01"}
    assert {row["host"] for row in report["inputs"] if row["host"]} == {"gpu-b", "node01"}
    markdown = (tmp_path / "r.md").read_text()
    assert "gpu-b" in markdown and "| node02 " not in markdown
    assert f"Config: {inline(str(run / 'tracelens.toml'))}." in markdown


def test_a_typo_in_a_key_is_a_one_line_usage_error_naming_the_file_and_key(run, tmp_path):
    (run / "tracelens.toml").write_text("[rules.TL502]\nsmall_buckets = 1000\n")
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {run / 'tracelens.toml'}: rules.TL502.small_buckets: "
        "unknown setting (the settings of TL502: small_bucket)"
    ]
    assert "Traceback" not in result.output and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            'selct = ["TL1"]',
            "selct: unknown key (known: select, ignore, tz, severity, rules, steps, baseline, packets, hosts)",
        ),
        (
            "[baseline]\nrse = 2",
            "baseline.rse: unknown setting (the settings of baseline: confidence, rise, level_rise, level_sigmas)",
        ),
        ("[baseline]\nconfidence = 1", "baseline.confidence: 1 is not below 1"),
        ('[packets]\nduplicate_ms = "fast"', "packets.duplicate_ms: 'fast' is not a number like the default 0.5"),
        (
            '[rules.TL605]\ncritical_xids = ["79"]',
            "rules.TL605.critical_xids: ['79'] is not a list of whole numbers of 0 or more, like [48, 74, 79,",
        ),
        ("[rules.TL605]\ncritical_xids = 79", "rules.TL605.critical_xids: 79 is not a list of whole numbers"),
        ('[severity]\nTL999 = "info"', "severity.TL999: unknown rule"),
        ('[severity]\nTL501 = "urgent"', "severity.TL501: 'urgent' is not info, warning or critical"),
        (
            "[rules.TL502]\nsmall_bucket = 0.5",
            "rules.TL502.small_bucket: 0.5 is not a whole number like the default 50000000",
        ),
        (
            '[rules.TL504]\ncomm_bound_share = "high"',
            "rules.TL504.comm_bound_share: 'high' is not a number like the default 0.35",
        ),
        ("[rules.TL999]\nx = 1", "rules.TL999: unknown rule"),
        ("[rules.TL304]\nloss_share = -0.1", "rules.TL304.loss_share: -0.1 is not a finite number of 0 or more"),
        ("[rules.TL304]\nloss_share = nan", "rules.TL304.loss_share: nan is not a finite number of 0 or more"),
        ("[rules.TL304]\nmin_losses = -3", "rules.TL304.min_losses: -3 is not a finite number of 0 or more"),
        ('tz = "Mars/Olympus"', "tz: 'Mars/Olympus' is not a time zone name"),
        ('select = "TL1"', "select: must be a list of rule ids or prefixes"),
        ('ignore = ["TL9"]', "ignore: 'TL9' matches no rule"),
        ("[hosts]\nnode01 = 3", "hosts.node01: 3 is not a host name"),
        ("select = [", "not valid TOML"),
    ],
)
def test_every_wrong_key_or_value_is_named(tmp_path, text, says):
    path = tmp_path / "tracelens.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: {says}")


def test_a_config_head_before_gigabytes_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "tracelens.toml"
    with path.open("wb") as fh:
        fh.write(b'select = ["TL101"]\n')
        fh.truncate(4 << 30)
    with pytest.raises(ConfigError) as err:
        load(path)
    says = "cannot be read (config file of 4,294,967,296 bytes is larger than the 1 MiB read)"
    assert str(err.value) == f"{path}: {says}"


def test_a_whole_number_is_accepted_where_the_default_is_a_fraction(tmp_path):
    (tmp_path / "tracelens.toml").write_text("[rules.TL504]\ncomm_bound_share = 1\n")
    assert load(tmp_path / "tracelens.toml").settings == {"TL504": {"comm_bound_share": 1.0}}


def test_pyproject_tool_table_is_found_in_the_run_folder(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.tracelens]\nignore = ["TL501"]\n')
    report = analyse(run, tmp_path)
    assert rule_ids(report) == set() and report["config"] == str(run / "pyproject.toml")
    assert f"Config: [tool.tracelens] in {run / 'pyproject.toml'}" in report["stdout"]


def test_pyproject_tool_table_is_found_in_the_current_directory(run, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    (here / "pyproject.toml").write_text('[tool.tracelens]\nignore = ["TL5"]\n')
    (run / "pyproject.toml").write_text('[project]\nname = "no tracelens table here"\n')  # skipped: no [tool.tracelens]
    monkeypatch.chdir(here)
    report = analyse(run, tmp_path)
    assert rule_ids(report) == set() and report["config"] == str(here / "pyproject.toml")
    assert not any(r.startswith("TL5") for r in report["rules_checked"])


def test_the_run_folder_comes_before_the_current_directory(run, tmp_path, monkeypatch):
    (tmp_path / "tracelens.toml").write_text('ignore = ["TL501"]\n')
    (run / "tracelens.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    report = analyse(run, tmp_path)
    assert rule_ids(report) == {"TL501"} and report["config"] == str(run / "tracelens.toml")


def test_config_option_wins_over_the_files_found(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text('ignore = ["TL501"]\n')
    chosen = tmp_path / "strict.toml"
    chosen.write_text('[severity]\nTL501 = "info"\n')
    report = analyse(run, tmp_path, "--config", str(chosen))
    assert [(f["rule_id"], f["severity"]) for f in report["findings"]] == [("TL501", "info")]
    assert report["config"] == str(chosen)


def test_a_missing_config_option_file_is_a_usage_error(run, tmp_path):
    result = runner.invoke(
        app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), "--config", str(tmp_path / "nope.toml")]
    )
    assert result.exit_code == 2 and "nope.toml: no such file or folder" in result.stderr


def test_select_on_the_command_line_wins_over_the_configs(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text('select = ["TL2"]\n')
    from_file = analyse(run, tmp_path)
    assert rule_ids(from_file) == set() and all(
        r.startswith("TL2") for r in from_file["rules_checked"] + [n["rule"] for n in from_file["rules_not_run"]]
    )
    assert rule_ids(analyse(run, tmp_path, "--select", "TL5")) == {"TL501"}


def test_tz_on_the_command_line_wins_over_the_configs(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text('tz = "Asia/Tokyo"\n')
    notes = analyse(run, tmp_path)["notes"]
    assert f"Log times were read in Asia/Tokyo (tz in {run / 'tracelens.toml'}) and converted to UTC." in notes
    notes = analyse(run, tmp_path, "--tz", "Europe/Berlin")["notes"]
    assert "Log times were read in Europe/Berlin (--tz) and converted to UTC." in notes
    assert not any("Asia/Tokyo" in n for n in notes)


def test_diff_reads_the_config_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tracelens.toml").write_text("[rules.TL999]\n")
    result = runner.invoke(
        app, ["diff", str(FIXTURES / ZERO_OFF), str(FIXTURES / ZERO_OFF), "-o", str(tmp_path / "d.html")]
    )
    assert result.exit_code == 2 and "tracelens.toml: rules.TL999: unknown rule" in result.stderr


def test_steps_table_sets_what_makes_a_step_slow_for_every_rule(tmp_path, monkeypatch, analysis_of):
    """ds-slow-window: steps 120-159 take 3x the usual time. Read as slow only from 10x (as a spike
    and as a sustained stretch), nothing is slow; from 2.5x, the same findings as by default."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "ds-slow-window", run)
    default = {f.rule_id for f in analysis_of("ds-slow-window").findings}
    assert {"TL401", "TL402", "TL410"} <= default
    (run / "tracelens.toml").write_text("[steps]\nslow_ratio = 10\nsustained_ratio = 10\n")
    assert rule_ids(analyse(run, tmp_path)) == default - {"TL401", "TL402", "TL410"}
    (run / "tracelens.toml").write_text("[steps]\nslow_ratio = 2.5\nsustained_ratio = 2.5\n")  # 3x is still slow
    assert rule_ids(analyse(run, tmp_path)) == default
    (run / "tracelens.toml").write_text("[steps]\nslow_sigma = 3\n")
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {run / 'tracelens.toml'}: steps.slow_sigma: unknown setting "
        "(the settings of steps: slow_ratio, slow_sigmas, sustained_ratio, sustained_steps, min_cost_share)"
    )


def test_baseline_table_sets_when_a_window_signal_rose_for_every_rule_that_judges_one(tmp_path, monkeypatch):
    """scenario-flaky-link: the NAKs and retransmissions of node02's mlx5_1 rise in the slow window
    (TL410 names the link) and the all-reduce time surges (TL402). Asked for a rise of 1000x, no count
    rose: the cause is undetermined (rank 0 alone of 8 prints timers, so waiting for a rank nobody times
    and slower collectives read alike); asked for a level 1000x its usual, the surge is no surge."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "scenario-flaky-link", run)

    def window_findings() -> dict[str, list[dict]]:
        report = analyse(run, tmp_path, "--select", "TL402,TL410")
        return {r: [f for f in report["findings"] if f["rule_id"] == r] for r in ("TL402", "TL410")}

    default = window_findings()
    (verdict,) = default["TL410"]
    assert verdict["verdict"]["cause"] == "link" and verdict["severity"] == "critical" and default["TL402"]
    (run / "tracelens.toml").write_text("[baseline]\nrise = 1000\n")
    (verdict,) = window_findings()["TL410"]
    assert verdict["verdict"]["cause"] is None and "7 other ranks of the job log no step timers" in verdict["title"]
    assert "bad link" not in verdict["title"] and not verdict["ports"]
    (run / "tracelens.toml").write_text("[baseline]\nlevel_rise = 1000\n")
    assert window_findings()["TL402"] == []


def test_packets_table_sets_the_duplicate_window_of_the_capture_analysis(tmp_path):
    """A mirrored capture (every frame twice, microseconds apart): TL305 by default; with a duplicate
    window of 0 ms no frame is a duplicate, and TL305 has nothing to say."""
    frames = synth_pcap.tcp_stream(mirrored=True)
    path = synth_pcap.write(tmp_path / "capture.pcap", frames)
    tables = RunTables()
    tables.add("packets", pcap.ingest(InputFile(path, path.name, "pcap")).tables["packets"])
    (tmp_path / "tracelens.toml").write_text("[packets]\nduplicate_ms = 0\n")
    config = load(tmp_path / "tracelens.toml")
    assert config.shared.packets.duplicate_ms == 0.0 and config.shared.baseline == Baseline()
    (tl305,) = [r for r in all_rules() if r.id == "TL305"]
    assert tl305.run(RunContext(tables))[0].summary.startswith("capture.pcap: 201 of 604 frames are capture duplicates")
    assert tl305.run(RunContext(tables, config.shared)) == []


def test_rules_command_shows_the_shared_tables_a_rule_reads():
    def shown(rule_id: str) -> list[str]:
        return runner.invoke(app, ["rules", rule_id], env={"COLUMNS": "400"}).stdout.splitlines()

    tl410 = shown("TL410")
    assert (
        "Baseline test (in a tracelens.toml: [baseline], "
        "for every rule that judges a slow window against the rest of the run)" in tl410
    )
    assert any(line.startswith("- rise = 1.5 (times the rate outside the window): ") for line in tl410)
    assert any(line.startswith("- min_cost_share = 0.01 (share of the run's step time): ") for line in tl410)
    tl305 = shown("TL305")
    assert any(line.startswith("- duplicate_ms = 0.5 (milliseconds): ") for line in tl305)
    assert not any("[baseline]" in line or "[steps]" in line for line in tl305)
    assert any(line.startswith("- critical_xids = [48, 74, 79, ") for line in shown("TL605"))


def test_a_config_in_the_run_folder_is_listed_as_the_config_not_read_as_an_input(run, tmp_path, monkeypatch):
    """discover lists tracelens.toml (and a pyproject.toml with a [tool.tracelens] table) at the top of
    the run folder as format "config": no lines read, parsed, ignored or unrecognised, no error. A
    pyproject.toml without the table is not a config, and a tracelens.toml deeper in is not the run's."""
    monkeypatch.chdir(tmp_path)
    (run / "tracelens.toml").write_text('[severity]\nTL501 = "info"\n')
    (run / "sub").mkdir()
    (run / "sub" / "tracelens.toml").write_text("[hosts]\n")
    report = analyse(run, tmp_path)
    rows = {r["file"]: r for r in report["inputs"]}
    assert rows["tracelens.toml"]["format"] == "config" and rows["sub/tracelens.toml"]["format"] == "log"
    counts = ("lines", "parsed", "ignored", "unrecognized")
    assert [rows["tracelens.toml"][k] for k in counts] == [0, 0, 0, 0] and rows["tracelens.toml"]["errors"] == []
    assert report["config"] == str(run / "tracelens.toml") and report["findings"][0]["severity"] == "info"
    (run / "tracelens.toml").unlink()
    (run / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.tracelens.severity]\nTL501 = "info"\n')
    assert {r["file"]: r["format"] for r in analyse(run, tmp_path)["inputs"]}["pyproject.toml"] == "config"
    (run / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert {r["file"]: r["format"] for r in analyse(run, tmp_path)["inputs"]}["pyproject.toml"] == "log"


def test_diff_names_the_config_in_its_html_markdown_and_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tracelens.toml").write_text('[severity]\nTL501 = "info"\n')
    out = {"html": tmp_path / "d.html", "md": tmp_path / "d.md", "json": tmp_path / "d.json"}
    result = runner.invoke(
        app,
        ["diff", str(FIXTURES / ZERO_OFF), str(FIXTURES / ZERO_OFF), "-o", str(out["html"]), "--json", str(out["json"]),
         "--markdown", str(out["md"])],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    used = tmp_path / "tracelens.toml"
    assert f"Config: {used}" in result.output
    assert json.loads(out["json"].read_text())["config"] == str(used)
    assert f"config: <code>{used}</code>" in out["html"].read_text()
    markdown = out["md"].read_text()
    assert markdown.startswith("## tracelens diff: ") and f"Config: {inline(str(used))}." in markdown
    assert "No significant difference" in markdown or "no difference" in markdown.lower()
    used.unlink()
    runner.invoke(app, ["diff", str(FIXTURES / ZERO_OFF), str(FIXTURES / ZERO_OFF), "-o", str(out["html"]),
                        "--json", str(out["json"])])  # fmt: skip
    assert json.loads(out["json"].read_text())["config"] is None
    assert "config: <code>none (defaults)</code>" in out["html"].read_text()
