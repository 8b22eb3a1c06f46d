"""DeepSpeed's own lines for synthetic runs: config echo, progress, timers, throughput.

Formats as DeepSpeed 0.10.1+ prints them (docs/formats/deepspeed.md): the
logger prefix, log_dist's `[Rank N] `, `step=`, wall_clock_breakdown's micro and global
timers, ZeRO's optimizer timers and the ThroughputTimer. `DeepSpeedTraining` is a story
event for `runs.Scenario`; `ds_config` gives the matching ds_config.json content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from synth.nccl import Host
from synth.runs import Run, Scenario


@dataclass(frozen=True)
class DsConfig:
    """The settings that matter for communication."""

    zero_stage: int = 2
    overlap_comm: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    offload_optimizer: str = "none"
    gradient_accumulation_steps: int = 1
    micro_batch: int = 4


def ds_config(cfg: DsConfig) -> dict:
    """The ds_config.json a user would write for `cfg`."""
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "steps_per_print": 1,
        "wall_clock_breakdown": True,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": cfg.zero_stage,
            "overlap_comm": cfg.overlap_comm,
            "contiguous_gradients": True,
            "reduce_bucket_size": float(cfg.reduce_bucket_size),
            "allgather_bucket_size": float(cfg.allgather_bucket_size),
            "offload_optimizer": {"device": cfg.offload_optimizer},
        },
    }


def stamp(when: datetime) -> str:
    """The logger's asctime: local time, milliseconds after a comma."""
    return when.strftime("%Y-%m-%d %H:%M:%S,") + f"{when.microsecond // 1000:03d}"


def log_dist(when: datetime, message: str, rank: int = 0) -> str:
    return f"[{stamp(when)}] [INFO] [logging.py:96:log_dist] [Rank {rank}] {message}"


def config_echo(when: datetime, cfg: DsConfig, world_size: int) -> list[str]:
    """`DeepSpeedEngine configuration:` (config.py print) and the user JSON (print_user_config)."""
    user = ds_config(cfg)
    entries = {
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "steps_per_print": 1,
        "train_batch_size": cfg.micro_batch * cfg.gradient_accumulation_steps * world_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "wall_clock_breakdown": True,
        "world_size": world_size,
        "zero_allow_untested_optimizer": False,
        "zero_config": (
            f"stage={cfg.zero_stage} contiguous_gradients=True reduce_scatter=True "
            f"reduce_bucket_size={cfg.reduce_bucket_size} use_multi_rank_bucket_allreduce=True "
            f"allgather_partitions=True allgather_bucket_size={cfg.allgather_bucket_size} "
            f"overlap_comm={cfg.overlap_comm} load_from_fp32_weights=True elastic_checkpoint=False "
            "offload_param=None offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='"
            f"{cfg.offload_optimizer}', nvme_path=None, buffer_count=4, pin_memory=False, pipeline_read=False, "
            "pipeline_write=False, fast_init=False, ratio=1.0) sub_group_size=1000000000 round_robin_gradients=False"
        ),
        "zero_enabled": cfg.zero_stage > 0,
        "zero_optimization_stage": cfg.zero_stage,
    }
    head = f"[{stamp(when)}] [INFO] [config.py:"
    lines = [f"{head}999:print] DeepSpeedEngine configuration:"]
    for name, value in entries.items():
        gap = " " + "." * (29 - len(name)) + " " if len(name) < 29 else "  "
        lines.append(f"{head}1003:print]   {name}{gap}{value}")
    lines.append(f"{head}989:print_user_config]   json = " + json.dumps(user, indent=4))
    return "\n".join(lines).split("\n")


@dataclass(frozen=True)
class Phases:
    """Milliseconds of one optimizer step on rank 0 (global timers: sums over micro-steps)."""

    fwd: float = 100.0
    bwd_inner: float = 220.0
    bwd_allreduce: float = 30.0
    allgather: float = 40.0
    gradients: float = 6.0
    optimizer: float = 24.0

    @property
    def step(self) -> float:
        return self.allgather + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.fwd + self.bwd_inner + self.bwd_allreduce + self.step


@dataclass(frozen=True)
class DeepSpeedTraining:
    """Rank 0's DeepSpeed lines for optimizer steps `first_step`..`steps` (steps_per_print=1,
    wall_clock_breakdown on); `first_step` > 1 resumes from a checkpoint. Records the story spans
    "training" and, with `slow`, "slow".

    `slow` = (first, last, factor): those steps take `factor` times as long, all of it in the
    gradient all-reduce (the network), reached gradually over the first `ramp` of them.
    `straggler` = (ranks, factor): those ranks' compute is slower, and the others wait for them
    in the all-reduce. With a straggler or `every_rank`, every rank logs its timers (each on its
    own host). `stuck`: that rank hangs in its data loader after the last step; the others still
    run the next step's first micro-step, print its timers, and wait in its gradient all-reduce.
    """

    steps: int = 300
    config: DsConfig = DsConfig()
    phases: Phases = Phases()
    slow: tuple[int, int, float] | None = None
    ramp: int = 0
    straggler: tuple[tuple[int, ...], float] | None = None
    every_rank: bool = False
    stuck: int | None = None
    first_step: int = 1
    jitter: float = 0.03
    gap_ms: float = 5.0  # data loading between steps, outside the timers

    def play(self, run: Run) -> None:
        host = run.procs[0].host
        world = len(run.procs)
        batch = self.config.micro_batch * self.config.gradient_accumulation_steps * world
        t = run.now
        run.put(host, "stdout", t, config_echo(run.time(t), self.config, world))
        begin = t
        timed = 0.0  # the ThroughputTimer's running average leaves out the first two steps
        for step in range(self.first_step, self.steps + 1):
            if self.slow and step == self.slow[0]:
                slow_from = t
            p = self._phases(run, step)
            t += (p.total + self.gap_ms) / 1000
            when = run.time(t)
            lr = 1e-4 * min(1.0, step / 50)
            curr = batch / (p.total / 1000)
            n = step - self.first_step + 1
            if n > 2:
                timed += p.total / 1000
            avg = batch * (n - 2) / timed if n > 2 else curr
            lines = [
                log_dist(
                    when,
                    (
                        f"time (ms) | optimizer_allgather: {p.allgather:.2f} | optimizer_gradients: "
                        f"{p.gradients:.2f} | optimizer_step: {p.optimizer:.2f}"
                    ),
                ),
                log_dist(when, f"step={step}, skipped=0, lr=[{lr}, {lr}], mom=[(0.9, 0.95), (0.9, 0.95)]"),
                f"[{stamp(when)}] [INFO] [timer.py:264:stop] "
                f"epoch=0/micro_step={step * self.config.gradient_accumulation_steps}/"
                f"global_step={step}, RunningAvgSamplesPerSec={avg}, "
                f"CurrSamplesPerSec={curr}, MemAllocated=5.53GB, MaxMemAllocated=8.61GB",
            ]
            (_, rank0), *others = self._timers(p, world)
            run.put(host, "stdout", t, lines + [log_dist(when, line) for line in rank0])
            for rank, timers in others:
                self._print(run, rank, t, timers)
            if self.slow and step == self.slow[1]:
                run.spans["slow"] = (slow_from, t)
        run.spans["training"] = (begin, t)
        if self.stuck is not None:
            micro = t + (self.gap_ms + p.fwd + p.bwd_inner) / 1000
            for rank, timers in self._timers(p, world, ("_microstep",)):
                if rank != self.stuck:
                    self._print(run, rank, micro, timers)
        run.now = t + 1.0

    def _print(self, run: Run, rank: int, t: float, lines: list[str]) -> None:
        """A rank other than 0 logs its own lines on its host, a few milliseconds apart from the others."""
        t += run.rand.uniform(0.0, 0.004)
        run.put(run.procs[rank].host, "stdout", t, [log_dist(run.time(t), line, rank) for line in lines])

    def _slowdown(self, step: int) -> float:
        """How many times its usual length step `step` takes."""
        if not self.slow or not self.slow[0] <= step <= self.slow[1]:
            return 1.0
        first, _, factor = self.slow
        return 1 + (factor - 1) * min(1.0, (step - first + 1) / self.ramp) if self.ramp else factor

    def _phases(self, run: Run, step: int) -> Phases:
        def vary(ms: float) -> float:
            return ms * (1 + run.rand.uniform(-self.jitter, self.jitter))

        p = self.phases
        allreduce = p.bwd_allreduce + (self._slowdown(step) - 1) * p.total + self._wait(p)
        return Phases(
            vary(p.fwd), vary(p.bwd_inner), vary(allreduce), vary(p.allgather), vary(p.gradients), vary(p.optimizer)
        )

    def _wait(self, p: Phases) -> float:
        """What the other ranks wait in the all-reduce for the stragglers' extra compute."""
        return (self.straggler[1] - 1) * (p.fwd + p.bwd_inner) if self.straggler else 0.0

    def _timers(
        self, p: Phases, world: int, suffixes: tuple[str, ...] = ("_microstep", "")
    ) -> list[tuple[int, list[str]]]:
        """The micro and global timer lines, of rank 0 or of every rank."""
        out = []
        for rank in range(world if self.straggler or self.every_rank else 1):
            fwd, inner, allreduce = p.fwd, p.bwd_inner, p.bwd_allreduce
            if self.straggler and rank in self.straggler[0]:
                factor = self.straggler[1]
                fwd, inner, allreduce = fwd * factor, inner * factor, allreduce - self._wait(p)
            values = (fwd, inner + allreduce, inner, allreduce, p.step)
            names = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
            out.append(
                (
                    rank,
                    [
                        "time (ms) | " + " | ".join(f"{n}{suffix}: {v:.2f}" for n, v in zip(names, values))
                        for suffix in suffixes
                    ],
                )
            )
        return out


def scenarios(hosts: tuple[Host, ...]) -> tuple[Scenario, ...]:
    """The DeepSpeed fixtures: a healthy run, a slow window, overlap_comm off under ZeRO-2."""
    return (
        Scenario(
            name="ds-healthy-steps",
            description="A healthy 2-node DeepSpeed ZeRO-2 run (overlap_comm on, 5e8 buckets) logging every one of "
            "300 steps with wall_clock_breakdown: step times within 3% of each other. No rule may fire.",
            rules=(),
            hosts=hosts,
            story=(DeepSpeedTraining(),),
        ),
        Scenario(
            name="ds-slow-window",
            description="Steps 120-159 of 300 take 3x as long, all of the extra time in the gradient all-reduce "
            "(bwd_allreduce) while forward and backward compute stay flat: a network slowdown for 40 steps.",
            rules=("TL401", "TL402", "TL410"),
            hosts=hosts,
            story=(DeepSpeedTraining(slow=(120, 159, 3.0)),),
        ),
        Scenario(
            name="ds-overlap-comm-off",
            description="ZeRO stage 2 with overlap_comm false (echoed in the DeepSpeedEngine configuration): "
            "gradient reduction waits for the backward pass instead of running beside it. Step times are steady.",
            rules=("TL501",),
            hosts=hosts,
            story=(DeepSpeedTraining(config=DsConfig(overlap_comm=False), phases=Phases(bwd_allreduce=60.0)),),
        ),
    )
