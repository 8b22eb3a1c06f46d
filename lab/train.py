"""One rank of the lab's training job: a small MLP trained with DeepSpeed ZeRO-2 on CPU over gloo.

Started by run.sh inside the rank's network namespace with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. It runs for --seconds from its first step; rank 0 decides when to stop and
when to checkpoint, and tells the others through a tiny all-reduce each step, so every rank
leaves (or saves) at the same step and no collective is left unmatched.

Impairments that live inside the job are switched on by run.sh creating files in --flags:
  stall       every rank's data loader sleeps --stall-ms per batch while it exists;
  checkpoint  the ranks save a DeepSpeed checkpoint at the next step and then hold for
              --pause-s seconds (a slow checkpoint write), once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import deepspeed
import deepspeed.runtime.engine as ds_engine
import torch
import torch.distributed as dist
from deepspeed.utils.logging import log_dist, set_log_level_from_string
from deepspeed.utils.timer import SynchronizedWallClockTimer
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

SEED = int(os.environ.get("LAB_SEED", "0"))  # weights and batches; a held-out run takes another (lab/README.md)


def log_on_every_rank() -> None:
    """DeepSpeed 0.19 prints its step line and wall_clock_breakdown timers on rank 0 only; print
    them on every rank, in DeepSpeed's own format, so each rank's log has its own timers."""
    timers_log = SynchronizedWallClockTimer.log

    def every_rank_timers(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        return timers_log(self, names, normalizer, reset, memory_breakdown, ranks=[-1])

    take_model_step = ds_engine.DeepSpeedEngine._take_model_step

    def every_rank_progress(self, step):
        log_dist(f"step={step}, skipped={self.skipped_steps}, lr={self.get_lr()}, mom={self.get_mom()}", ranks=[-1])

    def step_reported_on_every_rank(self, *args, **kwargs):  # rank 0 reports inside, before its timers
        take_model_step(self, *args, **kwargs)
        if self.global_rank != 0 and self.global_steps % self.steps_per_print() == 0:
            self._report_progress(self.global_steps)

    set_log_level_from_string("info")  # DeepSpeed 0.19 logs at WARNING unless told otherwise
    SynchronizedWallClockTimer.log = every_rank_timers
    ds_engine.DeepSpeedEngine._report_progress = every_rank_progress
    ds_engine.DeepSpeedEngine._take_model_step = step_reported_on_every_rank


class RandomBatches(IterableDataset):
    """Endless random regression batches; sleeps while the `stall` flag exists (the injected input stall)."""

    def __init__(self, batch: int, features: int, flags: Path, stall_s: float):
        self.batch, self.features, self.stall_flag, self.stall_s = batch, features, flags / "stall", stall_s

    def __iter__(self):
        gen = torch.Generator().manual_seed(SEED + int(os.environ.get("RANK", "0")))
        while True:
            if self.stall_flag.exists():
                time.sleep(self.stall_s)
            x = torch.randn(self.batch, self.features, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)


def mlp(features: int, hidden: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


def ds_config(micro_batch: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "wall_clock_breakdown": True,
        "zero_optimization": {
            "stage": 2,
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
        # every collective DeepSpeed issues, with its time and size, on every rank
        "comms_logger": {"enabled": True, "verbose": True, "prof_all": True, "debug": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=150.0, help="train this long from the first step")
    parser.add_argument("--flags", type=Path, required=True, help="folder where run.sh puts impairment flags")
    parser.add_argument("--out", type=Path, required=True, help="folder for this run's config and checkpoints")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=6144)
    parser.add_argument("--stall-ms", type=float, default=400.0, help="data-loader sleep per batch while stalled")
    parser.add_argument("--pause-s", type=float, default=25.0, help="hold after the checkpoint save")
    args = parser.parse_args()

    torch.set_num_threads(1)
    log_on_every_rank()
    torch.manual_seed(SEED)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    config = ds_config(args.batch)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ds_config.json").write_text(json.dumps(config, indent=2))
    model = mlp(args.features, args.hidden, args.layers)
    # torch's AdamW, not DeepSpeed's FusedAdam: the latter JIT-compiles a C++ op on first use
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    batches = RandomBatches(args.batch, args.features, args.flags, args.stall_ms / 1000)
    loader = iter(DataLoader(batches, batch_size=None))
    loss_fn = nn.MSELoss()
    control = torch.zeros(2)  # [stop, checkpoint now], decided by rank 0
    checkpointed = False
    started = None
    while True:
        x, y = next(loader)
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        if started is None:
            started = time.time()
        control.zero_()
        if rank == 0:
            control[0] = float(time.time() - started >= args.seconds)
            control[1] = float((args.flags / "checkpoint").exists() and not checkpointed)
        dist.all_reduce(control, op=dist.ReduceOp.MAX)
        if control[1] > 0:
            checkpointed = True
            began = time.time()
            engine.save_checkpoint(str(args.out / "checkpoints"))
            time.sleep(args.pause_s)
            dist.barrier()
            if rank == 0:  # for run.sh: the pause's true UTC span
                (args.out / "pause.json").write_text(json.dumps({"from": began, "to": time.time()}))
        if control[0] > 0:
            break
    print(f"rank {rank} done after {engine.global_steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
