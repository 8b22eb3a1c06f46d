"""Session-wide fixtures: each committed fixture folder is analysed once per test run and shared.

Plain helpers (paths, tables_from, fire, the row builders) are in tests/helpers.
"""

from __future__ import annotations

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
