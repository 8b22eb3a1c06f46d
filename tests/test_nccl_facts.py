"""The NCCL set-up per host (tracelens.derived.nccl), read once for TL106, the report's NCCL section
and `tracelens diff`: all three say the same version, with the build kept apart."""

from __future__ import annotations

import shutil

from tests.helpers import NO_FINDINGS, corpus_dir, fire, tables_from
from tracelens.analyze import analyze
from tracelens.compare.facts import run_facts
from tracelens.derived import RunContext
from tracelens.derived.nccl import Version
from tracelens.report.sections import nccl as section


def _versions(*messages: tuple[str, str]):
    return tables_from(
        nccl_events=[
            {"host": host, "pid": i, "kind": "version", "message": message}
            for i, (host, message) in enumerate(messages)
        ]
    )


def test_a_version_lines_build_is_kept_apart_from_the_version():
    tables = _versions(
        ("node01", "NCCL version 2.21.5+cuda12.4"),
        ("node02", "NCCL version 2.18.1a0+cuda12.1"),
        ("node03", "NCCL version 2.8.3+cudaCUDA_MAJOR.CUDA_MINOR"),
        ("node04", "NCCL version 2.10.3"),
        ("node05", "NCCL version 2.7.8+cuda11.1`"),  # pasted inside a Markdown code span
        ("node06", "NCCL version 2.`)"),  # cut short: no version
    )
    rows = RunContext(tables).nccl_versions.select("host", "version", "build").rows()
    assert rows == [
        ("node01", "2.21.5", "+cuda12.4"),
        ("node02", "2.18.1", "a0+cuda12.1"),
        ("node03", "2.8.3", "+cudaCUDA_MAJOR.CUDA_MINOR"),
        ("node04", "2.10.3", ""),
        ("node05", "2.7.8", "+cuda11.1"),
    ]


def test_builds_for_other_cuda_versions_are_one_nccl_version():
    same = _versions(("node01", "NCCL version 2.21.5+cuda12.4"), ("node02", "NCCL version 2.21.5+cuda12.1"))
    assert [f.title for f in fire(same, "TL106")] == []
    other = _versions(("node01", "NCCL version 2.21.5+cuda12.4"), ("node02", "NCCL version 2.9.9+cuda12.4"))
    (finding,) = fire(other, "TL106")
    assert finding.summary == "2 NCCL versions: 2.9.9 on node02; 2.21.5 on node01."  # in release order


def test_a_hosts_versions_sort_by_number_not_text():
    ctx = RunContext(_versions(("node01", "NCCL version 2.10.3"), ("node01", "NCCL version 2.9.6")))
    (host,) = ctx.nccl_hosts
    assert host.versions == (Version("2.9.6", ""), Version("2.10.3", ""))
    assert run_facts(ctx).filter(key="NCCL version")["value"].to_list() == ["2.9.6, 2.10.3"]


def test_settings_are_read_without_the_period_of_nccls_sentence_everywhere():
    tables = tables_from(
        nccl_events=[
            {"host": "node01", "pid": 1, "kind": "env_set", "message": "NCCL_NET set by environment to Socket."}
        ],
        nccl_env=[{"host": "node01", "pid": 1, "name": "NCCL_NET", "value": "Socket."}],
    )
    ctx = RunContext(tables)
    (host,) = ctx.nccl_hosts
    assert host.settings == (("NCCL_NET", "Socket"),)
    assert section.context(ctx, NO_FINDINGS)["hosts"][0]["settings"] == [{"name": "NCCL_NET", "value": "Socket"}]
    assert run_facts(ctx).filter(area="NCCL setting")["value"].to_list() == ["Socket"]


def test_rules_report_and_diff_say_the_same_version_of_real_logs(tmp_path):
    """Real logs whose version lines carry a build (`NCCL version 2.21.5+cuda12.4`, `2.7.8+cuda11.1`
    behind a Ray prefix with ANSI colours), one host folder each."""
    corpus = corpus_dir("nccl")
    for host, name in [
        ("node01", "019_nccl1504_docker_v2215_bare_version.log"),
        ("node02", "028_nccltests227_v2215_irdma_roce_ibext_v8.log"),
        ("node03", "032_pytorch68893_ray_ansi_prefix_v278_socket.log"),
    ]:
        (tmp_path / host).mkdir()
        shutil.copy(corpus / name, tmp_path / host / name)
    analysis = analyze(tmp_path, jobs=1)
    ctx = analysis.context

    shown = {h["host"]: h["versions"] for h in section.context(ctx, analysis)["hosts"]}
    assert shown["node01"] == shown["node02"] == [{"version": "2.21.5", "build": "+cuda12.4"}]
    assert shown["node03"] == [{"version": "2.7.8", "build": "+cuda11.1"}]

    compared = run_facts(ctx).filter(key="NCCL version")
    assert dict(compared.select("host", "value").iter_rows()) == {
        "node01": "2.21.5",
        "node02": "2.21.5",
        "node03": "2.7.8",
    }

    (skew,) = [f for f in analysis.findings if f.title == "NCCL versions differ across the run"]
    assert skew.summary == "2 NCCL versions: 2.7.8 on node03; 2.21.5 on node01, node02."
    assert {e.text for e in skew.evidence} == {"NCCL version 2.21.5+cuda12.4", "NCCL version 2.7.8+cuda11.1"}
