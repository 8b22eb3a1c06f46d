"""--ray when there is no cluster to use: `auto` starts a local Ray instance and says so in the report;
an address where nothing (or no Ray head) answers, a malformed one, or a missing extra is one line and
exit 2, said at once, never "internal error".

Its own module: test_ray.py keeps a local Ray instance for its module, and here none may be running."""

from __future__ import annotations

import socket
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracelens import scaleout
from tracelens.cli import app

runner = CliRunner()


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "nccl.log").write_text("node01:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
    return folder


def _refused_address() -> str:
    """host:port of a port that was free a moment ago: a connection there is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    return " ".join(result.output.split())


def test_an_address_where_nothing_answers_is_a_one_line_error(run: Path, tmp_path: Path):
    pytest.importorskip("ray", reason="the Ray extra is not installed: pip install 'tracelens[ray]'")
    address = _refused_address()
    result = runner.invoke(app, ["analyze", str(run), "--ray", address, "-o", str(tmp_path / "r.html")])
    assert f"--ray {address}: nothing answers there" in _one_line_error(result)
    assert not (tmp_path / "r.html").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["run"], "the shared folder beside the run is removed"


def test_an_answer_that_is_no_ray_head_is_a_one_line_error(monkeypatch, run: Path, tmp_path: Path):
    # what Ray raises after ~20 s of retries when the port answers but is no GCS (an HTTP proxy, say)
    def init(address=None, **kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}\nmore")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(scaleout, "_answers", lambda address: None)
    result = runner.invoke(app, ["analyze", str(run), "--ray", "10.0.0.9:6379", "-o", str(tmp_path / "r.html")])
    said = _one_line_error(result)
    assert "--ray 10.0.0.9:6379: Failed to connect to Ray cluster at 10.0.0.9:6379; is that the head's" in said
    assert "more" not in said


@pytest.mark.parametrize("address", ["nonsense", "10.0.0.1:", ":6379", "10.0.0.1:port"])
def test_what_is_no_address_is_a_one_line_error(run: Path, tmp_path: Path, address: str):
    pytest.importorskip("ray", reason="the Ray extra is not installed: pip install 'tracelens[ray]'")
    result = runner.invoke(app, ["analyze", str(run), "--ray", address, "-o", str(tmp_path / "r.html")])
    assert f"--ray {address!r} is not an address" in _one_line_error(result)


def test_without_the_extra_ray_is_a_one_line_error(monkeypatch, run: Path, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = runner.invoke(app, ["analyze", str(run), "--ray", "auto", "-o", str(tmp_path / "r.html")])
    assert "--ray needs the Ray extra: pip install 'tracelens[ray]'" in _one_line_error(result)


def test_auto_with_no_cluster_starts_a_local_instance_and_says_so(monkeypatch):
    calls = []

    def init(address=None, **kwargs):
        calls.append(address)
        if address == "auto":
            raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, cluster_resources=lambda: {"CPU": 6.0})
    monkeypatch.setitem(sys.modules, "ray", fake)
    cpus, note = scaleout.connect("auto")
    assert calls == ["auto", None], "joins the cluster if there is one, else starts one here"
    assert cpus == 6
    assert note is not None and "started a local Ray instance (6 CPUs)" in note


def test_auto_on_a_cluster_joins_it_and_notes_nothing(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        is_initialized=lambda: False, init=lambda address=None, **kw: calls.append(address), cluster_resources=dict
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert scaleout.connect("auto") == (1, None)
    assert calls == ["auto"]
