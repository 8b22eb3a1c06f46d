"""The Markdown summary for the ticket: what it says, and that text from the run stays plain text
in a real Markdown renderer (markdown-it-py, CommonMark with tables as GitHub renders them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.helpers import tables_from
from tracelens.analyze import Analysis
from tracelens.derived import RunContext
from tracelens.findings import Evidence, Finding, Severity, Verdict
from tracelens.report.markdown import code_block, inline, render
from tracelens.rules import all_rules

ATTACKS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click me](https://evil.example/steal)",
    "![pixel](http://evil.example/p.png)",
    "<https://evil.example/auto>",
    "see https://evil.example/bare and www.evil.example",
    "```\n# injected heading\n```",
    "`````` closes ``` nothing",
    "&lt;b&gt;entity&lt;/b&gt; &#60;i&#62;",
    "**bold** _em_ ~~gone~~ | a | table |",
    "- list item",
    "# heading",
    "---",
    "1. ordered",
    "<!-- comment --> <details open>",
    "@everyone $x^2$",
]
BAD = "\n".join(ATTACKS)


def _rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").enable("strikethrough").render(markdown)


def _hostile() -> Analysis:
    tables = tables_from(
        inputs=[
            {
                "file": f"node01/{a}",
                "format": "log",
                "host": a,
                "size": 1,
                "lines": 2,
                "parsed": 1,
                "ignored": 0,
                "unrecognized": 1,
                "errors": [],
                "samples": [],
            }
            for a in ATTACKS
        ]
    )
    finding = Finding(
        rule_id="TL410",
        severity=Severity.CRITICAL,
        title=f"Root cause on {ATTACKS[1]} {ATTACKS[2]}",
        summary=BAD,
        fix=f"Run `perfquery -x` on {ATTACKS[0]} and `ibstat {ATTACKS[3]}`",
        evidence=[Evidence(file=f"node01/{a}", line=i, text=a, host="node01") for i, a in enumerate(ATTACKS * 2)],
        hosts=ATTACKS[:4],
        verdict=Verdict(
            cause="link",
            confidence="high",
            headline=ATTACKS[0],
            because=ATTACKS,
            against=ATTACKS,
            not_available=ATTACKS,
            fix=ATTACKS[2],
        ),
    )
    return Analysis(target=Path("run"), context=RunContext(tables), findings=[finding], rules=all_rules())


def test_log_text_renders_as_plain_text_never_as_markup():
    markdown = render(_hostile(), command="tracelens analyze " + ATTACKS[2])
    html = _rendered(markdown)
    tags = set(re.findall(r"<([a-z0-9]+)", html))
    # only the summary's own structure: headings, paragraphs, lists, tables, code
    assert tags <= {
        "h2",
        "h3",
        "p",
        "strong",
        "em",
        "ul",
        "li",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "pre",
        "code",
    }, tags
    assert "<a " not in html and "<img" not in html and "<script" not in html and "<del" not in html
    assert html.count("<h2>") == 1 and html.count("<h3>") == 3  # no heading injected
    assert html.count("<pre>") == 1  # the one evidence block, not closed early
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text
    prose = re.sub(r"<pre>.*?</pre>", "", html, flags=re.S)  # code blocks are never autolinked
    # shown, linking nowhere
    assert "evil.example/steal" in prose and "https://evil" not in prose and "www.evil" not in prose


def test_a_code_block_fence_is_longer_than_any_backtick_run():
    block = code_block(["a ``` b", "`````` c"])
    assert block.startswith("```````text\n") and block.endswith("\n```````")
    html = _rendered(block + "\n\nafter")
    assert html.count("<pre>") == 1 and "<p>after</p>" in html and "`````` c" in html


@pytest.mark.parametrize("text", ATTACKS)
def test_each_attack_is_one_plain_paragraph(text):
    html = _rendered(f"- {inline(text)}")
    assert re.fullmatch(r"<ul>\n<li>[^<]*</li>\n</ul>\n", html), html


def test_the_summary_has_verdict_findings_evidence_inputs_and_version(analysis_of):
    markdown = render(analysis_of("scenario-flaky-link"), command="tracelens analyze run --markdown r.md")
    head = markdown.splitlines()[0]
    assert head.startswith("## tracelens: CRITICAL: Slow steps 70-109") and "a bad link" in head and "node02" in head
    assert "**When:** 2024-12-06 18:31:30 to 18:34:30 UTC, 2.2 min lost" in markdown
    assert "- node01 ↔ node02: RoCE NAKs, PSN gaps and resends 1.86/s in the window (336) vs 0.293/s before" in markdown
    assert "**How to fix:** Check the link on node02" in markdown and "`perfquery -x`" in markdown
    assert "| 1 | critical | TL410 |" in markdown and "### Inputs read" in markdown
    # a top evidence line, verbatim in a code block
    assert "node01/train.log:501  time (ms) | fwd: 284.50 | bwd: 4018.38" in markdown
    assert re.search(
        r"\*tracelens \d+\.\d+\.\d+, run as: tracelens analyze run --markdown r\.md\. Config: none", markdown
    )
