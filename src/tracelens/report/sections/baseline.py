"""The comparison with a good run, when `analyze --baseline GOOD` asked for one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracelens.derived import RunContext

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 5
TITLE = "Compared with the good run"
TEMPLATE = "sections/baseline.html.j2"


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """The diff of this run against its baseline; None without --baseline."""
    if analysis.comparison is None:
        return None
    from tracelens.report.diff import context as diff_context

    return diff_context(analysis.comparison)
