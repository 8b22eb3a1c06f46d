"""The report's host section (GPUs, interfaces and MTUs, kernel events, benchmarks against the
line rate) and the GPU-utilisation lane of the timeline."""

from __future__ import annotations

from jinja2 import Environment, FileSystemLoader, select_autoescape

from tests.helpers import NO_FINDINGS, corpus_dir, tables_from
from tests.helpers.host import gpu, iface, kev, nccl_row, perf, port, rates
from tracelens.analyze import analyze
from tracelens.derived import RunContext
from tracelens.report.html import TEMPLATES
from tracelens.report.sections import host, timeline
from tracelens.tables import RunTables


def render(ctx) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    return env.get_template(host.TEMPLATE).render(ctx=ctx)


def test_host_section_tables():
    t = tables_from(
        interfaces=[iface("node01", "ens1f0", 9000, "10.0.0.1/24"), iface("node02", "ens1f0", 1500, "10.0.0.2/24")],
        ib_ports=[port("node01", 1024)] + rates(),
        kernel_events=[
            kev(
                "node02",
                "xid",
                10,
                xid=79,
                detail="Xid 79: GPU has fallen off the bus",
                message="NVRM: Xid <script>x</script>",
            )
        ],
        nccl_tests=nccl_row(41.3),
        perftest=perf(11000.0),
        gpu_samples=gpu("node01", 35.0),
    )
    ctx = host.context(RunContext(t), NO_FINDINGS)
    mtus = {(i["host"], i["name"]): (i["mtu"], i["odd"]) for i in ctx["interfaces"]}
    assert mtus[("node01", "ens1f0")] == (9000, False) and mtus[("node02", "ens1f0")] == (1500, True)
    assert mtus[("node01", "mlx5_0:1")] == ("1024 of 4096", True)
    (event,) = ctx["events"]
    assert (event["host"], event["what"], event["detail"]) == (
        "node02",
        "GPU Xid error",
        "Xid 79: GPU has fallen off the bus",
    )
    nccl, ib = ctx["benchmarks"]
    assert (nccl["result"], nccl["line"], nccl["share"]) == ("busbw 41.3 GB/s (out-of-place)", "200 GB/s", "21%")
    assert (ib["result"], ib["line"], ib["share"]) == ("88.0 Gb/s", "200 Gb/s", "44%")
    assert ctx["gpus"][0]["host"] == "node01" and ctx["gpus"][0]["gpus"] == 2
    html = render(ctx)
    assert "<script>" not in html and "&lt;script&gt;" in html and "Benchmarks against the line rate" in html


def test_no_host_evidence_no_section():
    assert host.context(RunContext(RunTables()), NO_FINDINGS) is None


def test_the_timeline_draws_a_gpu_lane_for_the_scenario(analysis_of):
    analysis = analysis_of("scenario-gpu-idle-bad-link")
    svg = timeline.context(analysis.context, analysis)["chart"]
    assert "GPU util. %" in svg
    ctx = host.context(analysis.context, analysis)
    assert {e["what"] for e in ctx["events"]} >= {"link down", "NIC transmit timeout"}


def test_benchmark_line_of_a_real_run_names_its_column_and_average(tmp_path):
    """superbench's alltoall_perf: 224.31 GB/s out-of-place and 226.16 in-place at 8 GiB, `# Avg bus
    bandwidth : 58.6481`."""
    (path,) = corpus_dir("host/nccltests").glob("superbench_alltoall*")
    run = tmp_path / "run"
    run.mkdir()
    (run / path.name).write_bytes(path.read_bytes())
    analysis = analyze(run)
    (bench,) = host.context(RunContext(analysis.tables), NO_FINDINGS)["benchmarks"]
    assert bench["result"] == "busbw 224.31 GB/s (out-of-place); Avg bus bandwidth 58.6481 GB/s"
