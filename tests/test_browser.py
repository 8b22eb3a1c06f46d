"""The HTML reports in a real browser: headless Chromium, driven by Playwright's Python package
pointed at the system's /usr/bin/chromium (Playwright's own browser download is not used).

Checked for every scenario report: no console error (a Content-Security-Policy violation is
one), no network request beyond the file itself, the verdict on the first screen at 1366x768
and on a 390 px wide phone, and a print layout (the PDF is written) whose tables fit the page.
Screenshots and PDFs are kept as artefacts outside the repository, in $TRACELENS_ARTEFACTS
(default: tracelens-artefacts in the system's temporary folder), for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import SCENARIOS
from tracelens.report.html import render

playwright = pytest.importorskip("playwright.sync_api", reason="playwright (a test dependency) is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH: `apt-get install -y chromium` (.ci/run installs it)", allow_module_level=True)

ARTEFACTS = Path(os.environ.get("TRACELENS_ARTEFACTS", Path(tempfile.gettempdir()) / "tracelens-artefacts"))
FLAGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-sandbox",
]
SCREENS = {"desktop": {"width": 1366, "height": 768}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with playwright.sync_playwright() as p:
        # launch_persistent_context gives the fresh --user-data-dir the brief asks for; headless by default
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport=SCREENS["desktop"],
            offline=True,
        )
        yield context
        context.close()


class Visit:
    """A page opened on a report, with every console error and request it made."""

    def __init__(self, context, path: Path, screen: str) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = context.new_page()
        self.page.set_viewport_size(SCREENS[screen])
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri(), wait_until="load")
        self.url = path.as_uri()

    def close(self) -> None:
        self.page.close()


def _report(analysis_of, name: str, folder: Path) -> Path:
    path = folder / f"{name}.html"
    path.write_text(render(analysis_of(name)), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_report_in_chromium(browser, name, tmp_path, analysis_of):
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    report = _report(analysis_of, name, tmp_path)
    for screen in SCREENS:
        visit = Visit(browser, report, screen)
        try:
            assert visit.errors == [], visit.errors
            assert visit.requests == [visit.url], visit.requests  # the file itself, nothing else
            box = visit.page.locator("#verdict h2").bounding_box()
            height = SCREENS[screen]["height"]
            assert box and box["y"] >= 0 and box["y"] + box["height"] <= height, (screen, box)
            assert visit.page.locator("#verdict h2").is_visible()
            # nothing wider than a phone's screen but what scrolls on purpose (the evidence and tables)
            # a date or a time in the findings' windows is one line, never '03:' over '13:15'
            broken = visit.page.evaluate("""() => {
                const out = [];
                for (const td of document.querySelectorAll('.windows tbody td:is(:nth-child(5), :nth-child(6))')) {
                    const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
                    for (let node; (node = walk.nextNode());) {
                        for (const m of node.textContent.matchAll(/\\d\\d:\\d\\d:\\d\\d/g)) {
                            const range = document.createRange();
                            range.setStart(node, m.index);
                            range.setEnd(node, m.index + m[0].length);
                            if (range.getClientRects().length > 1) out.push(m[0]);
                        }
                    }
                }
                return out;
            }""")
            assert broken == [], f"{screen}: times broken over lines: {broken[:3]}"
            overflow = visit.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{screen}: the page is {overflow}px wider than the screen"
            visit.page.screenshot(path=str(ARTEFACTS / f"{name}-{screen}.png"))
        finally:
            visit.close()


@pytest.mark.parametrize("name", ["scenario-flaky-link", "scenario-hang"])
def test_print_layout_keeps_tables_whole(browser, name, tmp_path, analysis_of):
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    visit = Visit(browser, _report(analysis_of, name, tmp_path), "desktop")
    try:
        visit.page.emulate_media(media="print")
        visit.page.set_viewport_size({"width": 718, "height": 1000})  # A4 at 96 dpi less 1.5 cm margins
        cut = visit.page.evaluate("""() => [...document.querySelectorAll('table')]
            .filter(t => t.getBoundingClientRect().width > document.documentElement.clientWidth + 1)
            .map(t => t.closest('section')?.id + ': ' + Math.round(t.getBoundingClientRect().width))""")
        assert cut == [], f"tables wider than the printed page: {cut}"
        spilled = visit.page.evaluate("""() => [...document.querySelectorAll('td')]
            .filter(td => td.offsetParent && td.scrollWidth > td.clientWidth + 1)
            .map(td => td.textContent.slice(0, 60))""")
        assert spilled == [], f"cells whose text runs out of them on paper: {spilled[:5]}"
        rows = visit.page.evaluate("getComputedStyle(document.querySelector('tr')).breakInside")
        assert rows == "avoid"  # a row is never split over two pages
        pdf = visit.page.pdf(path=str(ARTEFACTS / f"{name}.pdf"), format="A4", print_background=True)
        assert pdf.startswith(b"%PDF") and len(pdf) > 10_000
    finally:
        visit.close()
