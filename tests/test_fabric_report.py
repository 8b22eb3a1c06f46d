"""The report's fabric section: ports worst first, moved counters only, a chart, escaped text."""

from __future__ import annotations

from tests.helpers import NO_FINDINGS
from tests.helpers.fabric import ingest_folder, two_nodes
from tracelens.derived import RunContext
from tracelens.report.html import environment
from tracelens.report.sections import fabric
from tracelens.tables import RunTables


def test_fabric_section_lists_the_failing_port_first_with_a_chart(tmp_path):
    folder = two_nodes(tmp_path, {("node02", "mlx5_1"): {"SymbolErrorCounter": 0.05}})
    ctx = fabric.context(RunContext(ingest_folder(folder)), NO_FINDINGS)
    first = ctx["ports"][0]
    assert first["label"] == "node02 mlx5_1 port 1 (Lid 21)"
    assert (first["state"], first["rate"]) == ("Active / LinkUp", "400 Gb/s")
    assert first["counters"][0] == {"kind": "physical errors", "counter": "SymbolErrorCounter", "change": "+90 (180/h)"}
    assert all(c["counter"] != "SymbolErrorCounter" for p in ctx["ports"][1:] for c in p["counters"])
    assert len(ctx["ports"]) == 4 and ctx["untied"] is False
    assert str(ctx["chart"]).startswith("<svg")


def test_no_fabric_dumps_no_section():
    assert fabric.context(RunContext(RunTables()), NO_FINDINGS) is None


def test_section_escapes_names_from_the_dumps(tmp_path):
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "eth.txt").write_text("NIC statistics:\n     rx_prio0_pause: 3\n     <script>x</script>: 4\n")
    ctx = fabric.context(RunContext(ingest_folder(tmp_path)), NO_FINDINGS)
    html = environment().get_template(fabric.TEMPLATE).render(ctx=ctx)
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html and "rx_prio0_pause" in html
