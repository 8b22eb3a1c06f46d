"""CI runs what the README tells a contributor to run: the README's test command is, character for
character, the command .ci/run ends with, so neither can change without the other."""

from __future__ import annotations

import re

from tests.helpers import REPO


def test_the_readmes_test_command_is_the_last_command_of_ci_run():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [b.strip() for b in re.findall(r"^```[a-z]*\n(.*?)^```", readme, flags=re.DOTALL | re.MULTILINE)]
    (command,) = [b for b in blocks if "pytest" in b]
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    last = [line for line in ci_lines if line and not line.startswith("#")][-1]
    assert command == last, f"README's test command:\n{command}\nis not .ci/run's last command:\n{last}"
    assert command.endswith(".venv/bin/python -m pytest -q -n auto"), "the tests run on every core, as CI does"
