"""The `tracelens` command: thin on purpose; options in, analyze, print a summary."""

from __future__ import annotations

import errno
import functools
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracelens import __version__, config_file
from tracelens.analyze import Analysis, RuleFailure, aligned_run, analyze
from tracelens.findings import Severity
from tracelens.private_cache import cache_dir
from tracelens.report.terminal import shown
from tracelens.rules import all_rules
from tracelens.scaleout import RayUnavailable
from tracelens.tables import INPUTS

app = typer.Typer(
    help="Find out why a distributed training run was slow or hung, from the logs, counter dumps "
    "and captures it left behind. Offline and deterministic.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
out = Console(stderr=True, soft_wrap=True)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"tracelens {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass


class FailOn(str, Enum):
    never = "never"
    warning = "warning"
    critical = "critical"


# Exit statuses: 0 analysed, 1 findings at --fail-on, 2 usage error, nothing readable or no disk space,
# 3 a bug in tracelens (never 1: a CI gate must not read a crash as "findings"), 4 analysed and every
# output written, but a rule failed (a bug in tracelens: its findings are missing; wins over 1),
# 128+N killed by signal N.
INTERNAL_ERROR = 3
RULE_FAILED = 4
CORES = os.cpu_count() or 1
JOBS_HELP = "Processes for ingest: files side by side, and the chunks of one big file (default: every core)."
_RULE_ID = re.compile(r"^TL\d{1,3}$")


def _usage_error(message: str) -> typer.Exit:
    out.print(f"[red]error:[/] {shown(message)}", highlight=False)
    return typer.Exit(2)


def _split(values: list[str] | None, option: str) -> list[str]:
    """Rule ids or prefixes given to --select/--ignore; any that names no rule is a usage error
    (a typo such as TL1O7 must not silently run no rule and pass a CI gate)."""
    chosen = [v.strip().upper() for item in values or [] for v in item.split(",") if v.strip()]
    ids = [r.id for r in all_rules()]
    unknown = [v for v in chosen if not _RULE_ID.match(v) or not any(i.startswith(v) for i in ids)]
    if unknown:
        raise _usage_error(
            f"{option}: no rule {', '.join(map(repr, unknown))}; "
            "`tracelens rules` lists them (e.g. TL107, or TL1 for a family)"
        )
    return chosen


CONFIG_HELP = (
    "A tracelens.toml, or a pyproject.toml with \\[tool.tracelens]: rules, severities, settings, time zone, "
    "host aliases. Default: the first found in the run's folder, then in the current directory."
)


def _config(path: Path | None, *runs: Path) -> config_file.Config:
    """The config file given, else the first found beside the runs or here; a bad one is a usage error
    naming the file and the key."""
    if path is not None:
        _require(path)
    try:
        return config_file.load(path or config_file.find(*runs))
    except config_file.ConfigError as err:
        raise _usage_error(str(err)) from None


def _require(path: Path) -> None:
    try:
        path.stat()
    except FileNotFoundError:
        raise _usage_error(f"{path}: no such file or folder") from None
    except OSError as exc:
        raise _usage_error(f"{path}: cannot be opened: {exc.strerror or exc}") from None


def _writable_folder(folder: Path) -> str | None:
    """Why files cannot be written into `folder`, or None."""
    if not folder.exists():
        return f"folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"no permission to write into {folder}"
    return None


def _check_output_file(path: Path, option: str) -> None:
    """An output file must be writable before hours of analysis are spent on it."""
    if str(path) in ("", "."):
        raise _usage_error(f"{option}: an empty path; give a file name")
    if path.is_dir():
        raise _usage_error(f"{option} {path}: is a folder; give a file name")
    problem = _writable_folder(path.parent)
    if problem is None and path.exists() and not os.access(path, os.W_OK):
        problem = f"no permission to overwrite {path}"
    if problem:
        raise _usage_error(f"{option} {path}: {problem}")


def _check_output_folder(path: Path, option: str) -> None:
    """A folder for output files: it may not exist yet (it is created), but it may not be a file."""
    if str(path) == "":
        raise _usage_error(f"{option}: an empty path; give a folder")
    if path.exists():
        problem = _writable_folder(path)
    else:
        existing = next(p for p in path.absolute().parents if p.exists())
        problem = _writable_folder(existing) if existing.is_dir() else f"{existing} is a file, not a folder"
    if problem:
        raise _usage_error(f"{option} {path}: {problem}")


class _Killed(BaseException):
    """SIGTERM/SIGINT turned into an exception, so every `with` block (the private extraction
    folder above all) is cleaned up on the way out. What ends the run is the signal recorded in
    _Stop, not this exception's arguments: code it passes through (a polars callback) may raise it
    again with other ones."""


class _Stop:
    """The signal that ends the run, and the run's own temporary folder.

    Python runs a signal handler only between bytecodes of the main thread, so a kill arriving
    during a long polars computation would wait for it, and unwinding waits for the worker pools.
    A watcher thread reads the signal from the wakeup fd as it arrives: past GRACE seconds it
    removes the run's temporary folder (the run's temporary files are all made in it: the
    extraction folder, spilled tables, a capture's packets) and ends the process with 128+N."""

    GRACE = 3.0
    ENDING = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.folder = Path(tempfile.mkdtemp(prefix="tracelens-"))
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._unwound = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> int:
        self._watcher.start()
        return signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def _watch(self) -> None:
        while True:
            byte = os.read(self._read, 1)
            if not byte or not byte[0]:  # the run ended first
                return
            if byte[0] in self.ENDING:  # another signal with a Python handler is none of ours
                break
        self.signum = byte[0]
        if not self._unwound.wait(self.GRACE):
            self.remove_folder()
            os.write(2, f"stopped by {signal.Signals(self.signum).name}; temporary files removed.\n".encode())
            os._exit(128 + self.signum)

    def handler(self, signum: int, _frame) -> None:
        self.signum = signum
        raise _Killed(signum)

    def remove_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        self._unwound.set()
        os.write(self._write, b"\0")
        self._watcher.join()
        os.close(self._read)
        os.close(self._write)
        self.remove_folder()


CRASH_REPORT_HELP = (
    "Write no traceback file when tracelens fails (they go to ~/.cache/tracelens; "
    "TRACELENS_NO_CRASH_REPORT=1 does the same, for shared machines)."
)
# Whether the running command may write traceback files: _guarded sets it from --no-crash-report and
# TRACELENS_NO_CRASH_REPORT, for the command's own reports of failed rules as for its crash.
_CRASH_REPORTS: ContextVar[bool] = ContextVar("crash_reports", default=True)


def _crash_report(text: str) -> Path:
    """Write a traceback to a new file only this user can read, and return its path: in the private
    cache folder, else a fresh temporary file."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = cache_dir()
    if folder is not None:
        path = folder / f"crash-{stamp}-{os.getpid()}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    else:
        fd, name = tempfile.mkstemp(prefix=f"tracelens-crash-{stamp}-", suffix=".txt")  # 0600, unpredictable name
        path = Path(name)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(exc: BaseException) -> bool:
    """A write that found no space left (Python's own error, or polars' and DuckDB's, which carry the
    system's words and number): the machine's state, not a bug."""
    return (
        (isinstance(exc, OSError) and exc.errno in _DISK_FULL)
        or any(f"(os error {code})" in str(exc) for code in _DISK_FULL)
        or "No space left on device" in str(exc)
    )


def _internal_error(exc: BaseException, trace: str | None) -> typer.Exit:
    """One line for an unexpected error, and where its traceback was written (`trace`: None when the
    user asked for no crash report)."""
    first = (str(exc).splitlines() or [""])[0][:200]
    if trace is not None:
        how = (
            f"please report it with the traceback written to {_crash_report(trace)} "
            "(crash reports are kept there; --no-crash-report or TRACELENS_NO_CRASH_REPORT=1 writes none)"
        )
    else:
        how = "no traceback written (--no-crash-report or TRACELENS_NO_CRASH_REPORT); run again without it for one"
    out.print(
        f"[red]internal error:[/] {type(exc).__name__}: {shown(first)} (a bug in tracelens; {shown(how)})",
        highlight=False,
    )
    return typer.Exit(INTERNAL_ERROR)


@contextmanager
def _signals_end_the_run() -> Iterator[_Stop | None]:
    """While the command runs: SIGTERM and SIGINT end it (see _Stop), and temporary files go in the
    run's own folder. Outside the main thread (tests calling the app from a thread) signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stop = _Stop()
    previous = {s: signal.signal(s, stop.handler) for s in _Stop.ENDING}
    previous_fd = stop.start()
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(stop.folder)
    try:
        yield stop
    finally:
        tempfile.tempdir = saved_tempdir
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        stop.close()


def _guarded(command: Callable) -> Callable:
    """Run a command so that no traceback ever reaches the user: a signal cleans up and exits 128+N,
    anything unexpected (any exception type, a panic in polars' Rust code included) prints one line
    and where its traceback was written, and exits 3. Adds --no-crash-report to the command."""

    @functools.wraps(command)
    def run(*args, no_crash_report: bool = False, **kwargs):
        report = not no_crash_report and os.environ.get("TRACELENS_NO_CRASH_REPORT", "") in ("", "0")
        wanted = _CRASH_REPORTS.set(report)
        try:
            with _signals_end_the_run() as stop:
                try:
                    return command(*args, **kwargs)
                except (typer.Exit, typer.Abort):
                    raise
                except RayUnavailable as exc:
                    raise _usage_error(str(exc)) from None
                except BaseException as exc:
                    if stop is not None and stop.signum is not None:
                        out.print(f"[red]stopped[/] by {signal.Signals(stop.signum).name}; temporary files removed.")
                        raise typer.Exit(128 + stop.signum) from None
                    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                        raise
                    if _disk_full(exc):
                        where = f" writing {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
                        raise _usage_error(
                            f"no space left on the device{where}: free some, or point TMPDIR (the working "
                            "folder) and -o at a disk with room"
                        ) from None
                    failed, trace = exc, traceback.format_exc()
        finally:
            _CRASH_REPORTS.reset(wanted)
        # written here, after the run's temporary folder is gone (a fallback crash file must outlive it)
        raise _internal_error(failed, trace if report else None) from None

    option = inspect.Parameter(
        "no_crash_report",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[bool, typer.Option("--no-crash-report", help=CRASH_REPORT_HELP)],
    )
    signature = inspect.signature(command, eval_str=True)
    run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), option])  # type: ignore[attr-defined]
    run.__annotations__ = {**command.__annotations__, "no_crash_report": option.annotation}
    return run


def _failed_rules_report(failures: list[RuleFailure]) -> list[tuple[str, Path]]:
    """The tracebacks of the rules that failed, in a crash report to send with a bug report: the
    output line that names it (none when no rule failed, or the user asked for no crash report)."""
    if not failures or not _CRASH_REPORTS.get():
        return []
    text = "\n".join(f"{f.rule.id} {f.rule.name} failed:\n{f.traceback}" for f in failures)
    return [("Failed rules' tracebacks (a bug in tracelens; please report it with them)", _crash_report(text))]


def _require_zone(tz: str | None) -> None:
    if tz is None:
        return
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        out.print(f"[red]error:[/] --tz {tz!r} is not a time zone name (e.g. UTC, Europe/Berlin, America/New_York)")
        raise typer.Exit(2) from None


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]reading"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=out,
        transient=True,
    )


def _command_line() -> str:
    """The command as typed, for the Markdown's footer (the run can be repeated from the ticket)."""
    return shlex.join(["tracelens", *sys.argv[1:]])


@app.command("analyze")
@_guarded
def analyze_cmd(
    run: Annotated[
        Path, typer.Argument(help="A run folder, a single file, or an archive (.tar, .tar.gz, .tgz, .zip, .gz).")
    ],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Where to write the HTML report. Default: ./tracelens-<run>.html"),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the findings and input accounting as JSON.")
    ] = None,
    tables_dir: Annotated[
        Path | None, typer.Option("--tables", help="Also write every parsed table as Parquet into this folder.")
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option(
            "--tz",
            help=(
                "Time zone of log timestamps printed without one (e.g. Europe/Berlin). Default: found against a "
                "capture's UTC times, else UTC."
            ),
        ),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help=JOBS_HELP)] = CORES,
    fail_on: Annotated[
        FailOn, typer.Option("--fail-on", help="Exit with status 1 when a finding at or above this severity fires.")
    ] = FailOn.never,
    select: Annotated[
        list[str] | None,
        typer.Option("--select", help="Only these rules (ids or prefixes, comma separated), e.g. TL1,TL205."),
    ] = None,
    ignore: Annotated[
        list[str] | None, typer.Option("--ignore", help="Skip these rules (ids or prefixes, comma separated).")
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            help=(
                "A good run of the same job to compare with: the report "
                "adds what changed, ranked by the slowdown it explains."
            ),
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help=(
                "Ingest as tasks on a Ray cluster that sees RUN on shared storage: 'auto' (the cluster this "
                "machine joined, else a local Ray instance started here) or its address host:port. "
                "Needs tracelens\\[ray]."
            ),
        ),
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option("--markdown", help="Also write a ticket-ready Markdown summary (GitHub, Jira) to this file."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Print each finding's details, fix and first evidence lines too.")
    ] = False,
    config_path: Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)] = None,
) -> None:
    """Analyse a run, write its HTML report (exit 0 analysed, 1 findings at --fail-on, 2 unreadable, 4 a rule failed)"""
    from tracelens.report.html import write as write_html
    from tracelens.report.markdown import write as write_markdown
    from tracelens.report.summary import to_json
    from tracelens.report.terminal import print_summary

    _require(run)
    if baseline:
        _require(baseline)
    _require_zone(tz)
    select_ids, ignore_ids = _split(select, "--select"), _split(ignore, "--ignore")
    config = _config(config_path, run)
    report = output or Path(f"tracelens-{run.resolve().name.split('.')[0] or 'run'}.html")
    _check_output_file(report, "-o/--output")
    if json_path is not None:
        _check_output_file(json_path, "--json")
    if markdown is not None:
        _check_output_file(markdown, "--markdown")
    if tables_dir is not None:
        _check_output_folder(tables_dir, "--tables")
    options = dict(jobs=jobs, select=select_ids, ignore=ignore_ids, tz=tz, ray=ray, config=config)
    with ExitStack() as analyses:
        analysis = _analyze_with_progress(run, analyses, **options)
        if baseline:
            from tracelens.compare import compare

            good = _analyze_with_progress(baseline, analyses, **options)
            analysis.comparison = compare(good, analysis)
        written = [("Report", write_html(analysis, report))]
        if markdown:
            written.append(("Markdown", write_markdown(analysis, markdown, command=_command_line())))
        if json_path:
            json_path.write_text(json.dumps(to_json(analysis), indent=2, default=str), encoding="utf-8")
            written.append(("JSON", json_path))
        if tables_dir:
            analysis.tables.write_parquet(tables_dir)
            written.append(("Tables", tables_dir))
        failed = [f for _, f in analysis.comparison.failed] if analysis.comparison else analysis.failed
        written += _failed_rules_report(failed)
        # The summary is the command's output (stdout, so it can be piped or saved); progress and errors go to stderr.
        console = Console(soft_wrap=True)
        print_summary(console, analysis, written, verbose=verbose)
        if analysis.comparison:
            console.print(
                f"[bold]Against {shown(str(baseline))}:[/] {shown(analysis.comparison.verdict)}", highlight=False
            )
        if not analysis.readable:
            raise typer.Exit(2)
        if failed:
            raise typer.Exit(RULE_FAILED)
        if fail_on is not FailOn.never and any(f.severity >= Severity.parse(fail_on.value) for f in analysis.findings):
            raise typer.Exit(1)


def _analyze_with_progress(run: Path, closing: ExitStack, **options) -> Analysis:
    """`analyze` with a progress bar over the files read; the analysis is closed with `closing`."""
    with _progress() as bar:
        task = bar.add_task("", total=None)

        def step(done: int, total: int, name: str) -> None:
            bar.update(task, completed=done, total=total, description=shown(name[-60:]))

        analysis = analyze(run, progress=step, **options)
    closing.callback(analysis.close)  # its working folder goes when the command is done, not at exit
    return analysis


@app.command("diff")
@_guarded
def diff_cmd(
    good: Annotated[Path, typer.Argument(help="The good run (folder, file or archive): the last run that was fast.")],
    bad: Annotated[Path, typer.Argument(help="The slow run to explain.")],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Where to write the HTML diff. Default: ./tracelens-diff-<bad>.html"),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the comparison as JSON.")] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the comparison as Markdown for a ticket.")
    ] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="Time zone of log timestamps printed without one (both runs).")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help=JOBS_HELP)] = CORES,
    config_path: Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)] = None,
) -> None:
    """Compare a good run with a slow one: what changed (NCCL, DeepSpeed config, ports, traffic, steps),
    ranked by how much of the slowdown it explains (exit 4 when a rule failed on either run)."""
    from tracelens.compare import compare
    from tracelens.report.diff import failed_lines
    from tracelens.report.diff import write as write_diff
    from tracelens.report.markdown import write_diff as write_diff_markdown

    _require(good)
    _require(bad)
    _require_zone(tz)
    config = _config(config_path, bad, good)
    report = output or Path(f"tracelens-diff-{bad.resolve().name.split('.')[0] or 'run'}.html")
    _check_output_file(report, "-o/--output")
    for path, option in ((json_path, "--json"), (markdown, "--markdown")):
        if path is not None:
            _check_output_file(path, option)
    with ExitStack() as analyses:
        comparison = compare(
            *(_analyze_with_progress(run, analyses, jobs=jobs, tz=tz, config=config) for run in (good, bad))
        )
        out.print(f"Config: {shown(config.label)}", highlight=False)
        out.print(f"[bold]{shown(comparison.verdict)}[/]", highlight=False)
        for i, change in enumerate(comparison.changes[:10], start=1):
            explains = f"  [{change.explains_ms:+,.0f} ms/step]" if change.explains_ms is not None else ""
            out.print(f"{i:>2}. {shown(change.sentence)}{explains}", highlight=False)
        if len(comparison.changes) > 10:
            out.print(f"    ... and {len(comparison.changes) - 10} more in the report")
        write_diff(comparison, report)
        if json_path:
            json_path.write_text(json.dumps(comparison.to_json(), indent=2, default=str), encoding="utf-8")
            out.print(f"JSON: {json_path}")
        if markdown:
            out.print(f"Markdown: {write_diff_markdown(comparison, markdown, command=_command_line())}")
        out.print(f"Report: [bold]{report}[/]", highlight=False)
        for line in failed_lines(comparison):
            out.print(f"[red]error:[/] {escape(line)}", highlight=False)
        for label, path in _failed_rules_report([f for _, f in comparison.failed]):
            out.print(f"{label}: {escape(str(path))}", highlight=False)
        if comparison.failed:
            raise typer.Exit(RULE_FAILED)


@app.command("tables")
@_guarded
def tables_cmd(
    run: Annotated[Path, typer.Argument(help="A run folder, file or archive.")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Folder for the Parquet files (one per table, inputs included).")
    ],
    tz: Annotated[
        str | None, typer.Option("--tz", help="Time zone of log timestamps printed without one, as for analyze.")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help=JOBS_HELP)] = CORES,
    config_path: Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)] = None,
) -> None:
    """Ingest and align only: write every table as Parquet, to query with polars or DuckDB (exit 2 when
    nothing was readable). The tables are those `analyze --tables` writes: `ts` in UTC as the time model
    placed it, `ts_text` the time as the input printed it."""
    _require(run)
    _require_zone(tz)
    _check_output_folder(output, "-o/--output")
    config = _config(config_path, run)  # its host aliases and zone, as analyze applies them
    with _progress() as bar:
        task = bar.add_task("", total=None)
        progress = lambda d, t, n: bar.update(task, completed=d, total=t, description=shown(n[-60:]))  # noqa: E731
        with aligned_run(run, jobs=jobs, tz=tz, config=config, progress=progress) as (tables, timeline, notes):
            written = tables.write_parquet(output)  # spilled tables streamed from their parts, aligned on the way
    for note in notes + timeline.notes:
        out.print(f"[yellow]note:[/] {shown(note)}", highlight=False)
    for path in written:
        out.print(f"{path}  ({pl.scan_parquet(path).select(pl.len()).collect().item():,} rows)", highlight=False)
    inputs = tables["inputs"]
    for err in (e for errs in inputs["errors"].to_list() for e in errs or []) if inputs.height else []:
        out.print(f"[red]error:[/] {shown(err)}", highlight=False)
    if not inputs.height or not int(inputs["parsed"].sum()):
        why = (
            "no input contained evidence tracelens understands"
            if inputs.height
            else f"no file found in {shown(str(run))}"
        )
        out.print(f"[red]Nothing readable:[/] {why}.")
        raise typer.Exit(2)


def _headline(text: str) -> str:
    """The first clause of a rule's description, for the catalogue (`tracelens rules ID` has it all)."""
    for stop in re.finditer(r"(?<=[^.])[.:;] |\.$", text):
        inside_quote = text.count("`", 0, stop.start()) % 2 == 1  # a `quoted log text`
        if not inside_quote and not re.search(r"\b(?:i\.e|e\.g)$", text[: stop.start()]):
            return text[: stop.start()]
    return text


CATALOGUE_COLUMNS = ("Rule", "Name", "Severity", "Kind", "What it finds")


def _catalogue() -> list[tuple[str, ...]]:
    """One row per registered rule, as both forms of the catalogue show it."""
    return [(r.id, r.name, r.severity.label, r.kind, _headline(r.docs.get("What it finds", ""))) for r in all_rules()]


def rules_markdown() -> str:
    """The catalogue as a Markdown table (for a wiki or a ticket), generated from the registry."""
    rows = ["| " + " | ".join(c.lower() for c in CATALOGUE_COLUMNS) + " |", "|---" * len(CATALOGUE_COLUMNS) + "|"]
    rows += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _catalogue()]
    return "\n".join(rows) + "\n"


@app.command("rules")
def rules_cmd(
    rule_id: Annotated[str | None, typer.Argument(help="A rule id, e.g. TL101, to show its documentation.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the catalogue as a Markdown table.")] = False,
) -> None:
    """Print the rule catalogue, or one rule's documentation."""
    console = Console()
    rules = all_rules()
    if markdown:
        sys.stdout.write(rules_markdown())
        return
    if rule_id is None:
        table = Table(header_style="bold")
        for col in CATALOGUE_COLUMNS:
            table.add_column(col)
        for row in _catalogue():
            table.add_row(*row)
        console.print(table)
        return
    match = [r for r in rules if r.id == rule_id.upper()]
    if not match:
        out.print(f"[red]error:[/] no rule {rule_id!r}; `tracelens rules` lists them")
        raise typer.Exit(2)
    r = match[0]
    console.print(
        f"[bold]{escape(r.id)} {escape(r.name)}[/] (a {r.kind}; default severity {r.severity.label})\n", highlight=False
    )
    for title, body in r.docs.items():
        console.print(f"[bold]{title}[/]\n{escape(body)}\n", highlight=False)
    needs = [" or ".join(f"{name} ({INPUTS[name]})" for name in need.split("|")) for need in r.needs]
    console.print("[bold]Needs[/]\n" + "\n".join(f"- {escape(n)}" for n in needs) + "\n", highlight=False)
    _print_settings(console, f"Settings (in a tracelens.toml: [rules.{r.id}])", r.settings)
    for name in r.shared_settings:
        group = config_file.SHARED_SETTINGS[name]
        title = f"\n{group.title} (in a tracelens.toml: [{name}], for every rule that {group.readers})"
        _print_settings(console, title, group.settings)


def _print_settings(console: Console, title: str, settings: tuple) -> None:
    console.print(f"[bold]{escape(title)}[/]" + ("" if settings else "\nnone"), highlight=False)
    for s in settings:
        default = list(s.default) if isinstance(s.default, tuple) else s.default  # as TOML writes a list
        console.print(f"- {s.name} = {default!r} ({escape(s.unit)}): {escape(s.help)}", highlight=False)


if __name__ == "__main__":
    app()
