"""The HTML report, the JSON and the command line, end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from tests.helpers import tables_from
from tracelens.analyze import Analysis
from tracelens.cli import app
from tracelens.derived import RunContext
from tracelens.findings import Evidence, Finding, Severity
from tracelens.report.html import render
from tracelens.rules import all_rules

SCRIPT = "<script>alert(1)</script>"
runner = CliRunner()


def _analysis_with(text: str) -> Analysis:
    tables = tables_from(
        inputs=[
            {
                "file": f"node01/{text}.log",
                "format": "log",
                "host": "node01",
                "size": 10,
                "lines": 2,
                "parsed": 1,
                "ignored": 0,
                "unrecognized": 1,
                "errors": [f"bad {text}"],
                "samples": [{"line": 2, "text": text}],
            }
        ]
    )
    finding = Finding(
        rule_id="TL109",
        severity=Severity.CRITICAL,
        title="NCCL socket connection failures",
        summary=f"first: {text}",
        fix="fix it",
        evidence=[Evidence(file="node01/train.log", line=3, text=text, host="node01")],
        hosts=["node01"],
    )
    return Analysis(target=Path("run42"), context=RunContext(tables), findings=[finding], rules=all_rules())


def test_untrusted_text_is_escaped_everywhere_and_nothing_external_is_loaded():
    html = render(_analysis_with(SCRIPT))
    assert SCRIPT not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # summary, evidence, error, sample
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "<script" not in html.lower()


def test_report_shows_verdict_findings_evidence_and_coverage():
    html = render(_analysis_with("plain"))
    assert "NCCL socket connection failures" in html
    assert "node01/train.log:3" in html
    assert "Input coverage" in html and "1 unrecognised line shown" in html


def _write_log(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_analyze_writes_report_json_and_tables(tmp_path: Path):
    run = tmp_path / "run42"
    _write_log(run / "node01", ["hello from the training script", f"node01:1:1 [0] NCCL INFO {SCRIPT}"])
    report, js, tables = tmp_path / "r.html", tmp_path / "f.json", tmp_path / "tables"
    result = runner.invoke(app, ["analyze", str(run), "-o", str(report), "--json", str(js), "--tables", str(tables)])
    assert result.exit_code in (0, 2), result.output
    assert "Report:" in result.output and str(report) in result.output.replace("\n", "")
    assert SCRIPT not in report.read_text()
    data = json.loads(js.read_text())
    assert [row["file"] for row in data["inputs"]] == ["node01/train.log"]
    assert data["inputs"][0]["lines"] == 2
    inputs = pl.read_parquet(tables / "inputs.parquet")
    assert inputs["file"].to_list() == ["node01/train.log"]
    assert {p.stem for p in tables.glob("*.parquet")} >= {"nccl_events", "nccl_channels", "inputs", "packets", "steps"}


def test_progress_names_the_stages_after_the_files(tmp_path: Path):
    """The progress bar stands full once the files are read; a big run's alignment and capture
    analysis then take a while, and the bar says which is running."""
    from tracelens.analyze import analyze

    run = tmp_path / "run42"
    _write_log(run / "node01", [f"node01:1:1 [0] NCCL INFO {SCRIPT}"])
    _write_log(run / "node02", [f"node02:1:1 [0] NCCL INFO {SCRIPT}"])
    seen: list[tuple[int, int, str]] = []
    analyze(run, jobs=1, progress=lambda done, total, name: seen.append((done, total, name))).close()
    assert [name for *_, name in seen][-2:] == ["aligning the timeline", "running the rules, analysing captures"]
    assert seen[-1][:2] == seen[-2][:2] == (2, 2)
    assert {name for *_, name in seen[:-2]} == {"node01/train.log", "node02/train.log"}


def test_cli_exit_codes(tmp_path: Path):
    missing = runner.invoke(app, ["analyze", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    junk = tmp_path / "junk"
    _write_log(junk, ["nothing to see here"])
    unreadable = runner.invoke(app, ["analyze", str(junk), "-o", str(tmp_path / "j.html")])
    assert unreadable.exit_code == 2 and "Nothing readable" in unreadable.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["analyze", str(tmp_path / "empty"), "-o", str(tmp_path / "e.html")])
    assert empty.exit_code == 2 and "no file found in" in empty.output


def test_cli_rules_catalogue_and_one_rule():
    catalogue = runner.invoke(app, ["rules"])
    assert catalogue.exit_code == 0
    for r in all_rules():
        assert r.id in catalogue.output
    one = runner.invoke(app, ["rules", "tl101"])
    assert one.exit_code == 0
    for heading in ("What it finds", "Why it slows the run", "How to fix"):
        assert heading in one.output
    assert runner.invoke(app, ["rules", "TL999"]).exit_code == 2


def test_every_rule_is_documented_in_the_three_parts():
    for r in all_rules():
        assert list(r.docs) == ["What it finds", "Why it slows the run", "How to fix"], r.id
        assert all(len(text) > 40 for text in r.docs.values()), r.id


def test_nccl_section_shows_each_hosts_network_and_transports(analysis_of):
    from tracelens.report.sections import nccl

    analysis = analysis_of("socket-fallback")
    ctx = nccl.context(analysis.context, analysis)
    hosts = {h["host"]: h for h in ctx["hosts"]}
    assert hosts["node01"]["networks"] == ["IB"] and hosts["node02"]["networks"] == ["Socket"]
    assert hosts["node01"]["versions"] == [{"version": "2.21.5", "build": "+cuda12.4"}]
    assert {(t["transport"], t["net"]) for t in hosts["node02"]["transports"]} >= {("NET", "Socket")}
    assert any(i.startswith("bootstrap eth0 (10.0.0.2)") for i in hosts["node02"]["interfaces"])


def test_help_shows_the_bracketed_names_rich_would_read_as_markup():
    """`[tool.tracelens]` and `tracelens[ray]` in an option's help are text, not rich markup tags to drop."""

    def help_text(command: str) -> str:
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # the words, unwrapped

    for command in ("analyze", "tables"):
        assert "pyproject.toml with [tool.tracelens]:" in help_text(command), command
    assert "Needs tracelens[ray]." in help_text("analyze")


def test_analyze_and_diff_remove_their_working_folders_when_done(tmp_path, monkeypatch):
    """Each analysis's working folder (spilled tables, captures' packets) is removed when the command is
    done, not left to the interpreter's exit (which warns 'Implicitly cleaning up' under -X dev)."""
    import gc
    import tempfile
    import warnings

    from tests.helpers import FIXTURES

    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    healthy, bad = FIXTURES / "scenario-healthy", FIXTURES / "scenario-congestion"
    commands = [
        ["analyze", str(bad), "--baseline", str(healthy), "-o", str(tmp_path / "a.html")],
        ["diff", str(healthy), str(bad), "-o", str(tmp_path / "d.html")],
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for command in commands:
            assert runner.invoke(app, command).exit_code == 0, command
            gc.collect()
            assert not list(work.glob("tracelens-*")), command
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
