"""Host evidence for the whole-run scenarios, in the documented formats (docs/formats/gpu.md,
docs/formats/kernel.md): `nvidia-smi dmon -o DT` loops and `dmesg -T` kernel logs with the
mlx5 link-flap and TX-timeout sequences no public sample shows. Times follow the story spans
(`Run.spans`), printed in the hosts' local time as the tools print them.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.deepspeed import DeepSpeedTraining
from synth.incidents import BIG, RoceCapture, _dumps, _flaky  # the flaky-link story the host evidence joins
from synth.nccl import Host
from synth.pcap import RoceFaults
from synth.runs import Cause, Run, Scenario

DMON_HEADER = (
    "#Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk",
    "#YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %   MHz   MHz",
)


@dataclass(frozen=True)
class GpuMonitor:
    """`nvidia-smi dmon -o DT -d <every_s>` on every host over the story span "training": SM
    utilisation about `busy` %, and `idle` % inside the story span `during` on `hosts` (all if empty)."""

    busy: float = 93.0
    idle: float = 35.0
    during: str | None = None
    hosts: tuple[str, ...] = ()
    every_s: float = 5.0
    gpus: int = 4

    def play(self, run: Run) -> None:
        start, end = run.spans["training"]
        low = run.spans[self.during] if self.during else (end, start)
        for host in run.scenario.hosts:
            lines = list(DMON_HEADER)
            t = start
            while t <= end:
                waiting = low[0] <= t <= low[1] and (not self.hosts or host.name in self.hosts)
                for gpu in range(self.gpus):
                    sm = self.idle if waiting else self.busy
                    sm = max(0, min(100, round(sm + run.rand.uniform(-4, 4))))
                    power = round(90 + 3.2 * sm + run.rand.uniform(-8, 8))
                    stamp = run.time(t)
                    lines.append(
                        f" {stamp:%Y%m%d}   {stamp:%H:%M:%S}  {gpu:>5} {power:>5} {run.rand.int(55, 70):>5}"
                        f"     - {sm:>5} {round(sm * 0.4):>5}     0     0  1593  1980"
                    )
                t += self.every_s
            run.attach(f"{host.name}/nvidia-smi-dmon.txt", "\n".join(lines) + "\n")


@dataclass(frozen=True)
class LinkFlaps:
    """`dmesg -T` on `host`: boot lines of the mlx5 NIC, then inside the story span `during` the
    port of `netdev` (PCI `pci`) flapping `flaps` times (Link down, a TX timeout, Link up)."""

    host: str
    during: str
    netdev: str = "ens1f1np1"
    pci: str = "0000:5e:00.1"
    flaps: int = 3

    def play(self, run: Run) -> None:
        begin, end = run.spans[self.during]
        start = run.spans["training"][0]
        dev = f"mlx5_core {self.pci}"
        records = [
            (start - 3600.0, f"{dev}: firmware version: 28.39.1002"),
            (start - 3600.0, f"{dev}: 252.048 Gb/s available PCIe bandwidth (16.0 GT/s PCIe x16 link)"),
            (start - 3599.0, f"{dev}: Port module event: module 1, Cable plugged"),
            (start - 3598.0, f"{dev} {self.netdev}: Link up"),
        ]
        step = (end - begin) / (self.flaps + 1)
        for i in range(1, self.flaps + 1):
            t = begin + i * step
            records += [
                (t, f"{dev} {self.netdev}: Link down"),
                (t + 5.0, "NETDEV WATCHDOG: " + f"{self.netdev} (mlx5_core): transmit queue 3 timed out 5120 ms"),
                (t + 5.0, f"{dev} {self.netdev}: TX timeout detected"),
                (
                    t + 5.0,
                    (
                        f"{dev} {self.netdev}: TX timeout on queue: 3, SQ: 0x10b5, CQ: 0x4c4, SQ Cons: 0x0 SQ Prod: "
                        "0x2, usecs since last trans: 5120000"
                    ),
                ),
                (t + 7.0, f"{dev} {self.netdev}: Link up"),
            ]
        lines = [f"[{run.time(t):%a %b %e %H:%M:%S %Y}] {text}" for t, text in sorted(records, key=lambda r: r[0])]
        run.attach(f"{self.host}/dmesg-T.txt", "\n".join(lines) + "\n")


def scenarios(hosts: tuple[Host, Host]) -> tuple[Scenario, ...]:
    """Whole runs with host evidence on two RoCE hosts (`hosts`: node01, node02)."""
    return (
        Scenario(
            name="scenario-gpu-idle-bad-link",
            description="The flaky-link run with the host evidence an operator attaches: node02's mlx5_1 link "
            "(netdev ens1f1np1) flaps three times during steps 70-109 (dmesg -T: mlx5 Link down, NETDEV WATCHDOG "
            "and mlx5 TX timeout, Link up), its port counts symbol errors and receive errors, the capture shows "
            "NAKs and go-back-N resends, the steps take 3.8x as long, and `nvidia-smi dmon -o DT` on both hosts "
            "shows the GPUs at about 35% SM utilisation in that window against about 93% before and after: the "
            "GPUs wait on the network.",
            rules=("TL201", "TL204", "TL301", "TL401", "TL402", "TL410", "TL601", "TL605"),
            hosts=hosts,
            story=(
                DeepSpeedTraining(steps=160, phases=BIG, slow=(70, 109, 3.8)),
                _dumps(**_flaky("node02", "node01", "mlx5_1")),
                RoceCapture("node02", "mlx5_1", ("node01",), RoceFaults(lost=(5, 12)), during="slow"),
                GpuMonitor(during="slow"),
                LinkFlaps("node02", during="slow"),
            ),
            cause=Cause("TL410", ("node02",), "slow", ports=("mlx5_1:1",), tolerance_s=10.0),
        ),
    )
