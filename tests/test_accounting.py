"""Input accounting that tells the truth: every line read is parsed, known but irrelevant (blank, or
recognised by a parser as noise) or unrecognised, over every fixture and the whole real corpus; a
file no parser claims is unrecognised, not irrelevant; a known format's header with unknown lines
after it is read as that format, the rest unrecognised."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FIXTURES, corpus_dir
from tests.helpers.fuzz import expected_lines
from tracelens.analyze import analyze
from tracelens.ingest import InputFile, ingest_file, sniff_format

FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
CORPUS_FOLDERS = ["nccl", "deepspeed", "perfquery", "host", "kineto", "pcap"]
WHOLE_FILES = {"pcap", "flight_recorder", "kineto", "ds_config", "config", "unreadable", "binary", "empty", "utf16"}


def _check_inputs(analysis, root: Path) -> list[str]:
    problems = []
    for row in analysis.tables["inputs"].iter_rows(named=True):
        counted = row["parsed"] + row["ignored"] + row["unrecognized"]
        if counted != row["lines"]:
            problems.append(f"{row['file']}: {row['lines']} read, {counted} counted")
        path = root / row["file"]
        if row["format"] not in WHOLE_FILES and "!" not in row["file"] and path.is_file():
            if row["lines"] != expected_lines(path.read_bytes()):
                problems.append(f"{row['file']}: {row['lines']} lines read of {expected_lines(path.read_bytes())}")
        problems += [f"{row['file']}: {e}" for e in row["errors"] or [] if "could not be read" in e]
    return problems


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_fixture_line_is_parsed_irrelevant_or_unrecognised(analysis_of, folder: str):
    assert not _check_inputs(analysis_of(folder), FIXTURES / folder)


@pytest.mark.parametrize("folder", CORPUS_FOLDERS)
def test_every_corpus_line_is_parsed_irrelevant_or_unrecognised(folder: str):
    root = corpus_dir(folder)
    with analyze(root) as analysis:
        assert analysis.tables["inputs"].height > 0
        assert not _check_inputs(analysis, root)


def test_the_corpus_accounting_covers_every_corpus_folder():
    root = corpus_dir("")
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(CORPUS_FOLDERS)


def _account(tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    data = path.read_bytes()
    return sniff_format(data[:65536]), ingest_file(InputFile(path, name, sniff_format(data[:65536]), size=len(data)))


def test_a_file_no_parser_claims_is_unrecognised_not_irrelevant(tmp_path: Path):
    fmt, result = _account(tmp_path, "notes.txt", "the job was slow on tuesday\n\nwe restarted it\n")
    account = result.account
    assert fmt == "log" and (account.lines, account.parsed, account.ignored, account.unrecognized) == (3, 0, 1, 2)
    assert [line for line, _ in account.samples] == [1, 3]


def test_the_analyzers_colon_wording_is_read_and_the_run_is_readable(tmp_path: Path):
    """PyTorch's analyzer text as pasted in a public thread: `joining collective:` for `,` (13 lines,
    counted irrelevant before, and the run read "nothing readable")."""
    text = (
        "Not all ranks joining collective: sequence number: 31117\n"
        "internal record id: 31116\ngroup info: 0:default_pg\ncollective: nccl:_reduce_scatter_base\n"
        "missing ranks: {3, 4, 5, 6, 7}\ninput sizes: [[25690112]]\noutput sizes: [[3211264]]\n"
        "world size: 8\nexpected ranks: {0, 1, 2, 3, 4, 5, 6, 7}\ncollective state: scheduled\n"
        "collective stack trace:\n _reduce_scatter_base at /torch/distributed/distributed_c10d.py:3402\n"
        "step at /job/train.py:88\n"
    )
    fmt, result = _account(tmp_path, "fr.txt", text)
    assert fmt == "fr_analyzer" and result.account.parsed == result.account.lines == 13
    assert sorted(result.tables["fr_entries"]["rank"]) == [0, 1, 2]


@pytest.mark.parametrize(
    "name, header, fmt",
    [
        ("tests.log", "# nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20", "log"),
        ("smi.csv", "index, utilization.gpu [%], power.draw [W]", "nvidia_smi"),
        ("pq.txt", "# Port counters: Lid 3 port 1 (CapMask: 0x5A00)", "perfquery"),
        ("fr.txt", "Not all ranks joining collective, sequence number: 6", "fr_analyzer"),
    ],
)
def test_a_known_header_with_unknown_lines_after_it_is_read_as_its_format(tmp_path: Path, name, header, fmt):
    got, result = _account(tmp_path, name, f"{header}\nfoo bar baz\n??? 12 34\n\nthe end\n")
    account = result.account
    assert got == fmt and (account.lines, account.parsed, account.ignored, account.unrecognized) == (5, 1, 1, 3)
    with analyze(tmp_path / name) as analysis:
        assert analysis.readable  # never "nothing readable"


def test_the_terminal_names_all_three_counts(tmp_path: Path):
    import io

    from rich.console import Console

    from tracelens.report.terminal import print_summary

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text(
        "node01:100:100 [0] NCCL INFO Using network IB\n\nepoch 1 loss 0.5\nnode01:100:100 [0] NCCL INFO ???\n"
    )
    buffer = io.StringIO()
    with analyze(tmp_path / "run") as analysis:
        print_summary(Console(file=buffer, width=200), analysis, [])
    assert "4 lines or packets, 1 parsed, 1 known but irrelevant, 2 unrecognised." in buffer.getvalue()
