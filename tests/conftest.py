"""Session-wide fixtures: each committed fixture folder is analysed once per test run and shared.

Plain helpers (paths, tables_from, fire, the row builders) are in tests/helpers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

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
    """Under pytest-xdist (`-n`): the test modules that read shared analyses (analysis_of) run on one
    worker, one work unit, so that each fixture is analysed once in the whole run; every other test
    is a unit of its own, spread over the workers. (A module is judged by its text: the scheduler
    sees test ids only; and xdist's own --dist loadgroup cannot rename test ids under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedAnalysesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "analyses" if _reads_shared_analyses(nodeid.split("::")[0]) else nodeid

    return SharedAnalysesScheduling(config, log)


@functools.cache
def _reads_shared_analyses(module: str) -> bool:
    path = REPO / module
    return path.is_file() and "analysis_of" in path.read_text(encoding="utf-8")
