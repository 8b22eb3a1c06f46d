"""The report of a large run: 512 RoCE hosts (one GPU each), written by the project's generator
(synth/), with a flaky link on `--flaky` of them (symbol errors, receive errors, out-of-sequence
NAKs in the counter dumps every minute) and a slow window: many findings, thousands of evidence
lines, a timeline with hundreds of hosts.

Measured: generating the run, analyze, render (HTML size), the Markdown, and opening the HTML in
headless Chromium (navigation to the load event, then to the first paint being done), with a
screenshot of the first screen kept next to the HTML in --out (default: `tracelens-large` in the
temporary folder).

    python benchmarks/bench_large_report.py [--hosts 512] [--flaky 40] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the generator lives at the repository root (synth/)

from synth.deepspeed import DeepSpeedTraining  # noqa: E402
from synth.fabric import FabricPort  # noqa: E402
from synth.incidents import BIG  # noqa: E402
from synth.nccl import Host  # noqa: E402
from synth.runs import CounterDumps, Scenario, write  # noqa: E402

FLAKY = {"SymbolErrorCounter": 45.0, "LinkErrorRecoveryCounter": 0.03, "PortRcvErrors": 8.0, "out_of_sequence": 8.0}


def large_scenario(hosts: int, flaky: int) -> Scenario:
    """`hosts` one-GPU RoCE hosts; every (hosts // flaky)-th one has a flaky mlx5_1 during the slow steps."""
    names = [f"node{i:03d}" for i in range(1, hosts + 1)]
    every = max(hosts // max(flaky, 1), 1)
    bad = set(names[::every][:flaky])
    ports = tuple(
        (name, tuple(FabricPort(ca, lid=0, link_layer="Ethernet",
                                per_second=FLAKY if name in bad and ca == "mlx5_1" else {})
                     for ca in ("mlx5_0", "mlx5_1")))
        for name in names
    )  # fmt: skip
    return Scenario(
        name=f"large-{hosts}-hosts",
        description=f"{hosts} RoCE hosts, flaky mlx5_1 links on {len(bad)} of them during steps 70-109.",
        rules=(),
        hosts=tuple(
            Host(name, f"10.{i // 65536}.{i // 256 % 256}.{i % 256 + 1}", gpus=1, link_layer="RoCE")
            for i, name in enumerate(names)
        ),
        story=(
            DeepSpeedTraining(steps=160, phases=BIG, slow=(70, 109, 3.8)),
            CounterDumps(ports, every_s=60.0, during="slow", tool="sysfs"),
        ),
    )


def open_in_chromium(html: Path, shot: Path) -> dict:
    """Seconds from navigation to load and to the first screen drawn, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        start = time.perf_counter()
        page.goto(html.as_uri(), wait_until="load")
        loaded = time.perf_counter() - start
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        painted = time.perf_counter() - start
        page.screenshot(path=str(shot))
        browser.close()
    return {"load_s": loaded, "painted_s": painted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--flaky", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tracelens-large")
    args = parser.parse_args()

    from tracelens.analyze import analyze
    from tracelens.report.html import render
    from tracelens.report.markdown import render as markdown

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = write(large_scenario(args.hosts, args.flaky), args.out)
    t1 = time.perf_counter()
    analysis = analyze(folder)
    t2 = time.perf_counter()
    html = render(analysis)
    t3 = time.perf_counter()
    md = markdown(analysis)
    t4 = time.perf_counter()
    page = args.out / f"{folder.name}.html"
    page.write_text(html, encoding="utf-8")
    (args.out / f"{folder.name}.md").write_text(md, encoding="utf-8")
    browser = open_in_chromium(page, args.out / f"{folder.name}.png") if shutil.which("chromium") else {}
    result = {
        "hosts": args.hosts, "flaky": args.flaky,
        "input_mb": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6,
        "files": analysis.tables["inputs"].height, "findings": len(analysis.findings),
        "evidence_lines": sum(f.evidence_total for f in analysis.findings),
        "generate_s": t1 - t0, "analyze_s": t2 - t1, "render_s": t3 - t2, "markdown_s": t4 - t3,
        "html_mb": len(html.encode()) / 1e6, "markdown_kb": len(md.encode()) / 1e3, **browser,
    }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
