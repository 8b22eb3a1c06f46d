"""Locate the grammars (grammars/) for both install modes.

A wheel (`pip install .`) carries them inside the package; an editable install
or a plain checkout finds them at the repository root, where they are edited.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """Return the data folder `name` ("grammars"), wherever it was installed."""
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tracelens data folder {name!r} not found next to {_PACKAGE_DIR}")


def grammar_text(name: str) -> str:
    """The text of grammars/<name>.lark."""
    return (data_dir("grammars") / f"{name}.lark").read_text(encoding="utf-8")
