"""The report's packet section: omitted without captures; QPs and flows worst first; a timeline chart."""

from __future__ import annotations

import jinja2
import polars as pl

from synth import pcap as synth
from tests.helpers import NO_FINDINGS
from tracelens.derived import RunContext
from tracelens.ingest import InputFile
from tracelens.ingest.packets import pcap
from tracelens.report.html import TEMPLATES
from tracelens.report.sections import packets as section
from tracelens.tables import RunTables


def render(t: RunTables) -> str | None:
    ctx = section.context(RunContext(t), NO_FINDINGS)
    if ctx is None:
        return None
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    return env.get_template(section.TEMPLATE).render(ctx=ctx)


def test_no_capture_no_section():
    assert render(RunTables()) is None


def test_section_lists_the_lossy_qp_first_with_a_timeline(tmp_path):
    frames = synth.roce_conversation(
        synth.RoceQp(responder_qp=0x99, first_psn=5), messages=50
    ) + synth.roce_conversation(faults=synth.RoceFaults(lost=(20,)), messages=50)
    path = synth.write(tmp_path / "c.pcap", sorted(frames, key=lambda f: f.time))
    t = RunTables()
    t.add("packets", pcap.ingest(InputFile(path, "c<1>.pcap", "pcap")).tables["packets"])
    t.add("nccl_net", pl.DataFrame([{"what": "oob_if", "address": "10.0.0.1", "host": "node<01>"}]))
    html = render(t)
    rows = html.split("<h3>RoCE queue pairs, worst first</h3>")[1].split("<tr>")[2:]
    assert "0x000048" in rows[0] and "0x000099" in rows[1]
    assert "node&lt;01&gt; (10.0.0.1)" in html and "<code>c&lt;1&gt;.pcap</code>" in html  # escaped
    assert "<svg" in html
