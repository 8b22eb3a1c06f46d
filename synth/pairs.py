"""Pairs of runs for `tracelens diff`: one healthy 4-node job, and the same job with one change each.

Every run is a scenario of its own (its own seed, so its step-time jitter is its own, as a rerun's
is); they are written side by side under `fixtures/pairs/`, with `pairs.json` naming, for each
pair, the change that must rank first (or none, for a rerun of the healthy job).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from synth.deepspeed import DeepSpeedTraining, DsConfig, Phases
from synth.fabric import FabricPort
from synth.nccl import Host, Version
from synth.runs import CounterDumps, Scenario, write

HOSTS = tuple(Host(f"node0{i}", f"10.0.0.{i}", gpus=2, env=(("NCCL_SOCKET_IFNAME", "eth0"),)) for i in range(1, 5))
PHASES = Phases(fwd=280.0, bwd_inner=620.0, bwd_allreduce=90.0, allgather=110.0, gradients=15.0, optimizer=65.0)
# What each change below costs the all-reduce: enough to make the steps communication-bound (TL402).
SLOWER_ALLREDUCE = replace(PHASES, bwd_allreduce=420.0)


def _ports(half_rate: str | None = None) -> CounterDumps:
    """ibstat and perfquery before and after the job on every host; `half_rate` trained at 200 Gb/s."""
    return CounterDumps(
        ports=tuple(
            (h.name, tuple(FabricPort(ca, lid=10 * i + k, rate=200 if f"{h.name}:{ca}" == half_rate else 400)
                           for k, ca in enumerate(h.hcas, start=1)))
            for i, h in enumerate(HOSTS, start=1)
        )
    )  # fmt: skip


def _run(name: str, description: str, hosts: tuple[Host, ...] = HOSTS, phases: Phases = PHASES,
         config: DsConfig = DsConfig(), half_rate: str | None = None,
         rules: tuple[str, ...] = ()) -> Scenario:  # fmt: skip
    story = (DeepSpeedTraining(steps=100, phases=phases, config=config, every_rank=True), _ports(half_rate))
    return Scenario(name=name, description=description, rules=rules, hosts=hosts, story=story)


def _on(hosts: tuple[str, ...], **changes) -> tuple[Host, ...]:
    return tuple(replace(h, **changes) if h.name in hosts else h for h in HOSTS)


@dataclass(frozen=True)
class Pair:
    good: str
    bad: str
    top: tuple[str, str] | None  # (area, what) of the change that must rank first; None: nothing significant


RUNS = (
    _run(
        "healthy",
        "A healthy 4-node x 2-GPU DeepSpeed ZeRO-2 job over InfiniBand with GPUDirect RDMA, "
        "every rank logging its timers, ports at 400 Gb/s. The good run of every pair.",
    ),
    _run(
        "healthy-rerun",
        "The same healthy job run again: only the step-time jitter differs. Nothing may rank "
        "as a significant change against `healthy`.",
    ),
    _run(
        "nccl-version-bump",
        "The healthy job after a container update moved NCCL from 2.21.5 to 2.23.4 on "
        "every host, and the all-reduce got slower with it.",
        hosts=tuple(replace(h, version=Version("2.23.4", "12.6")) for h in HOSTS),
        phases=SLOWER_ALLREDUCE,
        rules=("TL402",),
    ),  # fmt: skip
    _run(
        "gdr-lost",
        "node03 and node04 came back from maintenance without nvidia-peermem: their inter-node "
        "channels run NET/IB without GPUDirect RDMA, and the all-reduce slows.",
        hosts=_on(("node03", "node04"), gdr=False),
        phases=SLOWER_ALLREDUCE,
        rules=("TL104", "TL402"),
    ),  # fmt: skip
    _run(
        "port-half-rate",
        "node02's mlx5_1 came back from repair trained at 200 Gb/s instead of 400 Gb/s "
        "(ibstat `Rate: 200`); the all-reduce slows.",
        half_rate="node02:mlx5_1",
        phases=SLOWER_ALLREDUCE,
        rules=("TL205", "TL402"),
    ),
    _run(
        "overlap-comm-off",
        "Someone set `overlap_comm: false` in ds_config.json: under ZeRO-2 the gradient "
        "reduction now waits for the backward pass.",
        config=DsConfig(overlap_comm=False),
        phases=SLOWER_ALLREDUCE,
        rules=("TL402", "TL501"),
    ),  # fmt: skip
    _run(
        "socket-some-hosts",
        "A new image lost the IB devices on node03 and node04 (`NET/IB : No device found.`): "
        "NCCL falls back to TCP sockets there and every collective slows.",
        hosts=_on(("node03", "node04"), hcas=()),
        phases=SLOWER_ALLREDUCE,
        rules=("TL101", "TL103", "TL402"),
    ),  # fmt: skip
)

PAIRS = (
    Pair("healthy", "healthy-rerun", None),
    Pair("healthy", "nccl-version-bump", ("NCCL", "NCCL version")),
    Pair("healthy", "gdr-lost", ("NCCL", "inter-node transport")),
    Pair("healthy", "port-half-rate", ("fabric", "port mlx5_1:1 rate")),
    Pair("healthy", "overlap-comm-off", ("DeepSpeed config", "zero_optimization.overlap_comm")),
    Pair("healthy", "socket-some-hosts", ("NCCL", "inter-node transport")),
)


def write_pairs(root: Path) -> Path:
    """Write every run of RUNS and pairs.json under `root`/pairs."""
    folder = root / "pairs"
    for scenario in RUNS:
        write(scenario, folder)
    expected = {
        "synthetic": True,
        "pairs": [
            {"good": p.good, "bad": p.bad, "top": None if p.top is None else {"area": p.top[0], "what": p.top[1]}}
            for p in PAIRS
        ],
    }
    (folder / "pairs.json").write_text(json.dumps(expected, indent=2) + "\n", encoding="utf-8")
    lines = [f"- `{p.bad}` against `{p.good}`: "
             + (f"{p.top[0]} {p.top[1]} ranks first" if p.top else "no significant change")
             for p in PAIRS]  # fmt: skip
    (folder / "README.md").write_text(
        "# Run pairs for `tracelens diff`: synthetic\n\n"
        "Synthetic: written by the project's generator (`synth/pairs.py`,"
        " run by `python -m synth fixtures/`); no real log went into them.\n"
        "Each folder is a whole run with its own README. The pairs and the change that must rank first:\n\n"
        + "\n".join(lines)
        + "\n",
        encoding="utf-8",
    )
    return folder
