"""Whole-run scenarios: every source at once (NCCL and DeepSpeed logs, counter dumps, a
capture), one injected cause each, and the top finding it must produce (`runs.Cause`).

The fabric is RoCE: NCCL lists its HCAs as `/RoCE`, the counters come from sysfs (the PMA
`counters/` perfquery would read, by name, and the mlx5 `hw_counters/`), captures are
RoCEv2 frames. Capture addresses are the hosts' NCCL addresses (`OOB eth0:<ip>`), as on
clusters whose RoCE netdevs carry the hosts' addresses, so tracelens can name the hosts.

Captures are sampled, as a capture loop on a busy port leaves them: every few seconds one
collective's worth of packets per queue pair, headers only (`tcpdump -s 64`), PSNs
continuing from burst to burst. Every source takes its times from the story spans the
training records (`Run.spans`), so a fault shows in logs, counters and packets at once.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace

from synth.deepspeed import DeepSpeedTraining, DsConfig, Phases
from synth.fabric import FabricPort
from synth.nccl import Host
from synth.pcap import RoceFaults, RoceQp, capture, roce_conversation, tcp_stream
from synth.pytorch import Work
from synth.runs import Cause, CounterDumps, Run, Scenario, WatchdogTimeout

SNAPLEN = 64  # Ethernet, IPv4, UDP, BTH and AETH fit
BIG = Phases(fwd=280.0, bwd_inner=620.0, bwd_allreduce=90.0, allgather=110.0, gradients=15.0, optimizer=65.0)  # 1.18 s


@dataclass(frozen=True)
class Relaunch:
    """After `pause_s` the job starts again on `hosts` as they are then: new processes, new log files."""

    hosts: tuple[Host, ...]
    pause_s: float = 90.0

    def play(self, run: Run) -> None:
        run.now += self.pause_s
        run.relaunch(self.hosts)


@dataclass(frozen=True)
class RoceCapture:
    """A sampled capture on `host`'s port `hca` during the story span "training": every `every_s`
    seconds `messages` SENDs on each queue pair from `peers` to `host`, meeting `faults` inside
    the story span `during`, and `background` in every `background_every`-th burst all run long
    (before, inside and after it: a real fabric's trickle of marks or drops, which a cause must
    rise above)."""

    host: str
    hca: str
    peers: tuple[str, ...]
    faults: RoceFaults = RoceFaults()
    during: str | None = None
    every_s: float = 10.0
    messages: int = 16
    qps_per_peer: int = 2
    background: RoceFaults = RoceFaults()
    background_every: int = 3

    def play(self, run: Run) -> None:
        ip = {h.name: h.ip for h in run.hosts}
        qps = [
            RoceQp(requester=ip[peer], responder=ip[self.host],
                   requester_qp=0x2A0 + 16 * p + q, responder_qp=0x4C0 + 16 * p + q,
                   first_psn=run.rand.int(0, 1 << 22), sport=run.rand.int(49152, 65000))
            for p, peer in enumerate(self.peers) for q in range(self.qps_per_peer)
        ]  # fmt: skip
        start, end = run.spans["training"]
        faulty = run.spans[self.during] if self.during else (end, start)
        packets = []
        for burst in range(int((end - start) // self.every_s) + 1):
            t = start + burst * self.every_s
            faults = self.faults if faulty[0] <= t <= faulty[1] else RoceFaults()
            if burst % self.background_every == 0:
                faults = RoceFaults(
                    *(tuple(sorted({*a, *b})) for a, b in zip(astuple(faults), astuple(self.background)))
                )
            for k, qp in enumerate(qps):
                at = run.utc(t).timestamp() + k * 0.0007
                qp = replace(qp, first_psn=qp.first_psn + burst * self.messages)
                packets += roce_conversation(qp, self.messages, faults, start=at)
        run.attach(f"{self.host}/capture-{self.host}-{self.hca}.pcap", capture(packets, SNAPLEN))


@dataclass(frozen=True)
class TcpCapture:
    """`tcpdump -i eth0 -s 64` on `host` for a moment in the middle of the story span "training":
    NCCL's socket connections from `peer`, `segments` each."""

    host: str
    peer: str
    connections: int = 2
    segments: int = 150

    def play(self, run: Run) -> None:
        ip = {h.name: h.ip for h in run.hosts}
        start, end = run.spans["training"]
        at = run.utc((start + end) / 2).timestamp()
        packets = []
        for k in range(self.connections):
            ports = (run.rand.int(32768, 60999), run.rand.int(32768, 60999))
            packets += tcp_stream(ip[self.peer], ip[self.host], self.segments, start=at + k * 0.0003, ports=ports)
        run.attach(f"{self.host}/capture-{self.host}-eth0.pcap", capture(packets, SNAPLEN))


def _ports(
    background: dict[str, dict[str, float]] | None = None, **faults: dict[str, float]
) -> tuple[tuple[str, tuple[FabricPort, ...]], ...]:
    """Both hosts' RoCE ports; `faults` maps `node02_mlx5_1` to that port's counter rises per second,
    `background` the same way to rises all run long."""
    return tuple(
        (host, tuple(
            FabricPort(ca, lid=0, link_layer="Ethernet", per_second=faults.get(f"{host}_{ca}", {}),
                       background=(background or {}).get(f"{host}_{ca}", {}))
            for ca in ("mlx5_0", "mlx5_1")
        ))
        for host in ("node01", "node02")
    )  # fmt: skip


def _dumps(background: dict[str, dict[str, float]] | None = None, **faults: dict[str, float]) -> CounterDumps:
    """sysfs counter dumps before, every minute during and after the job; rises during the span "slow"
    (and `background` rises all along)."""
    return CounterDumps(_ports(background, **faults), every_s=60.0, during="slow" if faults else None, tool="sysfs")


# What a real fabric shows when nothing is wrong (issue 10 part 8): a port's few symbol errors an
# hour (within the IB spec's bit error rate), a little PortXmitWait, a dropped packet or an ECN mark
# in a sampled capture now and then. The scenarios with a slow window carry it before, inside and
# after the window, so a cause is named for what rose in the window, not for what is there at all.
ERRORS_ALL_ALONG = {"SymbolErrorCounter": 0.02, "PortRcvErrors": 0.005}  # ~70 and ~20 an hour
WAITS_ALL_ALONG = {"PortXmitWait": 2e4, "np_ecn_marked_roce_packets": 3.0, "rp_cnp_handled": 3.0}
DROP_NOW_AND_THEN = RoceFaults(lost=(9,))  # one in 48 packets of a QP: a lossy-ish but working RoCE path
MARK_NOW_AND_THEN = RoceFaults(congested=(3,))


def _background(on: bool, **ports: dict[str, float]) -> dict[str, dict[str, float]]:
    return ports if on else {}


# A marginal link: the receiving port sees symbol errors and drops what they corrupt; its QPs NAK
# the gaps (out_of_sequence) and the sender goes back N (packet_seq_err on the other side).
def _flaky(receiver: str, sender: str, ca: str) -> dict[str, dict[str, float]]:
    return {
        f"{receiver}_{ca}": {"SymbolErrorCounter": 45.0, "LinkErrorRecoveryCounter": 0.03, "PortRcvErrors": 8.0,
                             "out_of_sequence": 8.0},
        f"{sender}_{ca}": {"packet_seq_err": 8.0},
    }  # fmt: skip


HANG = Work(seq=412, op_type="ALLREDUCE", numel=262_668_288)


def scenarios(hosts: tuple[Host, Host], background: bool = True) -> tuple[Scenario, ...]:
    """The whole-run scenarios on two RoCE hosts (`hosts`: node01, node02); `background`: the
    scenarios with a slow window carry a real fabric's usual errors, waits and drops all run long."""
    node01, node02 = hosts
    drops = DROP_NOW_AND_THEN if background else RoceFaults()
    slow_link = (
        DeepSpeedTraining(steps=160, phases=BIG, slow=(70, 109, 3.8)),
        _dumps(_background(background, node02_mlx5_1=ERRORS_ALL_ALONG), **_flaky("node02", "node01", "mlx5_1")),
        RoceCapture("node02", "mlx5_1", ("node01",), RoceFaults(lost=(5, 12)), during="slow", background=drops),
    )
    return (
        Scenario(
            name="scenario-healthy",
            description="Two RoCE hosts train 120 steps of 1.2 s with every source collected: NCCL INFO and "
            "DeepSpeed logs, sysfs counters every minute, a sampled capture on node02 mlx5_0. Nothing is wrong: "
            "no finding may be a warning or worse.",
            rules=(),
            hosts=hosts,
            story=(
                DeepSpeedTraining(steps=120, phases=BIG),
                _dumps(),
                RoceCapture("node02", "mlx5_0", ("node01",)),
            ),
        ),
        Scenario(
            name="scenario-flaky-link",
            description="A marginal link on node02 mlx5_1: during steps 70-109 its port counts symbol errors, "
            "a few link-error recoveries and receive errors (sysfs counters, dumped every minute), the capture on "
            "that port shows NAKs with PSN sequence errors on the QPs from node01 and go-back-N resends, node01's "
            "mlx5_1 counts the NAKs it received, and every step in the window takes 3.8x as long, all of it in the "
            "gradient all-reduce. NCCL logs nothing: the RC transport recovers every loss. Background all run long, "
            "window included: node02 mlx5_1 counts a few symbol and receive errors an hour, and the capture drops a "
            "packet now and then.",
            rules=("TL201", "TL204", "TL301", "TL401", "TL402", "TL410"),
            hosts=hosts,
            story=slow_link,
            cause=Cause("TL410", ("node02",), "slow", ports=("mlx5_1:1",), tolerance_s=10.0),
        ),
        Scenario(
            name="scenario-congestion",
            description="Fabric congestion on rail 0 (a spine link the job shares): from step 60 to 150 steps grow "
            "slower over 20 steps to 2.2x, all in the all-reduce, and samples/s drops; node01's and node02's mlx5_0 "
            "ports could not send for about 6% of the time (PortXmitWait), mark ECN and send and handle CNPs "
            "(hw_counters); the capture on node02 mlx5_0 shows ECN-CE marked data and CNPs back to node01. "
            "No errors anywhere. Background all run long, window included: every port waits a little (PortXmitWait) "
            "and marks a few ECN packets, and the capture shows a mark now and then.",
            rules=("TL203", "TL303", "TL401", "TL402", "TL403", "TL410"),
            hosts=hosts,
            story=(
                DeepSpeedTraining(steps=180, phases=BIG, slow=(60, 150, 2.2), ramp=20),
                _dumps(
                    _background(
                        background,
                        **{
                            f"{host}_{ca}": WAITS_ALL_ALONG
                            for host in ("node01", "node02")
                            for ca in ("mlx5_0", "mlx5_1")
                        },
                    ),
                    **{
                        f"{host}_mlx5_0": {
                            "PortXmitWait": 16e6,
                            "np_ecn_marked_roce_packets": 2500.0,
                            "np_cnp_sent": 2300.0,
                            "rp_cnp_handled": 2300.0,
                        }
                        for host in ("node01", "node02")
                    },
                ),  # fmt: skip
                RoceCapture(
                    "node02",
                    "mlx5_0",
                    ("node01",),
                    RoceFaults(congested=(1, 4, 7, 10, 13)),
                    during="slow",
                    background=MARK_NOW_AND_THEN if background else RoceFaults(),
                ),
            ),
            cause=Cause("TL410", ("node01", "node02"), "slow", ports=("mlx5_0:1",), tolerance_s=30.0),
        ),
        Scenario(
            name="scenario-socket-fallback",
            description="The job runs 80 healthy steps over RoCE, stops, and is relaunched from its step-60 "
            "checkpoint; in the second attempt node02's container lacks the RDMA device, so NCCL there finds no IB "
            "device and every inter-node connection runs over NET/Socket on eth0 (node01 still lists its RoCE "
            "HCAs). Steps 61-160 take 1.9x as long as in the first attempt, the extra time all in the gradient "
            "all-reduce; a short capture on node02's eth0 shows NCCL's TCP connections. Counters are clean.",
            rules=("TL101", "TL103", "TL402", "TL412", "TL504"),
            hosts=hosts,
            story=(
                DeepSpeedTraining(steps=80, phases=BIG),
                Relaunch((node01, replace(node02, hcas=()))),
                DeepSpeedTraining(steps=160, first_step=61, phases=replace(BIG, bwd_allreduce=1150.0)),
                _dumps(),
                TcpCapture("node02", "node01"),
            ),
            cause=Cause("TL412", ("node02",), "training", tolerance_s=10.0),
        ),
        Scenario(
            name="scenario-straggler",
            description="node02's four GPUs compute 1.4x slower than node01's (forward and backward, every rank "
            "logging its timers into the launcher's stdout), so node01's ranks wait for them in every all-reduce; "
            "the network is clean: counters without errors or waits, a capture without loss or marks.",
            rules=("TL402", "TL404"),
            hosts=hosts,
            layout="launcher",
            story=(
                DeepSpeedTraining(steps=50, phases=BIG, straggler=((4, 5, 6, 7), 1.4)),
                _dumps(),
                RoceCapture("node02", "mlx5_0", ("node01",)),
            ),
            cause=Cause("TL404", ("node02",), "training", ranks=(4, 5, 6, 7), tolerance_s=10.0),
        ),
        Scenario(
            name="scenario-hang",
            description="After step 50, rank 5 (node02, GPU 1) hangs in its data loader: its last line is step "
            "50's timers, while the other ranks still run the first micro-step of step 51, print its timers and "
            "wait in the gradient all-reduce. Traffic stops in the capture; ten minutes later the seven waiting "
            "ranks' watchdogs time out on the same ALLREDUCE; rank 5 reports nothing. No network fault.",
            rules=("TL108", "TL411"),
            hosts=hosts,
            story=(
                DeepSpeedTraining(
                    steps=50, phases=BIG, config=DsConfig(gradient_accumulation_steps=2), every_rank=True, stuck=5
                ),
                WatchdogTimeout(HANG, silent=(5,)),
                CounterDumps(_ports(), tool="sysfs"),
                RoceCapture("node02", "mlx5_0", ("node01",)),
            ),
            cause=Cause("TL411", ("node02",), "hang", ranks=(5,), tolerance_s=5.0),
        ),
        Scenario(
            name="scenario-tz-shift",
            description="The flaky link of scenario-flaky-link, on node01 mlx5_0 this time, with the logs printed "
            "in the hosts' local time, UTC+3 (DeepSpeed's asctime, the launcher), while the capture and the counter "
            "dumps (`date -u`) are in UTC: tracelens must find the 3-hour shift without --tz and say so. The same "
            "background errors and drops as scenario-flaky-link, all run long.",
            rules=("TL201", "TL204", "TL301", "TL401", "TL402", "TL410"),
            hosts=hosts,
            utc_offset_h=3.0,
            story=(
                slow_link[0],
                _dumps(_background(background, node01_mlx5_0=ERRORS_ALL_ALONG), **_flaky("node01", "node02", "mlx5_0")),
                RoceCapture("node01", "mlx5_0", ("node02",), RoceFaults(lost=(5, 12)), during="slow", background=drops),
            ),
            cause=Cause("TL410", ("node01",), "slow", ports=("mlx5_0:1",), tolerance_s=10.0),
        ),
    )
