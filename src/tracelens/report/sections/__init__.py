"""Report sections beyond the core (verdict, findings, input coverage).

A module in this package defines ORDER (position), TITLE, TEMPLATE (a Jinja2
fragment under report/templates/) and `context(ctx, analysis) -> dict | None`: it reads
tables and derived results from the RunContext `ctx` (computed once, shared with
the rules) and findings from `analysis`; returning None leaves the section out
(no data of that kind in the run). Modules are
found automatically, so a new input format brings its section as one module.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracelens.analyze import Analysis


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    template: str
    context: dict[str, Any]


def build_sections(analysis: Analysis) -> list[Section]:
    """Every section that has something to show, in ORDER."""
    built = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        data = module.context(analysis.context, analysis)
        if data is not None:
            built.append((module.ORDER, Section(info.name, module.TITLE, module.TEMPLATE, data)))
    return [section for _, section in sorted(built, key=lambda pair: pair[0])]
