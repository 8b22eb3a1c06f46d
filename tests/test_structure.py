"""The package's structure: its stages import one way (tables -> ingest -> timeline -> derived ->
rules -> pipeline -> report -> cli) without cycles and keep no module-level result caches; what it
imports from outside is declared in pyproject.toml (nothing undeclared, nothing declared for
nothing); the wheel holds the package only."""

from __future__ import annotations

import ast
import functools
import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport tracelens declares for it
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. tracelens.ingest.packets.pcap
    target: str  # the imported module, absolute, e.g. tracelens.tables or polars
    lazy: bool  # inside a function: runs only when that function is called
    typing: bool  # under `if TYPE_CHECKING:`: never runs


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_statements(
    node: ast.AST, lazy: bool = False, typing: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Each import statement under `node`, with whether it is inside a function (lazy) and inside
    the body of an `if TYPE_CHECKING:` (typing): one walk of the tree."""
    typing_body = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    for child in ast.iter_child_nodes(node):
        in_typing = typing or (typing_body and any(child is stmt for stmt in node.body))  # type: ignore[attr-defined]
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, lazy, in_typing
        yield from _import_statements(
            child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), in_typing
        )


def _imports(path: Path) -> list[Import]:
    """Every import statement of one source file, resolved to absolute module names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node, lazy, typing in _import_statements(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [node.module])]
                )
            # `from tracelens import scaleout` imports the submodule tracelens.scaleout
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        found.extend(Import(name, t, lazy, typing) for t in targets)
    return found


SOURCES = sorted(SRC.rglob("*.py"))
MODULES = {_module_name(p) for p in SOURCES}


@functools.cache
def all_imports() -> list[Import]:
    """Every import of the package (parsed on first use: under xdist, by the worker that runs these tests
    alone, not by every worker's collection)."""
    return [i for path in SOURCES for i in _imports(path)]


# The stages, in the order data flows through them: a module may import its own stage and earlier
# ones, never a later one. The first stage holds helpers every stage may use. The tables come before
# ingest: tables.py is the contract ingest writes to (each reader conforms its rows to the table's
# schema, and spills them in that form), while the pipeline puts ingest's rows into RunTables.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    (
        "helpers",
        (
            "tracelens",
            "tracelens.resources",
            "tracelens.private_cache",
            "tracelens.prose",
            "tracelens.stats",
            "tracelens.small_read",
        ),
    ),
    ("tables", ("tracelens.tables",)),
    ("ingest", ("tracelens.discover", "tracelens.ingest", "tracelens.capture_decoder")),
    ("timeline", ("tracelens.timeline", "tracelens.inferred")),
    ("derived", ("tracelens.derived",)),
    ("rules", ("tracelens.findings", "tracelens.rules")),
    ("pipeline", ("tracelens.analyze", "tracelens.config_file", "tracelens.scaleout", "tracelens.compare")),
    ("report", ("tracelens.report",)),
    ("cli", ("tracelens.cli", "tracelens.__main__")),
]


def _stage(module: str) -> int:
    """The index in STAGES of the stage `module` belongs to (its longest listed prefix)."""
    matches = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(STAGES)
        for prefix in prefixes
        if module == prefix or prefix != "tracelens" and module.startswith(prefix + ".")
    ]
    assert matches, f"{module} belongs to no stage: add it to STAGES"
    return max(matches)[1]


def _internal(imports: list[Import]) -> list[Import]:
    """The imports of tracelens modules, with the packages Python runs on the way (importing
    tracelens.derived.flows runs tracelens/derived/__init__.py first), except the importer's own."""
    out = []
    for i in imports:
        if i.target not in MODULES:
            continue
        parts = i.target.split(".")
        parents = [".".join(parts[:n]) for n in range(2, len(parts))]
        out.extend(
            Import(i.module, t, i.lazy, i.typing)
            for t in [*parents, i.target]
            if t != i.module and not i.module.startswith(t + ".")
        )
    return out


def test_every_module_belongs_to_a_stage_and_imports_no_later_stage():
    later = sorted(
        f"{i.module} ({STAGES[_stage(i.module)][0]}) imports {i.target} ({STAGES[_stage(i.target)][0]})"
        for i in _internal(all_imports())
        if _stage(i.target) > _stage(i.module)
    )
    assert not later


def test_the_import_graph_has_no_cycle():
    """Imports that run (type-only imports under TYPE_CHECKING do not: an Analysis carries the
    Comparison that is made from two analyses) form no cycle between modules."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in _internal(all_imports()):
        if not i.typing:
            graph[i.module].add(i.target)
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles


def test_the_report_reads_rules_through_the_registry_and_findings_only():
    inside = sorted(
        f"{i.module} -> {i.target}"
        for i in all_imports()
        if i.module.startswith("tracelens.report") and i.target.startswith("tracelens.rules.")
    )
    assert not inside


def test_no_module_keeps_results_between_analyses():
    """Results of an analysis live in its RunContext, not in module state: no module-level container
    filled at run time (the rule, format and line-format registries, filled at import, aside), no
    function that rebinds a module-level name (`global _cache`), and no memoized function of frames
    or tables (memoized grammars and folders, functions of names, are fine)."""
    frame_types = ("DataFrame", "Series", "LazyFrame", "RunTables", "RunContext", "Table")
    registries = {"tracelens.rules._REGISTRY", "tracelens.ingest._FORMATS", "tracelens.ingest._LINE_FORMATS"}
    found = []
    for path in SOURCES:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            names = [
                t.id
                for t in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
                if isinstance(t, ast.Name)
            ]
            empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(
                value, "keys", getattr(value, "elts", None)
            )
            made = (
                isinstance(value, ast.Call)
                and (not value.args or ast.unparse(value.func).endswith("defaultdict"))
                and (
                    ast.unparse(value.func).split(".")[-1]
                    in ("dict", "list", "set", "OrderedDict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary")
                )
            )
            found.extend(f"{module}.{n}" for n in names if (empty or made) and f"{module}.{n}" not in registries)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            rebound = [n for g in ast.walk(func) if isinstance(g, ast.Global) for n in g.names]
            found.extend(f"{module}.{n} (global in {func.name})" for n in rebound)
            memoized = any(
                ast.unparse(d).split("(")[0].split(".")[-1] in ("cache", "lru_cache") for d in func.decorator_list
            )
            annotations = " ".join(
                ast.unparse(a.annotation) for a in func.args.args + func.args.kwonlyargs if a.annotation
            )
            if memoized and (
                any(t in annotations for t in frame_types)
                or any(a.annotation is None and a.arg not in ("self", "cls") for a in func.args.args)
            ):
                found.append(f"{module}.{func.name}")
    assert not found, f"module-level state that can hold a run's results: {found}"


# The standard library, and its modules newer than Python 3.10 (imported under a version check)
STDLIB = sys.stdlib_module_names | {"tomllib"}


def _third_party(imports: list[Import]) -> dict[str, bool]:
    """Top-level third-party module -> whether every import of it is lazy."""
    out: dict[str, bool] = {}
    for i in imports:
        top = i.target.split(".")[0]
        if top and top != "tracelens" and top not in STDLIB and top != "__future__":
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
    for module, lazy in _third_party(all_imports()).items():
        dist = _distribution(module)
        optional = set().union(*(reqs for extra, reqs in EXTRAS.items() if extra != "test"))
        if dist not in RUNTIME and not (lazy and dist in optional):
            undeclared.append(f"{module} ({dist})")
    assert not undeclared, f"imported by src/tracelens but not declared in pyproject.toml: {undeclared}"


def test_every_runtime_dependency_is_imported_by_the_package():
    """A runtime dependency the package never imports belongs in an extra (scapy: only the fixture
    generator and the tests use it)."""
    used = {_distribution(m) for m in _third_party(all_imports())}
    assert RUNTIME - used == set(), "declared runtime dependencies that src/tracelens never imports"


def test_the_wheel_holds_the_package_and_its_data_only():
    """The fixture generator (synth/) and the tests stay out of the wheel, and the package never
    imports them (an installed tracelens has neither)."""
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["src/tracelens"]
    assert set(wheel["force-include"]) == {"grammars"}  # the report's templates are in the package
    outside = sorted(
        {
            f"{i.module} -> {i.target}"
            for i in all_imports()
            if i.target.split(".")[0] in ("synth", "tests", "benchmarks")
        }
    )
    assert not outside
    assert not (SRC / "synth").exists() and not (SRC / "tracelens" / "synth").exists()


def test_rules_leave_their_id_to_the_registry():
    """Rule.run stamps every finding with its rule's id: a rule module that names one itself could
    name the wrong one."""
    named = []
    for path in (SRC / "tracelens" / "rules").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and any(k.arg == "rule_id" for k in node.keywords):
                named.append(f"{path.name}:{node.lineno}")
    assert not named


def _functions_and_classes() -> Iterator[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield path, node


def test_a_class_name_names_one_class():
    """Two classes of one name (private ones too) read as one to whoever greps for it."""
    where: dict[str, list[str]] = {}
    for path, node in _functions_and_classes():
        if isinstance(node, ast.ClassDef):
            where.setdefault(node.name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def test_the_run_context_is_called_ctx():
    """A RunContext parameter is `ctx` everywhere, and `ctx` is always a RunContext."""
    odd = []
    for path, node in _functions_and_classes():
        if isinstance(node, ast.ClassDef):
            continue
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            if ("RunContext" in annotation) != (arg.arg == "ctx") and (annotation or arg.arg != "ctx"):
                odd.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}({arg.arg}: {annotation})")
    assert odd == []


def test_rule_modules_import_no_other_rule_module():
    """What several rules share (a default, a margin, a window cap) lives upstream in tracelens.derived,
    or in tracelens.findings (rows made into Evidence, the verdict): a rule module that imports another
    one couples two families and runs the other's registrations on import. Every module of
    tracelens.rules but the registry registers rules, so that the package holds only rules."""
    rules_dir = SRC / "tracelens" / "rules"
    modules = {f"tracelens.rules.{p.stem}": p for p in rules_dir.glob("*.py") if p.name != "__init__.py"}
    defining = {name for name, p in modules.items() if "\n@rule(" in p.read_text(encoding="utf-8")}
    crossing = sorted(
        f"{i.module} -> {i.target}" for i in _internal(all_imports()) if i.module in defining and i.target in defining
    )
    assert len(defining) >= 8 and not crossing
    assert defining == set(modules), f"modules of tracelens.rules that register no rule: {set(modules) - defining}"


# What the RunContext computes once (tracelens.derived.RunContext's properties, by the function
# behind each): a rule, a report section or the comparison that calls one of these recomputes it.
CONTEXT_RESULTS = {
    "step_series",
    "slow_windows",
    "sustained_windows",
    "slow_episodes",
    "run_time_s",
    "counter_deltas",
    "latest_ports",
    "port_ranks",
    "host_names",
    "network_events",
    "stuck",
    "desyncs",
    "first_stopped",
}


def test_rules_and_report_read_shared_results_from_the_context():
    recomputed = {}
    for path in SOURCES:
        module = _module_name(path)
        if not module.startswith(("tracelens.rules", "tracelens.report", "tracelens.compare")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in CONTEXT_RESULTS:
                    recomputed.setdefault(module, set()).add(name)
    assert not recomputed, "read these from the RunContext (ctx.<name>)"


# What the repository may not name: documents that live outside it, and folders of one machine. The
# patterns are split so that this file does not name them itself.
OUTSIDE_REFERENCES = re.compile(
    "|".join(
        re.escape(p)
        for p in (
            "DESIGN" + " §",
            "DESIGN" + ".md",
            "shared" + "/docs",
            "other" + "-formats.md",
            "nccl" + "-formats.md",
        )
    )
    + "|(?<![\\w.])/"
    + "work/"
)
# Files allowed to name such things, each with its reason. Recorded output of the lab's real runs
# keeps what the processes printed (their interpreter's and scripts' paths), see RECORDED.
KNOWN_OUTSIDE_REFERENCES: dict[str, str] = {}
RECORDED = re.compile(r"fixtures/lab-[^/]+/(?!(?:.*/)?README\.md$)")  # what a lab run printed, kept as printed
# what .gitignore leaves out: environments, caches, build output, benchmark workloads
IGNORED_NAMES = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
IGNORED_PATHS = ("build/", "dist/", "benchmarks/out/")


def _repository_text_files() -> Iterator[tuple[str, str]]:
    """(path relative to the repository, text) of every UTF-8 text file in the tree."""
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        ignored = any(p in IGNORED_NAMES or p.endswith(".egg-info") for p in parts)
        if ignored or not path.is_file() or "/".join(parts).startswith(IGNORED_PATHS):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # captures, archives, pickles: data, not text anyone reads
        yield "/".join(parts), text


def test_the_repository_refers_only_to_itself():
    """Code, docs and scripts point at documents in the repository, never at design notes kept
    beside it or at one machine's folders (use a relative path or an environment variable)."""
    found: dict[str, list[str]] = {}
    for name, text in _repository_text_files():
        if RECORDED.match(name):
            continue
        hits = [
            f"{i}: {line.strip()[:120]}"
            for i, line in enumerate(text.splitlines(), 1)
            if OUTSIDE_REFERENCES.search(line)
        ]
        if hits:
            found[name] = hits
    unexpected = {name: hits for name, hits in found.items() if name not in KNOWN_OUTSIDE_REFERENCES}
    assert not unexpected, unexpected
    stale = sorted(set(KNOWN_OUTSIDE_REFERENCES) - set(found))
    assert not stale, f"no longer name anything outside the repository: drop them from the exceptions: {stale}"


def test_links_between_the_repository_documents_resolve():
    """A relative Markdown link (`[formats](docs/formats/README.md)`) names a file of the repository."""
    broken = []
    for name, text in _repository_text_files():
        if not name.endswith(".md") or RECORDED.match(name):
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z+.-]*:|#", target):  # a URL or an anchor of the same page
                continue
            if not ((REPO / name).parent / target.split("#")[0]).exists():
                broken.append(f"{name}: {target}")
    assert not broken, broken


# A source file named by its path in the package (`ingest/text/lines.py`, `src/tracelens/rules/steps.py`);
# inside a table of ingest's packages the path may be relative to ingest/.
MODULE_PATH = re.compile(
    r"(?<![\w/.-])(?:src/tracelens/)?((?:ingest|derived|rules|report|findings|compare|packets)/[\w/.-]*?\.py)\b"
)
# A module or a name in one, by its dotted name (`tracelens.ingest.textlog.ingest`); tracelens.toml is a file.
DOTTED_NAME = re.compile(r"(?<![\w.])tracelens(?:\.(?!toml\b)[A-Za-z_]\w*)+")
# Files whose module paths are being updated by a change under way elsewhere.
KNOWN_STALE_PATHS: dict[str, str] = {}


def _resolves(dotted: str) -> bool:
    """Whether a dotted name is a module of tracelens, or a name defined in one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_the_modules_the_repository_names_exist():
    """A path like `ingest/fabric/dumps.py` or a dotted name like `tracelens.ingest.textlog.ingest` in a
    document, a docstring or a comment names what the package holds as it is laid out now: a module
    moved or renamed leaves no reader looking for it."""
    package = SRC / "tracelens"
    found: dict[str, list[str]] = {}
    for name, text in _repository_text_files():
        if name.startswith("fixtures/") or not name.endswith((".md", ".py", ".lark", ".toml", ".sh")):
            continue
        stale = [
            m.group(0)
            for m in MODULE_PATH.finditer(text)
            if not (package / m.group(1)).exists() and not (package / "ingest" / m.group(1)).exists()
        ]
        stale += [m.group(0) for m in DOTTED_NAME.finditer(text) if not _resolves(m.group(0).rstrip("."))]
        if stale:
            found[name] = stale
    unexpected = {name: paths for name, paths in found.items() if name not in KNOWN_STALE_PATHS}
    assert not unexpected, unexpected
    fixed = sorted(set(KNOWN_STALE_PATHS) - set(found))
    assert not fixed, f"every path they name exists now: drop them from the exceptions: {fixed}"
