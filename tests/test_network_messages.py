"""docs/nccl-network-messages.md is a spec: each example body parses into the kind of its row,
a WARN with it lands in nccl_errors with the row's error kind, and that error kind reaches the
row's rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tracelens.ingest import InputFile
from tracelens.ingest.nccl.log import parse_body
from tracelens.ingest.textlog import ingest
from tracelens.rules.failures import _FAILURE_KINDS, _GPU_KINDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "nccl-network-messages.md"

# error kind -> the rule that reports it (TL109/TL110 read their kinds from these constants)
RULE_OF = {
    "ib_completion": "TL107",
    "ib_async_event": "TL111",
    "ib_sm_event": "TL111",  # as information
    "ib_unavailable": "TL101",
    **{kind: "TL109" for kind in _FAILURE_KINDS},
    **{kind: "TL110" for kind in _GPU_KINDS},
    "foreign_connection": "TL109",  # as information
    "gdr_disabled": "TL104",  # aws-ofi-nccl's verdict, which TL104 reads from nccl_net
}


def _rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            body = re.match(r"`([^`]*)`", cells[0]).group(1)
            rows.append((body, cells[2], cells[3], cells[4]))
    return rows


ROWS = _rows()


def test_the_table_is_there():
    assert len(ROWS) >= 60


@pytest.mark.parametrize("body, kind, error_kind, rule", ROWS, ids=[r[0][:50] for r in ROWS])
def test_each_message_is_read_into_its_kind_and_rule(tmp_path: Path, body: str, kind: str, error_kind: str, rule: str):
    assert parse_body(body)[0] == kind
    if not error_kind:
        return
    log = tmp_path / "nccl.log"
    log.write_text(f"node01:100:101 [0] transport/net_ib.cc:100 NCCL WARN {body}\n")
    result = ingest(InputFile(path=log, name="nccl.log", format="log"))
    assert result.tables["nccl_errors"]["kind"].to_list() == [error_kind]
    assert RULE_OF[error_kind] == rule
