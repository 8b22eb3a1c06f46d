"""The command line never shows a traceback: usage problems are caught before the analysis, an
unexpected error is one line plus where its traceback went (exit 3), and a kill cleans up."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import tracelens.cli as cli
from tracelens.cli import INTERNAL_ERROR, app

REPO = Path(__file__).resolve().parents[1]
LOG = "node01:100:100 [0] NCCL INFO Using network IB\n"
runner = CliRunner()


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "nccl.log").write_text(LOG)
    return folder


def _no_traceback(result) -> str:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result.output


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_an_unknown_rule_id_is_a_usage_error_even_with_fail_on(run: Path, tmp_path: Path, option: str):
    result = runner.invoke(
        app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), option, "TL107,TL1O7", "--fail-on", "warning"]
    )
    assert result.exit_code == 2
    assert "no rule 'TL1O7'" in _no_traceback(result)
    assert not (tmp_path / "r.html").exists()  # stopped before the analysis


def test_a_rule_family_prefix_is_accepted(run: Path, tmp_path: Path):
    result = runner.invoke(
        app, ["analyze", str(run), "-o", str(tmp_path / "r.html"), "--select", "TL1", "--ignore", "TL107"]
    )
    assert result.exit_code == 0, result.output


def _analysis_never_runs(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the analysis ran before the output paths were checked")

    monkeypatch.setattr(cli, "analyze", boom)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-o", "{tmp}/missing/r.html"], "does not exist"),
        (["-o", "{tmp}"], "is a folder"),
        (["-o", ""], "empty path"),
        (["--json", "{tmp}/nope/x.json"], "does not exist"),
        (["--json", "{tmp}"], "is a folder"),
        (["--tables", "{tmp}/file.txt"], "is not a folder"),
        (["--tables", "{tmp}/file.txt/sub"], "is a file, not a folder"),
    ],
)
def test_bad_output_paths_are_refused_before_the_analysis(run: Path, tmp_path: Path, monkeypatch, args, message):
    (tmp_path / "file.txt").write_text("x")
    _analysis_never_runs(monkeypatch)
    argv = ["analyze", str(run)] + [a.format(tmp=tmp_path) for a in args]
    if "-o" not in args:
        argv += ["-o", str(tmp_path / "r.html")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in _no_traceback(result)


def test_tables_refuses_a_file_as_output_folder_and_exits_2_on_an_empty_folder(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    refused = runner.invoke(app, ["tables", str(tmp_path / "empty"), "-o", str(tmp_path / "file.txt")])
    assert refused.exit_code == 2 and "is not a folder" in _no_traceback(refused)
    empty = runner.invoke(app, ["tables", str(tmp_path / "empty"), "-o", str(tmp_path / "out")])
    assert empty.exit_code == 2 and "Nothing readable" in _no_traceback(empty)


class PanicException(BaseException):
    """What polars raises when its Rust code panics (memory running out in a callback): a BaseException."""


@pytest.mark.parametrize(
    "error", [KeyError("something internal\nsecond line"), PanicException("called `Result::unwrap()`: out of memory")]
)
def test_an_unexpected_error_of_any_type_exits_3_with_one_line_and_the_traceback_file(
    run: Path, tmp_path: Path, monkeypatch, error: BaseException
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "analyze", broken)
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == INTERNAL_ERROR != 1
    output = _no_traceback(result)
    (line,) = [text for text in output.splitlines() if "internal error" in text]
    assert f"internal error: {type(error).__name__}: " in line and "crash reports are kept there" in line
    where = Path(line.split("traceback written to ", 1)[1].split(" ", 1)[0])
    assert where.parent == tmp_path / "cache" / "tracelens" and where.is_file()
    assert type(error).__name__ in where.read_text() and "Traceback" in where.read_text()
    assert where.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device", "/tmp/tracelens-x/aligned/steps.parquet"),
        RuntimeError("IO error: failed to write: No space left on device (os error 28)"),
    ],
)
def test_a_full_disk_is_the_machine_s_state_exit_2_not_a_bug(run: Path, tmp_path: Path, monkeypatch, error):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "analyze", full)
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html")])
    output = _no_traceback(result)
    assert result.exit_code == 2 and "internal error" not in output and "no space left on the device" in output
    assert ("writing /tmp/tracelens-x/aligned/steps.parquet" in output) == isinstance(error, OSError)
    assert not (tmp_path / "cache").exists()  # no crash report: nothing to report


@pytest.mark.parametrize("how", ["option", "environment"])
def test_no_crash_report_writes_no_traceback_file_and_says_so(run: Path, tmp_path: Path, monkeypatch, how: str):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where a crash file would go without a cache
    (tmp_path / "tmp").mkdir()

    def broken(*args, **kwargs):
        raise KeyError("internal")

    monkeypatch.setattr(cli, "analyze", broken)
    argv = ["analyze", str(run), "-o", str(tmp_path / "r.html")]
    if how == "option":
        argv.append("--no-crash-report")
    else:
        monkeypatch.setenv("TRACELENS_NO_CRASH_REPORT", "1")
    result = runner.invoke(app, argv)
    assert result.exit_code == INTERNAL_ERROR
    assert "no traceback written" in _no_traceback(result)
    assert not list(tmp_path.rglob("crash-*")) and not list(tmp_path.rglob("tracelens-crash-*"))


def test_a_kill_inside_a_polars_callback_ends_the_run_with_the_signals_status(run: Path, tmp_path: Path, monkeypatch):
    """polars raises an exception from a callback again with its own text appended to the arguments:
    the status comes from the signal received, not from the exception."""

    def killed_in_callback(*args, **kwargs):
        def udf(value: int) -> int:
            if value == 3:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            return value

        pl.DataFrame({"a": list(range(10))}).select(pl.col("a").map_elements(udf, return_dtype=pl.Int64))

    monkeypatch.setattr(cli, "analyze", killed_in_callback)
    started = time.monotonic()
    result = runner.invoke(app, ["analyze", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in _no_traceback(result) and time.monotonic() - started < 5


WONT_STOP = """
import sys, time, typer
from tracelens.cli import _guarded
app = typer.Typer()

@app.command()
@_guarded
def main() -> None:
    import tempfile
    open(tempfile.mkstemp()[1], "w").write("x")
    print("ready", flush=True)
    try:
        time.sleep(60)
    except BaseException:  # swallowed, as code the signal interrupts may do
        time.sleep(60)

app()
"""


def test_a_run_that_does_not_unwind_is_ended_promptly_and_its_files_removed(tmp_path: Path):
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", WONT_STOP], env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - sent < cli._Stop.GRACE + 3
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_target_in_a_folder_the_user_cannot_enter_is_a_usage_error(tmp_path: Path, monkeypatch):
    locked = tmp_path / "locked"
    (locked / "run").mkdir(parents=True)
    if os.geteuid() == 0:  # root enters every folder: make the kernel's answer for a normal user
        real_stat = os.stat

        def denied(path, *args, **kwargs):
            if str(path).startswith(str(locked) + "/"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", denied)
        real_path_stat = Path.stat  # Python 3.10's Path.stat holds its own reference to os.stat

        def path_denied(self, *, follow_symlinks=True):
            if str(self).startswith(str(locked) + "/"):
                raise PermissionError(13, "Permission denied", str(self))
            return real_path_stat(self, follow_symlinks=follow_symlinks)

        monkeypatch.setattr(Path, "stat", path_denied)
    else:
        os.chmod(locked, 0o000)
    try:
        result = runner.invoke(app, ["analyze", str(locked / "run"), "-o", str(tmp_path / "r.html")])
    finally:
        os.chmod(locked, 0o700)
    assert result.exit_code == 2
    assert "cannot be opened: Permission denied" in _no_traceback(result)


def test_sigterm_and_sigint_remove_the_private_extraction_folder(tmp_path: Path):
    archive = tmp_path / "run.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        big = tmp_path / "big.log"
        big.write_text("node01:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n" * 300_000)
        for i in range(4):
            tar.add(big, f"node0{i}/nccl.log")
    for sig in (signal.SIGTERM, signal.SIGINT):
        tmp = tmp_path / f"tmp-{sig.name}"
        tmp.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracelens.cli", "analyze", str(archive), "-o", str(tmp_path / "r.html")],
            env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not list(tmp.glob("tracelens-*/**/x1/*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp.glob("tracelens-*")), "the run never started extracting"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err
        assert "Traceback" not in err and f"stopped by {sig.name}" in err
        assert list(tmp.iterdir()) == []
