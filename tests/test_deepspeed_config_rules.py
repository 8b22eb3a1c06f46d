"""TL501-TL504: DeepSpeed settings that cost communication, from ds_config.json and the log's echo."""

from __future__ import annotations

import json

from synth.deepspeed import DsConfig, ds_config
from tracelens.analyze import analyze


def config_findings(tmp_path, cfg: DsConfig) -> dict[str, object]:
    (tmp_path / "node01").mkdir()
    (tmp_path / "node01" / "ds_config.json").write_text(json.dumps(ds_config(cfg), indent=2))
    return {f.rule_id: f for f in analyze(tmp_path).findings if f.rule_id.startswith("TL5")}


def test_overlap_comm_off_under_zero2_fires(tmp_path):
    found = config_findings(tmp_path, DsConfig(zero_stage=2, overlap_comm=False))
    assert set(found) == {"TL501"}
    (evidence,) = found["TL501"].evidence
    assert evidence.file == "node01/ds_config.json" and evidence.text == "zero_optimization.overlap_comm = false"
    assert '"overlap_comm": true' in found["TL501"].fix


def test_seed_style_config_fires_nothing(tmp_path):
    assert config_findings(tmp_path, DsConfig(zero_stage=2, overlap_comm=True, reduce_bucket_size=500_000_000)) == {}


def test_overlap_off_without_zero_is_not_a_finding(tmp_path):
    assert config_findings(tmp_path, DsConfig(zero_stage=0, overlap_comm=False)) == {}


def test_overlap_off_in_the_log_echo(analysis_of):
    (f,) = [f for f in analysis_of("ds-overlap-comm-off").findings if f.rule_id == "TL501"]
    assert {e.text for e in f.evidence} == {
        "zero_optimization.overlap_comm = False",
        "zero_optimization.overlap_comm = false",
    }


def test_small_bucket(tmp_path):
    found = config_findings(tmp_path, DsConfig(reduce_bucket_size=20_000_000))
    assert set(found) == {"TL502"} and "20,000,000" in found["TL502"].summary


def test_cpu_offload(tmp_path):
    found = config_findings(tmp_path, DsConfig(offload_optimizer="cpu"))
    assert set(found) == {"TL503"} and "offload_optimizer" in found["TL503"].summary
