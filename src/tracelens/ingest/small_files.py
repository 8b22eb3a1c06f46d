"""Many small text logs read as one: a folder of per-rank logs (4,096 for a 512-node job).

Read one by one, a small log costs what its polars calls and parser set-up cost,
whatever its size. Here a batch of small logs is read into one frame whose lines are keyed by
file and line (lines.FILE_SHIFT), with an empty row before each file so that nothing the NCCL
parser looks at across lines (a wrapped record, the blank line before a WARN, a `Last error:`
quote on the next line) reaches into another file. Each line parser reads the batch once (those
with candidates only the files with a line of theirs: a launcher log mixes DeepSpeed and NCCL lines);
its rows are given back their file, line and host by key, and each file's account is counted from its
own lines' statuses, each line taking the strongest claim. A parser keeps what it carries from line
to line per file (a stack's thread, an nccl-tests run, a DeepSpeed step's stream, a rank from the
file's name). Rows come back in file order, each file's as if it had been read alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tracelens.ingest import (
    SAMPLE_LIMIT,
    Account,
    Format,
    IngestResult,
    InputFile,
    LineParser,
    find_format,
    line_formats,
    past_zeros,
)
from tracelens.ingest.text.lines import (
    IGNORED,
    LINE_MASK,
    PARSED,
    UNRECOGNIZED,
    file_of,
    read_keyed,
    settled,
    strongest_claim,
)

SMALL_BYTES = 1 << 20  # a file this small is one chunk for textlog too
BATCH_BYTES = 16 << 20
BATCH_FILES = 4096


def is_small_log(source: InputFile) -> bool:
    return source.format == "log" and source.error is None and 0 < source.size <= SMALL_BYTES


def work_items(files: list[InputFile]) -> list[list[InputFile]]:
    """The files in order as units of work: runs of small files in batches (a node folder's small
    captures, counter dumps and configs between its logs do not end a run: a batch reads them
    alone, in its unit), every big file alone."""
    items: list[list[InputFile]] = []
    run: list[InputFile] = []
    size = 0
    for source in files:
        if source.size > SMALL_BYTES:
            items.extend([run] if run else [])
            items.append([source])
            run, size = [], 0
            continue
        if run and (size + source.size > BATCH_BYTES or len(run) >= BATCH_FILES):
            items.append(run)
            run, size = [], 0
        run.append(source)
        size += source.size
    items.extend([run] if run else [])
    return items


@dataclass
class BatchResult:
    """A batch's tables (every row with its own file, line and host), each read file's account and
    hosts, and the files left to the per-file path."""

    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    accounts: dict[str, tuple[Account, list[str]]] = field(default_factory=dict)  # file name -> (account, hosts)
    per_file: list[InputFile] = field(default_factory=list)  # read alone: not a small log, or not readable now


def _lines(files: list[InputFile]) -> tuple[pl.DataFrame, list[InputFile]]:
    """Columns idx (file in batch), line (key), text: each small log's lines as lines.read_keyed gives
    them. The other files, and logs that cannot be read now, are returned apart."""
    lines, unread = read_keyed({i: source.path for i, source in enumerate(files) if is_small_log(source)})
    unread += [i for i, source in enumerate(files) if not is_small_log(source)]
    return lines, [files[i] for i in sorted(unread)]


def ingest(files: list[InputFile]) -> BatchResult:
    """Read a batch of small logs as one (see the module's docstring), and the small files of each
    format that batches (fabric dumps, kernel logs) at once. A file that begins with zero bytes is
    read as the format after them, as read alone, with the note that says so."""
    notes: dict[str, str] = {}
    files = [_past_zeros(source, notes) for source in files]
    lines, unread = _lines(files)
    result = BatchResult()
    hosts: list[pl.DataFrame] = []
    accounts: dict[int, Account] = {}
    if lines.height:
        # the line formats any line may be of (NCCL's) read the whole batch; the others only the files
        # with a line of theirs (_other_parsers)
        batch = InputFile(path=Path(), name="", format="log")
        parsers = [fmt.open(batch) for fmt in line_formats() if not fmt.candidates]
        lines = lines.with_columns(status=strongest_claim([p.feed(lines.select("line", "text")) for p in parsers]))
        result.tables = _keyed_back(_finished(parsers), files, hosts)
        lines = _other_parsers(files, lines, result, hosts)
        accounts = _accounts(lines)
    result.per_file = _batched_formats(files, unread, result, accounts, hosts)
    named: dict[int, list[str]] = {}
    if hosts:
        for idx, host in pl.concat(hosts).unique().sort("host").iter_rows():
            named.setdefault(idx, []).append(host)
    for idx, account in sorted(accounts.items()):
        account.notes += [notes[files[idx].name]] if files[idx].name in notes else []
        result.accounts[files[idx].name] = (account, named.get(idx, []))
    return result


def _past_zeros(source: InputFile, notes: dict[str, str]) -> InputFile:
    """A file that begins with zero bytes as the format after them (its note in `notes`); an error
    it cannot be read past is left for the file read alone to say."""
    if source.format != "zeros" or source.error is not None:
        return source
    try:
        past, note = past_zeros(source)
    except OSError:
        return source
    if past.error is None and note:
        notes[source.name] = note
        return past
    return source


def _keyed_back(parsed: IngestResult, files: list[InputFile], hosts: list[pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """A batch parser's tables with each row's file and line number in it from its line key, and its
    host (_hinted)."""
    names = pl.Series([f.name for f in files], dtype=pl.String)
    tables = {}
    for name, table in parsed.tables.items():
        frame = table.lazy().collect()
        idx = frame.select(file_of(pl.col("line"))).to_series()
        frame = frame.with_columns(file=names.gather(idx), line=pl.col("line") & LINE_MASK)
        tables[name] = _hinted(frame, idx, files, hosts)
    return tables


def _hinted(frame: pl.DataFrame, idx: pl.Series, files: list[InputFile], hosts: list[pl.DataFrame]) -> pl.DataFrame:
    """The rows (of the files at `idx` in the batch) with the host their file's folder suggests where
    they name none, as a file read alone gets it; the hosts the rows name go to `hosts`."""
    if "host" not in frame.columns:
        return frame
    hints = pl.Series([f.host_hint for f in files], dtype=pl.String)
    frame = frame.with_columns(host=pl.coalesce("host", hints.gather(idx)))
    hosts.append(_named_hosts(frame, idx))
    return frame


def _batched_formats(
    files: list[InputFile],
    unread: list[InputFile],
    result: BatchResult,
    accounts: dict[int, Account],
    hosts: list[pl.DataFrame],
) -> list[InputFile]:
    """Of the files `unread` as logs, each format's that batches, read at once (Format.read_batch):
    their rows, hosts and accounts added to the batch's. The files left to be read alone are returned."""
    place = {f.name: i for i, f in enumerate(files)}
    groups: dict[Format, list[InputFile]] = {}
    left: list[InputFile] = []
    for source in unread:
        fmt = find_format(source.format) if source.error is None else None
        (groups.setdefault(fmt, []) if fmt is not None and fmt.batches else left).append(source)
    for fmt, group in groups.items():
        try:
            batch = fmt.read_batch(group)
        except Exception:  # each file read alone says what is wrong with it, and the rest are read
            left += group
            continue
        tables = {
            table: _hinted(frame, frame["file"].replace_strict(place, return_dtype=pl.Int64), files, hosts)
            for table, frame in batch.tables.items()
        }
        result.tables = in_file_order([result.tables, tables], files)
        accounts.update((place[file], account) for file, account in batch.accounts.items())
    return sorted(left, key=lambda source: place[source.name])


def in_file_order(tables: list[dict[str, pl.DataFrame]], files: list[InputFile]) -> dict[str, pl.DataFrame]:
    """Each table's rows from several results, in the order of their files (stable within a file)."""
    order = {f.name: i for i, f in enumerate(files)}
    names = dict.fromkeys(name for result in tables for name in result)
    return {
        name: pl.concat([result[name].lazy() for result in tables if name in result], how="diagonal_relaxed")
        .sort(pl.col("file").replace_strict(order, return_dtype=pl.Int64), maintain_order=True)
        .collect()
        for name in names
    }


def _named_hosts(frame: pl.DataFrame, idx: pl.Series | pl.Expr) -> pl.DataFrame:
    """(idx, host) of the hosts the rows name, `idx` their file in the batch."""
    named = frame.select(idx.alias("idx"), pl.col("host").cast(pl.String))
    return named.filter(pl.col("host") != "").unique()


def _other_parsers(files: list[InputFile], lines: pl.DataFrame, result: BatchResult, hosts: list) -> pl.DataFrame:
    """The line formats with candidates (all but NCCL's), each with one parser on the files of the
    batch it may claim, as NCCL's reads the whole batch; their rows keyed back to their files. Each
    line's status becomes its strongest claim."""
    text = pl.col("text")
    formats = [fmt for fmt in line_formats() if fmt.candidates]
    others = pl.any_horizontal(text.str.contains(p) for fmt in formats for p in fmt.candidates)
    claimed = sorted(lines.filter(others)["idx"].unique().to_list())
    if not claimed:
        return lines
    together = lines.filter(pl.col("idx").is_in(claimed))  # each file after its empty row
    parsers = [fmt.open(InputFile(path=Path(), name="", format="log"), files=files) for fmt in formats]
    claim = _claims(parsers, together.select("line", "text"), together["line"])
    result.tables = in_file_order([result.tables, _keyed_back(_finished(parsers), files, hosts)], files)
    return lines.join(claim, on="line", how="left", maintain_order="left").select(
        "idx", "line", "text", status=pl.max_horizontal("status", "claim")
    )


def _claims(parsers: list[LineParser], chunk: pl.DataFrame, keys: pl.Series) -> pl.DataFrame:
    """Each line's strongest claim by `parsers` fed `chunk`, by its key in the batch."""
    return pl.DataFrame({"line": keys, "claim": strongest_claim([p.feed(chunk) for p in parsers])})


def _finished(parsers: list[LineParser]) -> IngestResult:
    """What `parsers` read, once every chunk was fed."""
    parsed = IngestResult()
    for parser in parsers:
        parser.finish(parsed)
    return parsed


def _accounts(lines: pl.DataFrame) -> dict[int, Account]:
    """Each log's account (by its place in the batch) from its lines' statuses (the empty rows between
    files are no lines)."""
    lines = lines.filter((pl.col("line") & LINE_MASK) > 0).with_columns(
        claimed=pl.col("status"), status=settled(pl.col("status"), pl.col("text"))
    )
    counts = lines.group_by("idx").agg(
        lines=pl.len(),
        parsed=(pl.col("status") == PARSED).sum(),
        unrecognized=(pl.col("status") == UNRECOGNIZED).sum(),
        ignored=(pl.col("status") == IGNORED).sum(),
    )
    # samples as textlog keeps them: the lines a parser came close to first
    bad = (
        lines.filter(pl.col("status") == UNRECOGNIZED)
        .sort("idx", pl.col("claimed") != UNRECOGNIZED, "line")
        .group_by("idx", maintain_order=True)
        .head(SAMPLE_LIMIT)
    )
    samples: dict[int, list[tuple[int, str]]] = {}
    for idx, line, text in bad.select("idx", pl.col("line") & LINE_MASK, "text").iter_rows():
        samples.setdefault(idx, []).append((line, text))
    accounts = {}
    for idx, n, n_parsed, n_unrecognized, n_ignored in counts.iter_rows():
        accounts[idx] = Account(lines=n, parsed=n_parsed, unrecognized=n_unrecognized, ignored=n_ignored)
        accounts[idx].add_samples(samples.get(idx, []))
    return accounts
