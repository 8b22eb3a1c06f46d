"""The `tracelens` command: thin on purpose; options in, analyze, print a summary."""

from __future__ import annotations

import json
import re
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracelens.analyze import Analysis, analyze, ingest_run
from tracelens.findings import Severity
from tracelens.rules import all_rules

app = typer.Typer(
    help="Find out why a distributed training run was slow or hung, from the logs, counter dumps "
    "and captures it left behind. Offline and deterministic.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
out = Console(stderr=True, soft_wrap=True)


class FailOn(str, Enum):
    never = "never"
    warning = "warning"
    critical = "critical"


SEVERITY_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow", Severity.INFO: "blue"}


def _split(values: list[str] | None) -> list[str]:
    return [v.strip().upper() for item in values or [] for v in item.split(",") if v.strip()]


def _require(path: Path) -> None:
    if not path.exists():
        out.print(f"[red]error:[/] {path}: no such file or folder")
        raise typer.Exit(2)


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


def _print_summary(analysis: Analysis) -> None:
    inputs = analysis.tables["inputs"]
    totals = {k: int(inputs[k].sum()) if inputs.height else 0 for k in ("lines", "parsed", "unrecognized")}
    out.print(
        f"Read {inputs.height} file(s): {totals['lines']:,} lines or packets, "
        f"{totals['parsed']:,} parsed, {totals['unrecognized']:,} unrecognised."
    )
    for row in inputs.filter(inputs["errors"].list.len() > 0).iter_rows(named=True):
        for err in row["errors"]:
            out.print(f"[red]error:[/] {escape(err)}", highlight=False)
    for note in analysis.notes:
        out.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if not analysis.readable:
        why = "no input contained evidence tracelens understands" if inputs.height else f"no file found in {analysis.target}"
        out.print(f"[red]Nothing readable:[/] {escape(why)}.")
        return
    if not analysis.findings:
        out.print(f"[green]No problem found[/] ({len(analysis.rules)} rules checked).")
        return
    table = Table(show_lines=False, header_style="bold")
    for col in ("Severity", "Rule", "Finding", "Hosts"):
        table.add_column(col)
    for f in analysis.findings:
        hosts = ", ".join(f.hosts[:4]) + (f" +{len(f.hosts) - 4}" if len(f.hosts) > 4 else "")
        table.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity.label}[/]", f.rule_id, f.summary, hosts)
    out.print(table)


@app.command("analyze")
def analyze_cmd(
    run: Annotated[Path, typer.Argument(help="A run folder, a single file, or an archive (.tar, .tar.gz, .tgz, .zip, .gz).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Where to write the HTML report. Default: ./tracelens-<run>.html")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the findings and input accounting as JSON.")] = None,
    tables_dir: Annotated[Optional[Path], typer.Option("--tables", help="Also write every parsed table as Parquet into this folder.")] = None,
    tz: Annotated[Optional[str], typer.Option("--tz", help="Time zone of log timestamps printed without one (e.g. Europe/Berlin). Default: found against a capture's UTC times, else UTC.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Files to ingest in parallel (worth it for runs of hundreds of MB).")] = 1,
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="Exit with status 1 when a finding at or above this severity fires.")] = FailOn.never,
    select: Annotated[Optional[list[str]], typer.Option("--select", help="Only these rules (ids or prefixes, comma separated), e.g. TL1,TL205.")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", help="Skip these rules (ids or prefixes, comma separated).")] = None,
) -> None:
    """Analyse a run and write the HTML report (exit 0 analysed, 1 findings at --fail-on, 2 nothing readable)."""
    from tracelens.report.html import write as write_html
    from tracelens.report.summary import to_json

    _require(run)
    _require_zone(tz)
    with _progress() as bar:
        task = bar.add_task("", total=None)

        def step(done: int, total: int, name: str) -> None:
            bar.update(task, completed=done, total=total, description=name[-60:])

        analysis = analyze(run, jobs=jobs, select=_split(select), ignore=_split(ignore), progress=step, tz=tz)
    _print_summary(analysis)
    report = output or Path(f"tracelens-{run.resolve().name.split('.')[0] or 'run'}.html")
    write_html(analysis, report)
    if json_path:
        json_path.write_text(json.dumps(to_json(analysis), indent=2, default=str), encoding="utf-8")
        out.print(f"JSON: {json_path}")
    if tables_dir:
        analysis.tables.write_parquet(tables_dir)
        out.print(f"Tables: {tables_dir}/")
    out.print(f"Report: [bold]{report}[/]", highlight=False)
    if not analysis.readable:
        raise typer.Exit(2)
    if fail_on is not FailOn.never and any(f.severity >= Severity.parse(fail_on.value) for f in analysis.findings):
        raise typer.Exit(1)


@app.command("tables")
def tables_cmd(
    run: Annotated[Path, typer.Argument(help="A run folder, file or archive.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the Parquet files (one per table, inputs included).")],
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1)] = 1,
) -> None:
    """Ingest only: write every table as Parquet, to query with polars or DuckDB."""
    _require(run)
    with tempfile.TemporaryDirectory(prefix="tracelens-") as workdir, _progress() as bar:
        task = bar.add_task("", total=None)
        tables, notes = ingest_run(run, Path(workdir), jobs=jobs, progress=lambda d, t, n: bar.update(task, completed=d, total=t, description=n[-60:]))
    for note in notes:
        out.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    written = tables.write_parquet(output)
    for path in written:
        out.print(f"{path}  ({tables[path.stem].height:,} rows)", highlight=False)


def _headline(text: str) -> str:
    """The first clause of a rule's description, for the catalogue (`tracelens rules ID` has it all)."""
    for stop in re.finditer(r"(?<=[^.])[.:;] |\.$", text):
        inside_quote = text.count("`", 0, stop.start()) % 2 == 1  # a `quoted log text`
        if not inside_quote and not re.search(r"\b(?:i\.e|e\.g)$", text[: stop.start()]):
            return text[: stop.start()]
    return text


@app.command("rules")
def rules_cmd(rule_id: Annotated[Optional[str], typer.Argument(help="A rule id, e.g. TL101, to show its documentation.")] = None) -> None:
    """Print the rule catalogue, or one rule's documentation."""
    console = Console()
    rules = all_rules()
    if rule_id is None:
        table = Table(header_style="bold")
        for col in ("Rule", "Name", "Severity", "What it finds"):
            table.add_column(col)
        for r in rules:
            table.add_row(r.id, r.name, r.severity.label, _headline(r.docs.get("What it finds", "")))
        console.print(table)
        return
    match = [r for r in rules if r.id == rule_id.upper()]
    if not match:
        out.print(f"[red]error:[/] no rule {rule_id!r}; `tracelens rules` lists them")
        raise typer.Exit(2)
    r = match[0]
    console.print(f"[bold]{r.id} {r.name}[/] (default severity {r.severity.label})\n")
    for title, body in r.docs.items():
        console.print(f"[bold]{title}[/]\n{body}\n")

