"""How the job's processes found each other (`rendezvous`): the c10d store's and the launchers'
lines, and the host addresses derived/hosts.py ties with them. The log lines here are synthetic,
written in the forms PyTorch's TCPStore, DeepSpeed's runner and DDP's logger print; the run folder
is a real lab run (fixtures/lab-matrix)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from lark import Lark

from tests.helpers import REPO, tables_from
from tracelens.analyze import analyze
from tracelens.derived.hosts import host_names, untied
from tracelens.ingest import InputFile, ingest_file
from tracelens.ingest.host.rendezvous import CLIENT, MASTER, SERVER
from tracelens.resources import grammar_text

LINES = [
    "[I1205 00:02:18.145505080 TCPStore.cpp:271] [c10d - debug] The server has started on port = 29511.",
    "[I1205 00:02:18.240089039 TCPStore.cpp:316] [c10d - debug] TCP client connected to host 10.99.0.1:29511",
    "[2025-01-02 15:45:22,160] [INFO] [runner.py:607:main] cmd = pdsh -S -f 1024 -w 10.0.0.1,10.0.0.2 cd /w; "
    "/usr/bin/python3 -u -m deepspeed.launcher.launch --world_info=eyJ9 --node_rank=%n --master_addr=10.0.0.1 "
    "--master_port=29500 train.py",
    "cmd=['pdsh', '-w', 'worker-0', '--node_rank=%n', '--master_addr=192.168.0.22', '--master_port=29500']",
    "[default0]:master_addr: 10.99.0.1",
    "export MASTER_ADDR=10.1.1.7",
    "+ torchrun --nnodes=2 --nproc-per-node=2 --master-addr=node-a.cluster --master-port=29400 train.py",
    "export PET_MASTER_ADDR=10.1.1.8",
    "[W1205 00:02:18.145723113 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
    "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81: FutureWarning: deprecated",
]
EXPECTED = [
    ("store_server", None, 29511),
    ("store_client", "10.99.0.1", 29511),
    ("master", "10.0.0.1", 29500),
    ("master", "192.168.0.22", 29500),
    ("master", "10.99.0.1", None),
    ("master", "10.1.1.7", None),
    ("master", "node-a.cluster", 29400),
    ("master", "10.1.1.8", None),
]


def _read(tmp_path: Path, lines: list[str]) -> pl.DataFrame:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    result = ingest_file(InputFile(path=path, name=path.name, format="log"))
    return result.tables["rendezvous"]


def test_store_and_master_lines_are_read_and_others_left(tmp_path):
    rows = _read(tmp_path, LINES)
    assert list(zip(rows["role"], rows["address"], rows["port"], strict=True)) == EXPECTED
    assert rows["line"].to_list() == list(range(1, len(EXPECTED) + 1))  # the c10d warnings are not the store's lines


def test_the_grammar_reads_what_the_regexes_find():
    parser = Lark(grammar_text("rendezvous"), parser="earley")
    for line, (role, address, port) in zip(LINES, EXPECTED, strict=False):
        found = (pl.Series([line]).str.extract(f"({pattern})", 1)[0] for pattern in (SERVER, CLIENT, MASTER))
        fragment = next(m for m in found if m)
        tree = parser.parse(fragment)
        tokens = {t.type: str(t) for t in tree.scan_values(lambda t: hasattr(t, "type"))}
        assert tree.data == role
        assert tokens.get("ADDRESS") == address and (role == "master" or int(tokens["PORT"]) == port)


def _lab_run() -> Path:
    run = REPO / "fixtures/lab-matrix/ds4z2ov-08-clock-skew"
    if not run.exists():
        pytest.skip("no lab matrix in fixtures/")
    return run


def test_a_gloo_run_ties_its_hosts_by_the_store_and_the_capture():
    """A real lab run over gloo: no NCCL lines, no interface listing. node-a started the store that
    every rank reached at 10.99.0.1; the capture runs between 10.99.0.1 and one other address."""
    analysis = analyze(_lab_run())
    assert analysis.context.host_names == {"10.99.0.1": "node-a", "10.99.0.2": "node-b"}
    assert untied(analysis.context.tables, analysis.context.host_names) == ""
    (link,) = [f for f in analysis.findings if f.rule_id == "TL410" and f.severity.label != "info"]
    assert link.hosts == ["node-a", "node-b"] and "on node-a and node-b" in link.title


def test_master_address_is_rank0s_host_and_a_loopback_ties_nothing():
    steps = [{"file": f"{h}/r.log", "host": h, "rank": r, "step": 1} for h, r in (("node-a", 0), ("node-b", 1))]
    master = [{"file": "node-b/r.log", "host": "node-b", "role": "master", "address": "10.0.0.1", "port": 29500}]
    assert host_names(tables_from(steps=steps, rendezvous=master)) == {"10.0.0.1": "node-a"}
    loopback = [dict(master[0], address="127.0.0.1")]
    named = [dict(master[0], address="node-a")]
    assert host_names(tables_from(steps=steps, rendezvous=loopback + named)) == {}


def test_a_store_without_clients_or_claimed_by_two_hosts_ties_nothing():
    steps = [{"file": f"{h}/r.log", "host": h, "rank": r, "step": 1} for h, r in (("node-a", 0), ("node-b", 1))]
    server = {"file": "node-a/r.log", "host": "node-a", "role": "store_server", "address": None, "port": 29511}
    client = {"file": "node-b/r.log", "host": "node-b", "role": "store_client", "address": "10.9.0.1", "port": 29511}
    assert host_names(tables_from(steps=steps, rendezvous=[server])) == {}
    assert host_names(tables_from(steps=steps, rendezvous=[server, client])) == {"10.9.0.1": "node-a"}
    other = dict(server, host="node-b", file="node-b/r.log")
    assert host_names(tables_from(steps=steps, rendezvous=[server, other, client])) == {}


def test_the_capture_s_other_end_is_the_host_that_only_rendezvoused():
    """Under DeepSpeed's default printing only rank 0 (node-a) logs steps; node-b's ranks still
    reached the store, so the run has two hosts and the capture's second address is node-b's."""
    steps = [{"file": "node-a/r.log", "host": "node-a", "rank": 0, "step": 1}]
    store = [
        {"file": "node-a/r.log", "host": "node-a", "role": "store_server", "address": None, "port": 29511},
        {"file": "node-b/r.log", "host": "node-b", "role": "store_client", "address": "10.9.0.1", "port": 29511},
    ]
    packets = [{"src": "10.9.0.1", "dst": "10.9.0.2", "frame": 1}, {"src": "10.9.0.2", "dst": "10.9.0.1", "frame": 2}]
    tables = tables_from(steps=steps, rendezvous=store, packets=packets)
    assert host_names(tables) == {"10.9.0.1": "node-a", "10.9.0.2": "node-b"}
    three = packets + [{"src": "10.9.0.3", "dst": "10.9.0.1", "frame": 3}]
    assert host_names(tables_from(steps=steps, rendezvous=store, packets=three)) == {"10.9.0.1": "node-a"}
