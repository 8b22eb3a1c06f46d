"""Session-wide fixtures: each committed fixture folder is analysed once per test run and shared.

Plain helpers (paths, tables_from, fire, the row builders) are in tests/helpers.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Callable
from pathlib import Path

# Under pytest-xdist every core runs a worker: a polars thread pool per worker as wide as the machine
# only makes the workers' threads take turns.
# Set before polars is first imported; a POLARS_MAX_THREADS of the caller's own wins.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    # Each worker on a core of its own: polars runs every operation on its pool thread while the calling
    # thread waits, and on a virtual machine waking a thread on the other core costs more than a small
    # operation itself. Its subprocesses inherit the core.
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw") or 0)
        os.sched_setaffinity(0, {cores[worker % len(cores)]})

import pytest  # noqa: E402

# Re-exported while test modules written before tests/helpers existed still import them from here.
from tests.helpers import (  # noqa: F401
    CORPUS,
    FIXTURES,
    NO_FINDINGS,
    REPO,
    SCENARIOS,
    corpus_dir,
    fire,
    tables_from,
)
from tracelens.analyze import Analysis, analyze


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--snapshot-update",
        action="store_true",
        help="Rewrite tests/snapshots/ from the fixture runs' findings instead of checking them (test_snapshots.py).",
    )


@pytest.fixture(scope="session")
def analysis_of() -> Callable[[Path | str], Analysis]:
    """`analysis_of(folder)`: the analysis of a committed fixture folder (a path, or a name under
    fixtures/), computed on first use and shared by every test of the session. Tests read it and
    never change it; a test that needs other options or a modified copy calls `analyze` itself."""
    done: dict[Path, Analysis] = {}

    def analysis(folder: Path | str) -> Analysis:
        path = (FIXTURES / folder).resolve()
        if path not in done:
            done[path] = analyze(path)
        return done[path]

    return analysis


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under pytest-xdist (`-n`): the tests that read shared analyses (through analysis_of or a fixture
    of their module that does) run on one worker, one work unit, so that each fixture is analysed
    once in the whole run; the tests of a module that read one of its module-scoped fixtures (a
    browser, a Ray instance, a generated capture) are one unit too, so that it is made once, not
    once per worker; every other test is a unit of its own, spread over the workers. (The
    scheduler sees test ids only, so a test's fixtures are read from its module's source; xdist's
    own --dist loadgroup cannot rename test ids under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixturesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module, _, name = nodeid.partition("::")
            return _shared_unit(module).get(name.split("[")[0], nodeid)

    return SharedFixturesScheduling(config, log)


@functools.cache
def _shared_unit(module: str) -> dict[str, str]:
    """The test functions of a module that share a fixture with other tests, with their unit: "analyses"
    for those that request analysis_of (directly or through fixtures of their module), else
    "MODULE::shared" for those that request one of the module's module-scoped fixtures."""
    path = REPO / module
    if not path.is_file():
        return {}
    functions = [n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)]
    module_scoped = {
        f.name
        for f in functions
        for d in f.decorator_list
        if "fixture" in ast.unparse(d) and "module" in ast.unparse(d)
    }
    tests = [f for f in functions if f.name.startswith("test_")]
    units: dict[str, str] = {}
    for unit, roots in (("analyses", {"analysis_of"}), (f"{module}::shared", module_scoped)):
        reading = set(roots)
        for _ in range(3):  # fixtures of fixtures
            reading |= {f.name for f in functions if reading & {a.arg for a in f.args.args}}
        for test in tests:
            if reading & {a.arg for a in test.args.args}:
                units.setdefault(test.name, unit)
    return units
