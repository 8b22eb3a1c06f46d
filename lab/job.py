"""What the lab's two training scripts share: the model, its batches, the job's options and the
impairments that live inside the job, switched on and off by files in the --flags folder.

train.py (DeepSpeed) and train_ddp.py (PyTorch DDP under torchrun) import it from this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

SEED = int(os.environ.get("LAB_SEED", "0"))  # weights and batches


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=150.0, help="train this long from the first step")
    parser.add_argument("--flags", type=Path, required=True, help="folder where the driver puts impairment flags")
    parser.add_argument("--out", type=Path, required=True, help="folder for this run's config and checkpoints")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=6144, help="samples per rank and step")
    parser.add_argument("--stall-ms", type=float, default=400.0, help="data-loader sleep per batch while stalled")
    parser.add_argument("--pause-s", type=float, default=25.0, help="hold after the checkpoint save")
    parser.add_argument("--slow-rank", type=int, default=-1, help="the rank the `slow` flag slows")
    parser.add_argument("--slow-extra", type=int, default=10, help="extra forward passes of the slow rank")
    parser.add_argument("--desync-rank", type=int, default=-1, help="the rank the `desync` flag desynchronises")
    parser.add_argument("--profile", type=Path, help="write this rank's PyTorch profiler trace into this folder")
    parser.add_argument("--profile-wait", type=int, default=5, help="steps before the profiler records")
    parser.add_argument("--profile-steps", type=int, default=400, help="steps it records (the run may end first)")


def profiler(args: argparse.Namespace, rank: int) -> torch.profiler.profile | contextlib.nullcontext:
    """With --profile, torch.profiler on the CPU over --profile-steps steps after --profile-wait, its
    trace written by tensorboard_trace_handler as `rank<N>.<ns>.pt.trace.json` when the steps are done
    or the run ends (whichever comes first); the caller marks each step with `.step()`."""
    if args.profile is None:
        return contextlib.nullcontext(NoProfiler())
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=args.profile_wait, warmup=1, active=args.profile_steps, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(args.profile), worker_name=f"rank{rank}"),
    )


class NoProfiler:
    """What a run without --profile marks its steps on."""

    def step(self) -> None:
        pass


class Flags:
    """The impairment flags as this rank sees them."""

    def __init__(self, folder: Path, rank: int, args: argparse.Namespace):
        self.folder, self.rank, self.args = folder, rank, args
        self.desynced = False

    def stalled(self) -> bool:
        return (self.folder / "stall").exists()

    def checkpoint_asked(self) -> bool:
        return (self.folder / "checkpoint").exists()

    def slow_extra(self) -> int:
        slow = self.rank == self.args.slow_rank and (self.folder / "slow").exists()
        return self.args.slow_extra if slow else 0

    def desync_now(self) -> bool:
        """True once, on the desync rank, when the `desync` flag appears."""
        if self.desynced or self.rank != self.args.desync_rank or not (self.folder / "desync").exists():
            return False
        self.desynced = True
        return True


def mlp(features: int, hidden: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


class Model(nn.Module):
    """The MLP; while this rank is slowed its forward first runs a private copy of the MLP a few
    times more (no gradient), so its own work rises and it issues no collective of its own."""

    def __init__(self, features: int, hidden: int, layers: int, flags: Flags):
        super().__init__()
        self.net = mlp(features, hidden, layers)
        self._private = [copy.deepcopy(self.net)]  # in a list: no submodule, so no framework shards or reduces it
        self.flags = flags

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = self.flags.slow_extra()
        if extra:
            with torch.no_grad():
                for _ in range(extra):
                    self._private[0](x)
        return self.net(x)


class RandomBatches(IterableDataset):
    """Endless random regression batches; sleeps while the `stall` flag exists (the injected input stall)."""

    def __init__(self, batch: int, features: int, flags: Flags, stall_s: float):
        self.batch, self.features, self.flags, self.stall_s = batch, features, flags, stall_s

    def __iter__(self):
        gen = torch.Generator().manual_seed(SEED + int(os.environ.get("RANK", "0")))
        while True:
            if self.flags.stalled():
                time.sleep(self.stall_s)
            x = torch.randn(self.batch, self.features, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)


def batches(batch: int, features: int, flags: Flags, stall_s: float) -> Iterator:
    return iter(DataLoader(RandomBatches(batch, features, flags, stall_s), batch_size=None))


def desync_all_reduce(side: dist.ProcessGroup) -> None:
    """A collective only this rank issues: an all_reduce of another size on a group the others
    created but never use (on the same group gloo would abort on the size, not hang)."""
    dist.all_reduce(torch.zeros(1000), group=side)


def hold_checkpoint(save: Callable[[], None], rank: int, args: argparse.Namespace) -> None:
    """Save, hold --pause-s (a slow storage write), meet the others; rank 0 records the true span."""
    began = time.time()
    save()
    time.sleep(args.pause_s)
    dist.barrier()
    if rank == 0:
        (args.out / "pause.json").write_text(json.dumps({"from": began, "to": time.time()}))
