"""The command's entry point: `tracelens --version` prints the one version there is, and importing
tracelens (as a library does) changes nothing process-wide, while running the command sets polars'
allocator before polars loads."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

import tracelens
from tracelens.cli import app


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_prints_the_packages_version(option):
    result = CliRunner().invoke(app, [option])
    assert result.exit_code == 0
    assert result.output == f"tracelens {tracelens.__version__}\n"


def test_the_installed_metadata_carries_the_same_version():
    assert version("tracelens") == tracelens.__version__


def _python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_tracelens_leaves_the_environment_alone():
    """The package changes nothing; its modules nothing beyond what polars does when it loads (it
    writes its own allocator defaults in front of any given)."""
    seen = _python(
        "import json, os\n"
        "def changed(before):\n"
        "    return sorted(k for k in os.environ.keys() | before.keys() if os.environ.get(k) != before.get(k))\n"
        "before = dict(os.environ)\n"
        "import tracelens\n"
        "package = changed(before)\n"
        "import polars\n"
        "before = dict(os.environ)\n"
        "import tracelens.analyze, tracelens.cli, tracelens.__main__, tracelens.rules\n"
        "tracelens.rules.all_rules()\n"
        "print(json.dumps({'package': package, 'modules': changed(before)}))"
    )
    assert seen == {"package": [], "modules": []}


def test_the_command_sets_the_allocator_before_polars_loads():
    seen = _python(
        "import json, os, sys; os.environ.pop('_RJEM_MALLOC_CONF', None)\n"
        "from tracelens.__main__ import main\n"
        "loaded = 'polars' in sys.modules\n"
        "sys.argv = ['tracelens', '--version']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps({'polars_before': loaded, 'polars_after': 'polars' in sys.modules,\n"
        "                  'conf': os.environ.get('_RJEM_MALLOC_CONF')}))"
    )
    assert seen["polars_before"] is False and seen["polars_after"] is True
    # polars puts its defaults first and what it found after them: the command's setting wins
    assert seen["conf"].endswith(",narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0")
