"""The package's structure: what it imports from outside (declared in pyproject.toml, nothing
undeclared, nothing declared for nothing) and what the wheel holds."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. tracelens.ingest.pcap
    target: str  # the imported module, absolute, e.g. tracelens.tables or polars
    lazy: bool  # inside a function: runs only when that function is called


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[Import]:
    """Every import statement of one source file, resolved to absolute module names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lazy_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [node.module])])
            # `from tracelens import scaleout` imports the submodule tracelens.scaleout
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        found.extend(Import(name, t, id(node) in lazy_nodes) for t in targets)
    return found


SOURCES = sorted(SRC.rglob("*.py"))
IMPORTS = [i for path in SOURCES for i in _imports(path)]


def _third_party(imports: list[Import]) -> dict[str, bool]:
    """Top-level third-party module -> whether every import of it is lazy."""
    out: dict[str, bool] = {}
    for i in imports:
        top = i.target.split(".")[0]
        if top and top != "tracelens" and top not in sys.stdlib_module_names and top != "__future__":
            out[top] = out.get(top, True) and i.lazy
    return out


def _dist(requirement: str) -> str:
    return _normal(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(module: str) -> str:
    """The distribution that provides a top-level module (its own name when it is not installed)."""
    return _normal(packages_distributions().get(module, [module])[0])


RUNTIME = {_dist(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {extra: {_dist(r) for r in reqs} for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()}


def test_every_third_party_import_is_declared():
    """An import at module level needs a runtime dependency; one inside a function (an optional
    feature such as --ray) may come from an extra instead."""
    undeclared = []
    for module, lazy in _third_party(IMPORTS).items():
        dist = _distribution(module)
        optional = set().union(*(reqs for extra, reqs in EXTRAS.items() if extra != "test"))
        if dist not in RUNTIME and not (lazy and dist in optional):
            undeclared.append(f"{module} ({dist})")
    assert not undeclared, f"imported by src/tracelens but not declared in pyproject.toml: {undeclared}"


def test_every_runtime_dependency_is_imported_by_the_package():
    """A runtime dependency the package never imports belongs in an extra (scapy: only the fixture
    generator and the tests use it)."""
    used = {_distribution(m) for m in _third_party(IMPORTS)}
    assert RUNTIME - used == set(), "declared runtime dependencies that src/tracelens never imports"


def test_the_wheel_holds_the_package_and_its_data_only():
    """The fixture generator (synth/) and the tests stay out of the wheel, and the package never
    imports them (an installed tracelens has neither)."""
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["src/tracelens"]
    assert set(wheel["force-include"]) == {"grammars", "reports"}
    outside = sorted({f"{i.module} -> {i.target}" for i in IMPORTS if i.target.split(".")[0] in ("synth", "tests", "benchmarks")})
    assert not outside
    assert not (SRC / "synth").exists() and not (SRC / "tracelens" / "synth").exists()
