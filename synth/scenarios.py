"""The fixture catalogue: one healthy run and runs with one cause each, and the rules each must fire."""

from __future__ import annotations

from dataclasses import replace

from synth import deepspeed, host, incidents
from synth.fabric import FabricPort
from synth.kineto import Job, ProfilerTraces
from synth.nccl import Host, Version
from synth.pytorch import Work
from synth.runs import Cause, CounterDumps, IbRetryExceeded, Scenario, Training, WatchdogTimeout

NODE01 = Host("node01", "10.0.0.1", env=(("NCCL_SOCKET_IFNAME", "eth0"),))
NODE02 = replace(NODE01, name="node02", ip="10.0.0.2")


def pair(**changes) -> tuple[Host, Host]:
    """node01 and node02, both changed the same way."""
    return replace(NODE01, **changes), replace(NODE02, **changes)


HANG = Work(seq=1583, op_type="ALLREDUCE", numel=262_668_288)

SCENARIOS = (
    Scenario(
        name="healthy-2node-ib",
        description="A healthy 2-node x 4-GPU data-parallel run: NCCL 2.21.5 over InfiniBand with GPUDirect RDMA "
        "between nodes and P2P/IPC inside each node, then 200 uneventful training steps. No rule may fire.",
        rules=(),
        hosts=pair(),
        story=(Training(),),
    ),
    Scenario(
        name="socket-fallback",
        description="node02 finds no IB device (`NET/IB : No device found.`) and falls back to TCP sockets "
        "(`Using network Socket`), while node01 uses IB: one communicator mixes transports and every "
        "inter-node hop touching node02 runs over NET/Socket.",
        rules=("TL101", "TL103"),
        hosts=(NODE01, replace(NODE02, hcas=())),
        layout="debug-files",
        story=(Training(),),
    ),
    Scenario(
        name="ib-disabled-env",
        description="NCCL_IB_DISABLE=1 is set on every rank of both nodes (echoed by NCCL), so all inter-node "
        "channels run over NET/Socket on eth0 although the IB HCAs are there.",
        rules=("TL101", "TL102"),
        hosts=pair(env=(("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_DISABLE", "1"))),
        story=(Training(),),
    ),
    Scenario(
        name="gdr-off",
        description="A 2-node x 8-GPU H100-like run (NCCL 2.23.4, 8 HCAs) where GPUDirect RDMA is unavailable "
        "(nvidia-peermem not loaded): NET subsystem logging (NCCL_DEBUG_SUBSYS=INIT,NET) shows `GPU Direct RDMA "
        "Disabled` for every HCA and the IB channels carry no /GDRDMA, so traffic bounces through host memory.",
        rules=("TL104",),
        hosts=pair(
            gpus=8,
            version=Version("2.23.4", "12.6"),
            hcas=tuple(f"mlx5_{i}" for i in range(8)),
            gdr=False,
            p2p="P2P/CUMEM",
        ),
        layout="debug-files",
        story=(Training(),),
    ),
    Scenario(
        name="docker-iface",
        description="NCCL_SOCKET_IFNAME=docker0 makes NCCL bootstrap and carry inter-node traffic over the "
        "docker bridge (172.17.x) with TCP sockets, as no IB device is visible inside the containers.",
        rules=("TL101", "TL105"),
        hosts=(
            replace(NODE01, ip="172.17.0.1", iface="docker0", hcas=(), env=(("NCCL_SOCKET_IFNAME", "docker0"),)),
            replace(NODE02, ip="172.17.0.2", iface="docker0", hcas=(), env=(("NCCL_SOCKET_IFNAME", "docker0"),)),
        ),
        story=(Training(),),
    ),
    Scenario(
        name="version-skew",
        description="node01 runs NCCL 2.21.5 and node02 NCCL 2.18.3 (different container images); otherwise a "
        "healthy IB run. Each node also builds a node-local communicator, whose rank 0 prints its NCCL version, "
        "so both versions are visible.",
        rules=("TL106",),
        hosts=(NODE01, replace(NODE02, version=Version("2.18.3", "12.2"))),
        layout="debug-files",
        node_comms=True,
        story=(Training(),),
    ),
    Scenario(
        name="ib-retry-exceeded",
        description="A healthy IB init and 120 good steps, then the IB path between the nodes breaks: node02's "
        "proxy threads report completion errors status=12 (retry exceeded) from node01's address, followed by a "
        "cascade of status=5 (flushed) errors; ten minutes later every rank's PyTorch watchdog times out on the "
        "same ALLREDUCE. No socket or bootstrap failure is involved.",
        rules=("TL107", "TL108", "TL411"),
        hosts=pair(),
        layout="launcher",
        story=(Training(steps=120, every=40), IbRetryExceeded(host="node02", peer="node01"), WatchdogTimeout(HANG)),
    ),
    Scenario(
        name="watchdog-hang",
        description="A healthy IB init (NCCL 2.26.2) and 200 good steps, then a silent hang: with no NCCL "
        "warning at all, every rank's PyTorch watchdog times out on the same ALLREDUCE (same SeqNum).",
        rules=("TL108", "TL411"),
        hosts=pair(version=Version("2.26.2", "12.8")),
        story=(Training(), WatchdogTimeout(HANG)),
    ),
    Scenario(
        name="flaky-link",
        description="A healthy-looking IB run whose logs show nothing wrong, but perfquery dumps taken before and "
        "after the job show node02's mlx5_1 port accumulating symbol errors and link-error recoveries during it "
        "(a marginal cable or transceiver); every other port stays clean.",
        rules=("TL201",),
        hosts=pair(),
        story=(
            Training(),
            CounterDumps(
                ports=(
                    ("node01", (FabricPort("mlx5_0", lid=11), FabricPort("mlx5_1", lid=12))),
                    (
                        "node02",
                        (
                            FabricPort("mlx5_0", lid=21),
                            FabricPort(
                                "mlx5_1",
                                lid=22,
                                per_second={"SymbolErrorCounter": 37.0, "LinkErrorRecoveryCounter": 0.02},
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ),
)

SCENARIOS += deepspeed.scenarios(pair())  # DeepSpeed steps and config: healthy, a slow window, overlap_comm off
# Whole runs, every source at once, one injected cause each, over RoCE
ROCE_PAIR = pair(link_layer="RoCE", env=(("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_GID_INDEX", "3")))
SCENARIOS += incidents.scenarios(ROCE_PAIR)
SCENARIOS += host.scenarios(ROCE_PAIR)
# PyTorch profiler traces of every rank: a healthy run, and one where rank 2's forward pass is slower
SCENARIOS += (
    Scenario(
        name="profiler-healthy",
        description="A 2-node x 2-GPU data-parallel run profiled on every rank (torch.profiler, Kineto JSON): "
        "12 steps, the ranks arrive at each gradient all-reduce together and the first bucket's transfer runs "
        "beside the backward pass. No rule may fire.",
        rules=(),
        hosts=pair(gpus=2),
        story=(ProfilerTraces(Job(steps=12)),),
    ),
    Scenario(
        name="profiler-straggler",
        description="The same profiled run, but in steps 15-17 rank 2 (node02) spends 40 ms more in its forward "
        "pass: it starts every all-reduce of those steps last, and the three other ranks' NCCL kernels start "
        "40 ms earlier and wait for it.",
        rules=("TL431",),
        hosts=pair(gpus=2),
        story=(ProfilerTraces(Job(steps=12, late={2: dict.fromkeys(range(15, 18), 40.0)})),),
        cause=Cause("TL431", hosts=("node02",), span="slow", ranks=(2,), tolerance_s=0.5),
    ),
)
