"""--ray: ingest as Ray tasks gives the report a local run gives (a local Ray instance with 2 CPUs)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import FIXTURES
from tracelens.analyze import analyze
from tracelens.ingest import InputFile
from tracelens.ingest.textlog import ingest
from tracelens.report.summary import to_json


@pytest.fixture(scope="module")
def local_ray():
    # imported here, not at collection: every xdist worker collects this module, one runs its tests
    ray = pytest.importorskip("ray", reason="the Ray extra is not installed: pip install 'tracelens[ray]'")
    # a busy machine starts the raylet slowly: Ray's 30 s wait for it is an idle machine's
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_run_gives_the_local_report(local_ray, tmp_path):
    run = shutil.copytree(FIXTURES / "scenario-flaky-link", tmp_path / "run")
    local = to_json(analyze(run, jobs=1))
    on_ray = to_json(analyze(run, ray="auto"))
    assert local["findings"], "the fixture has findings to compare"
    assert on_ray == local
    assert [p.name for p in tmp_path.iterdir()] == ["run"], "the shared folder beside the run is removed"


def test_ray_chunk_tasks_give_the_local_tables(local_ray):
    from tracelens.scaleout import RayExecutor

    path = FIXTURES / "scenario-congestion" / "node01" / "train.log"
    source = InputFile(path, path.name, "log", size=path.stat().st_size)
    alone = ingest(source, jobs=1, chunk_bytes=16 << 10)
    on_ray = ingest(source, jobs=2, chunk_bytes=16 << 10, workers=RayExecutor())
    assert alone.account == on_ray.account
    assert sorted(alone.tables) == sorted(on_ray.tables)
    for name, frame in alone.tables.items():
        assert frame.equals(on_ray.tables[name]), name
