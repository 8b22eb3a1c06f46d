"""The pipeline, the one place the stages are chained:
discover -> ingest -> RunTables -> timeline (aligned tables) -> derived (RunContext) -> rules -> findings.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
from polars.exceptions import PanicException

from tracelens import scaleout
from tracelens.config_file import Config, rename_hosts
from tracelens.derived import RunContext
from tracelens.derived.flows import event_times
from tracelens.derived.hosts import untied
from tracelens.discover import discover, sniff_file
from tracelens.findings import Finding
from tracelens.ingest import Account, IngestResult, InputFile, ingest_file, small_files, splits, with_host_hint
from tracelens.ingest.profiler import kineto
from tracelens.rules import Rule, select_rules
from tracelens.tables import RunTables, Spill
from tracelens.timeline import Timeline, align

if TYPE_CHECKING:
    from tracelens.compare import Comparison

Progress = Callable[[int, int, str], None]

# Below this much input, worker processes cost more than they save.
PARALLEL_MIN_BYTES = 64 << 20
# What a run holds in memory of the rows of files that were not spilled as they were read (small
# files, batches of them): past it, each unit's rows are written to the run's spill folder and read
# lazily, so that a folder of thousands of per-rank logs is bounded as one big log is.
HELD_BYTES = 256 << 20


@dataclass(frozen=True)
class RuleFailure:
    """A rule that raised on this run (a bug in tracelens): its findings are lost, every other rule's
    stand. `error` is the exception's type and the first line of its message, cut short and printable
    characters only (the message may quote the input); `traceback` the whole of it, for a bug report."""

    rule: Rule
    error: str
    traceback: str

    @classmethod
    def of(cls, rule: Rule, exc: Exception) -> RuleFailure:
        first = (str(exc).splitlines() or [""])[0][:200]
        said = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        printable = "".join(c if c.isprintable() else "\ufffd" for c in said)
        return cls(rule, printable, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def to_json(self) -> dict:
        return {"rule": self.rule.id, "error": self.error}


@dataclass
class Analysis:
    """Everything one run produced: its context (aligned tables and derived results), its findings
    (root causes first), the rules checked, those that could not run (with what input they lack),
    those that failed, and the notes the report and terminal must show (refused archive members,
    the zone decision ...)."""

    target: Path
    context: RunContext
    findings: list[Finding]
    rules: list[Rule]
    notes: list[str] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    comparison: Comparison | None = None  # against a good run, with `analyze --baseline`
    not_run: list[tuple[Rule, list[str]]] = field(default_factory=list)  # (rule, inputs that would let it run)
    failed: list[RuleFailure] = field(default_factory=list)  # rules that raised
    config: Config = field(default_factory=Config)  # the config file's choices (none: the defaults)
    # the run's working folder, removed when the analysis goes: its captures' packets are read from there
    workdir: tempfile.TemporaryDirectory | None = None

    @property
    def tables(self) -> RunTables:
        """The aligned tables."""
        return self.context.tables

    @property
    def checked(self) -> list[Rule]:
        """The rules that ran to the end (their input was there, and they did not fail)."""
        skipped = {r.id for r, _ in self.not_run} | {f.rule.id for f in self.failed}
        return [r for r in self.rules if r.id not in skipped]

    def close(self) -> None:
        """Remove the run's working folder now, not when the process exits (its spilled tables and its
        captures' packets go with it: the tables cannot be read after)."""
        if self.workdir is not None:
            self.workdir.cleanup()
            self.workdir = None

    def __enter__(self) -> Analysis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def readable(self) -> bool:
        """Whether anything at all was understood."""
        inputs = self.tables["inputs"]
        return inputs.height > 0 and int(inputs["parsed"].sum()) > 0


def _ingest_with_host(source: InputFile, jobs: int = 1, workers: Executor | None = None) -> IngestResult:
    """Ingest one file (its chunks in `jobs` processes or on `workers`); rows whose content named no
    host take the host its path suggests."""
    result = ingest_file(source, jobs, workers)
    result.tables = with_host_hint(result.tables, source.host_hint)
    return result


def _hosts(tables: dict[str, pl.DataFrame]) -> list[str]:
    """The hosts a file's rows name, in one query over all its tables."""
    named = [f.lazy().select(pl.col("host").cast(pl.String)) for f in tables.values() if "host" in f.collect_schema()]
    if not named:
        return []
    return sorted(h for h in pl.concat(named).unique().collect()["host"].to_list() if h)


def _input_row(source: InputFile, acc: Account, hosts: list[str]) -> dict:
    return {
        "file": source.name,
        "format": source.format,
        "host": ", ".join(hosts) or source.host_hint,
        "size": source.size,
        "lines": acc.lines,
        "parsed": acc.parsed,
        "ignored": acc.ignored,
        "unrecognized": acc.unrecognized,
        "errors": acc.errors,
        "notes": acc.notes,
        "samples": [{"line": line, "text": text} for line, text in acc.samples],
    }


@dataclass
class Ingested:
    """What one unit of work gave: its tables, and one `inputs` row per file in it."""

    tables: dict[str, pl.DataFrame]
    inputs: list[dict]


def _ingested(source: InputFile, result: IngestResult) -> Ingested:
    return Ingested(result.tables, [_input_row(source, result.account, _hosts(result.tables))])


def _ingest_item(files: list[InputFile], jobs: int = 1) -> Ingested:
    """One file (its chunks in `jobs` processes), or a batch of small logs read as one."""
    if len(files) == 1:
        return _ingested(files[0], _ingest_with_host(files[0], jobs))
    try:
        batch = small_files.ingest(files)
    except Exception:  # one file read alone says what is wrong with it, and the rest are read
        batch = small_files.BatchResult(per_file=files)
    alone = {f.name: _ingest_with_host(f) for f in batch.per_file}
    rows = []
    for source in files:
        if source.name in alone:
            rows.append(_input_row(source, alone[source.name].account, _hosts(alone[source.name].tables)))
        else:
            rows.append(_input_row(source, *batch.accounts[source.name]))
    tables = batch.tables
    if alone:  # rows in file order, as if every file had been read alone
        tables = small_files.in_file_order([tables, *(r.tables for r in alone.values())], files)
    return Ingested(tables, rows)


def ingest_run(
    target: Path, workdir: Path, jobs: int | None = None, progress: Progress | None = None, ray: str | None = None
) -> tuple[RunTables, list[str]]:
    """Discover and ingest every input under `target` with `jobs` processes (default: every core),
    or as tasks on the Ray cluster at `ray` (scaleout.py); return the tables and discovery notes.

    Files go to the processes side by side, unless one file holds most of the bytes: then the
    files are read one after the other, each big one with its chunks parsed in `jobs` processes.
    """
    if ray is not None:
        return _ingest_on_ray(target, workdir, ray, progress)
    jobs = jobs or os.cpu_count() or 1
    with ExitStack() as closing:
        pool: ProcessPoolExecutor | None = None

        def workers() -> ProcessPoolExecutor:
            """The worker processes, started when first needed (to sniff many files, or to ingest)."""
            nonlocal pool
            if pool is None:  # spawn: polars' thread pool does not survive fork
                pool = closing.enter_context(ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")))
            return pool

        def sniff_many(paths: list[Path]) -> Iterable[tuple[str, str | None]]:
            return workers().map(sniff_file, paths, chunksize=max(1, len(paths) // (jobs * 4)))

        found = discover(target, workdir, sniff_many=sniff_many if jobs > 1 else None)
        spill = workdir / "spill"  # big logs' rows go there as they are read, and small files' past HELD_BYTES
        found.files = [replace(f, spill=spill) for f in found.files]
        tables = RunTables()
        items = small_files.work_items(found.files)
        sizes = [sum(f.size for f in item) for item in items]
        if jobs > 1 and len(items) > 1 and sum(sizes) >= PARALLEL_MIN_BYTES and max(sizes) * 2 < sum(sizes):
            units = workers().map(_ingest_item, items, chunksize=max(1, len(items) // (jobs * 16)))
            _collect(units, tables, len(found.files), progress, spill)
        else:
            _collect((_ingest_item(item, jobs) for item in items), tables, len(found.files), progress, spill)
    return tables, found.notes


def _ingest_on_ray(target: Path, workdir: Path, address: str, progress: Progress | None) -> tuple[RunTables, list[str]]:
    """Each file as a Ray task that writes its tables as Parquet partitions into `workdir` (shared
    storage); big text files are read here with their chunks parsed by Ray tasks."""
    cpus, started = scaleout.connect(address)
    found = discover(target, workdir)
    found.notes += [started] if started else []
    spill = workdir / "spill"
    found.files = [replace(f, spill=spill) for f in found.files]
    cluster = scaleout.RayExecutor()
    parts = workdir / "tables"
    tasks = {
        i: cluster.submit(_ingest_to_partitions, f, parts, i) for i, f in enumerate(found.files) if not splits(f, cpus)
    }

    def results() -> Iterator[Ingested]:
        for i, source in enumerate(found.files):
            if i in tasks:
                result, written = tasks.pop(i).result()
                result.tables = scaleout.read_partitions(written)
            else:
                result = _ingest_with_host(source, cpus, cluster)
            yield _ingested(source, result)

    tables = RunTables()
    _collect(results(), tables, len(found.files), progress, spill)
    return tables, found.notes


def _ingest_to_partitions(source: InputFile, folder: Path, index: int) -> tuple[IngestResult, dict[str, str]]:
    """A Ray task: ingest one file, write its tables as Parquet partitions, return its account and their paths."""
    result = _ingest_with_host(source)
    written = scaleout.write_partitions(result.tables, folder, index)
    return IngestResult(account=result.account), written


def _collect(
    units: Iterable[Ingested], tables: RunTables, total: int, progress: Progress | None, spill_root: Path
) -> None:
    """Each unit's tables added to `tables` in order, and its files' `inputs` rows; rows in memory past
    HELD_BYTES go to a spill folder under `spill_root` and are added as lazy scans. A run of one file
    keeps its rows: they are what its ingest held at its end, and writing them to read them back again
    and again (the rules, the report) would free nothing."""
    rows = []
    held = 0
    spill: Spill | None = None
    for unit in units:
        for name, frame in unit.tables.items():
            if total > 1 and isinstance(frame, pl.DataFrame) and (held := held + frame.estimated_size()) > HELD_BYTES:
                spill = spill or Spill(spill_root)
                if (part := spill.write(name, frame)) is not None:
                    frame = pl.scan_parquet(part)
            tables.add(name, frame)
        for row in unit.inputs:
            rows.append(row)
            if progress:
                progress(len(rows), total, row["file"])
    if rows:
        tables.add("inputs", pl.DataFrame(rows, infer_schema_length=None))


@dataclass
class RulesRun:
    """What running the rules gave: the findings, ranked; the rules that could not run (with the
    inputs that would let them); the rules that failed."""

    findings: list[Finding]
    not_run: list[tuple[Rule, list[str]]]
    failed: list[RuleFailure]


def run_rules(ctx: RunContext, rules: list[Rule], config: Config | None = None) -> RulesRun:
    """Run every rule whose input is there, with the settings and severities of `config`. A rule that
    raises is a failed rule, not a failed run: the report still says what every other rule found.
    Findings are ordered by evidence score, then worst first, causes before symptoms, then by rule id.

    Only the correlation rules (TL41x) score their findings (see Finding.score): a finding
    that joins several sources into the cause of a slow window or a hang comes first. Among
    the others, at equal severity, a finding that says why (a straggler, a bad port) comes
    before the symptoms that only say how much time went where.
    """
    config = config or Config()
    findings: list[Finding] = []
    not_run: list[tuple[Rule, list[str]]] = []
    failed: list[RuleFailure] = []
    for r in rules:
        lacking = r.missing_inputs(ctx.tables)
        if lacking:
            not_run.append((r, lacking))
            continue
        try:
            findings.extend(r.run(ctx, config.settings.get(r.id), config.severity.get(r.id)))
        except (Exception, PanicException) as exc:  # a polars panic in a rule's query is that rule's bug
            failed.append(RuleFailure.of(r, exc))
    symptoms = {r.id for r in rules if r.kind == "symptom"}
    ranked = sorted(findings, key=lambda f: (-f.score, -f.severity, f.rule_id in symptoms, f.rule_id))
    return RulesRun(ranked, not_run, failed)


# Tables the rules and the report read as lazy scans, a bucket or a few columns at a time: a capture's packets.
STREAMED = ("packets",)


@contextmanager
def aligned_run(
    target: Path,
    jobs: int | None = None,
    progress: Progress | None = None,
    tz: str | None = None,
    ray: str | None = None,
    config: Config | None = None,
    workdir: Path | None = None,
) -> Iterator[tuple[RunTables, Timeline, list[str]]]:
    """Ingest and align a run: its aligned tables (what `analyze --tables` and `tracelens tables`
    write), the time model's decisions and the discovery notes, while the run's working folder exists.
    `tz` is the zone of log times printed without one; `ray` the address of a Ray cluster ("auto" or
    host:port) to ingest on; `config` a config file's host aliases and zone (a `tz` given here wins
    over the file's). The spilled tables stay lazy scans of their parts, aligned as they are read, so
    `tracelens tables` streams them to its files. A `workdir` given is the working folder, kept by the
    caller after the run (else one is made for the run and removed): each spilled table is then written
    there once, aligned, and read back as a scan of that file (RunTables.settled: the rules read it many
    times), all but the captures' packets, which stay scans of the bucket files the ingest wrote."""
    config = config or Config()
    folder_made: AbstractContextManager[str | Path]
    if workdir is not None:
        folder_made = nullcontext(workdir)
    else:
        folder_made = (
            scaleout.shared_folder(target) if ray is not None else tempfile.TemporaryDirectory(prefix="tracelens-")
        )
    with folder_made as folder:
        read, notes = ingest_run(target, Path(folder), jobs=jobs, progress=progress, ray=ray)
        _stage(progress, read, "aligning the timeline")
        events = partial(event_times, windows=config.shared.packets)  # the capture's NAKs, resends ... as analysed
        renamed = rename_hosts(kineto.machine_hosts(read), config.hosts)
        tables, timeline = align(renamed, tz or config.tz, capture_events=events, workdir=Path(folder) / "spill")
        if not tz and config.tz:  # the timeline says where a given zone came from as "--tz"
            timeline.notes = [n.replace("(--tz)", f"(tz in {config.label})") for n in timeline.notes]
        if workdir is not None:
            tables = tables.settled(Path(folder) / "aligned", but=STREAMED)
        yield tables, timeline, notes


def _stage(progress: Progress | None, tables: RunTables, label: str) -> None:
    """Name the stage after the files are read on the progress bar: the bar stands full, and a big
    run's alignment or capture analysis takes a while."""
    if progress:
        files = tables.height("inputs")
        progress(files, files, label)


def analyze(
    target: Path,
    jobs: int | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    progress: Progress | None = None,
    tz: str | None = None,
    ray: str | None = None,
    config: Config | None = None,
) -> Analysis:
    """Analyse a run folder, file or archive end to end (see aligned_run for `tz`, `ray` and `config`;
    select and ignore given here win over the file's). A big file's tables stay on disk, in the run's
    working folder, which lives as long as the analysis: the rules and the report read them lazily and
    keep only what they show. On Ray (a working folder beside the run) every table is read into memory
    and the folder removed at once."""
    config = config or Config()
    # kept as long as the analysis (removed when it goes): the big tables are read lazily from there; on
    # Ray the working folder is beside the run, on shared storage, and every table is read before it goes
    workdir = tempfile.TemporaryDirectory(prefix="tracelens-") if ray is None else None
    folder = Path(workdir.name) if workdir is not None else None
    run = aligned_run(target, jobs=jobs, progress=progress, tz=tz, ray=ray, config=config, workdir=folder)
    with run as (tables, timeline, notes):
        if folder is None:
            tables.load()
        context = RunContext(tables, config.shared, workdir=folder / "derived" if folder is not None else None)
        rules = select_rules(select or config.select, ignore or config.ignore)
        _stage(progress, tables, "running the rules, analysing captures")
        ran = run_rules(context, rules, config)
        notes += [n for n in (untied(tables, context.host_names),) if n]
    return Analysis(
        target=target,
        context=context,
        findings=ran.findings,
        rules=rules,
        notes=notes + timeline.notes,
        timeline=timeline,
        not_run=ran.not_run,
        failed=ran.failed,
        config=config,
        workdir=workdir,
    )
