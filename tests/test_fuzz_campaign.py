"""The fuzz campaign's judge (tests/fuzz_campaign.py): what fails a case and what does not, on
outputs written by hand; and that a case is made again the same from its seed and number."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests import fuzz_campaign as campaign

ARGS = argparse.Namespace(max_rss_gb=2.0)
REPORT = {"inputs": [{"file": "a.log", "lines": 3, "parsed": 1, "ignored": 1, "unrecognized": 1, "errors": []}]}


def _outputs(tmp_path: Path, stdout="Read 1 file\n", stderr="", md="# tracelens\n", html="<p>ok</p>", report=REPORT):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stdout").write_text(stdout)
    (out / "stderr").write_text(stderr)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(html)
    (out / "report.json").write_text(report if isinstance(report, str) else json.dumps(report))
    return out


def test_a_clean_case_passes(tmp_path: Path):
    assert campaign.check(0, "", 300 << 20, _outputs(tmp_path), ARGS) == ([], "")


@pytest.mark.parametrize("status, killed, outputs, failure", [
    (3, "", {"stdout": "internal error: ValueError: x"}, "exit3"),
    (4, "", {}, "exit4"),
    (1, "", {"stderr": "Traceback (most recent call last):\n  File ..."}, "traceback"),
    (0, "", {"stderr": "thread '<unnamed>' panicked at src/lib.rs:1"}, "panic"),
    (-9, "cpu_timeout", {}, "cpu_timeout"),
    (-15, "", {}, "signal"),
    (0, "", {"stdout": "WARN \x1b[2J cleared"}, "terminal_escape"),
    (0, "", {"html": "<p><script>TLFUZZ()</script></p>"}, "html"),
    (0, "", {"html": "<div><p>unclosed</div>"}, "html"),
    (0, "", {"md": "see <img src=x onerror=TLFUZZ>\n"}, "markdown"),
    (0, "", {"md": "see \\\\<img src=x onerror=TLFUZZ>\n"}, "markdown"),  # an escaped backslash, then the tag
    (0, "", {"md": "see [x](javascript:TLFUZZ)\n"}, "markdown"),
    (0, "", {"report": '{"inputs": [], "x": NaN}'}, "json"),
    (0, "", {"report": {"inputs": [{**REPORT["inputs"][0], "lines": 4}]}}, "accounting"),
    (0, "", {"report": {"inputs": [{**REPORT["inputs"][0], "errors": ["a.log could not be read: x"]}]}}, "file_lost"),
])  # fmt: skip
def test_what_fails_a_case(tmp_path: Path, status: int, killed: str, outputs: dict, failure: str):
    failures, detail = campaign.check(status, killed, 300 << 20, _outputs(tmp_path, **outputs), ARGS)
    assert failure in failures and detail


def test_escaped_markup_and_markup_in_code_blocks_pass(tmp_path: Path):
    md = (
        "````text\n<script>TLFUZZ()</script> [x](javascript:TLFUZZ)\n````\n\\[TLFUZZ\\]\\(javascript:TLFUZZ\\)\n"
        "- port 1: state Ac\\<img src=x onerror=TLFUZZ\\>tive.\n"  # as report/markdown.py escapes a tag
        "- port 1: state A\\[TLFUZZ\\](javascript:TLFUZZ)ctive.\n"  # escaped brackets open no link
    )
    html = "<pre>&lt;script&gt;TLFUZZ()&lt;/script&gt; [TLFUZZ](javascript:TLFUZZ)</pre>"
    assert campaign.check(2, "", 300 << 20, _outputs(tmp_path, md=md, html=html), ARGS) == ([], "")


def test_a_peak_over_the_limit_fails(tmp_path: Path):
    assert campaign.check(0, "", 3 << 30, _outputs(tmp_path), ARGS)[0] == ["rss"]


def test_a_case_is_made_again_the_same_from_seed_and_number(tmp_path: Path):
    pool = [("a/train.log", b"node01:1:1 [0] NCCL INFO NCCL version 2.21.5\n" * 50), ("b/x.txt", b"PortXmitData:1\n")]
    made = []
    for where in (tmp_path / "one", tmp_path / "two"):
        where.mkdir()
        case = campaign.Case(7, "")
        target = campaign.build(case, 36, pool, 1 << 12, where)
        files = sorted(p for p in where.rglob("*") if p.is_file())
        made.append((case, target.relative_to(where), [(p.relative_to(where), p.read_bytes()) for p in files]))
    assert made[0] == made[1] and made[0][0].mutations


def test_a_case_the_campaign_cannot_make_is_a_harness_error_and_the_campaign_goes_on(tmp_path: Path, monkeypatch):
    def build(case, seed, pool, huge, where):
        if case.number == 1:
            case.kind = "hostile:fifos"
            raise OSError(28, "No space left on device")
        (where / "run").mkdir()
        return where / "run"

    def run_case(case, target, where, args):
        return campaign.Result(case, "code", 0, 0.1, 0.1, 10.0, [], "")

    monkeypatch.setattr(campaign, "build", build)
    monkeypatch.setattr(campaign, "run_case", run_case)
    monkeypatch.setattr(campaign.fuzz, "sources", lambda limit: [("a/train.log", b"x\n")])
    monkeypatch.setattr(campaign.compileall, "compile_dir", lambda *a, **k: True)
    out = tmp_path / "campaign"
    assert campaign.main(["--cases", "3", "--jobs", "1", "--out", str(out)]) == 1
    records = {r["case"]["number"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert sorted(records) == [0, 1, 2]
    assert records[1]["failures"] == ["harness"] and "No space left on device" in records[1]["detail"]
    assert records[1]["case"]["kind"] == "hostile:fifos" and records[1]["status"] is None
    assert records[0]["failures"] == records[2]["failures"] == []
