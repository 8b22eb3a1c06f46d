"""One rank of the lab's plain PyTorch job: the same MLP under DistributedDataParallel over gloo, no DeepSpeed.

Started by torchrun (or by matrix.py with the environment torchrun sets: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Every rank logs, per step, a
Megatron-style line with its global rank through Python's logging:

  [2026-12-04 23:40:00,123] [INFO] [train_ddp.py:97:main] [Rank 2] iteration       12/   10000 | ...
      elapsed time per iteration (ms): 512.3 | ...

where the elapsed time runs from the previous line to this one (data loading included), as
Megatron measures it. Stopping, checkpoints and the flags in --flags work as in train.py
(job.py); the desync rank issues one all_reduce the others never do.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from job import SEED, Flags, Model, add_job_arguments, batches, desync_all_reduce, hold_checkpoint, profiler
from torch import nn
from torch.nn.parallel import DistributedDataParallel

TRAIN_ITERS = 10000  # what the line prints as the run's length; the run stops by time
LR = 1e-4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_job_arguments(parser)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    args = parser.parse_args()

    sys.stdout.reconfigure(line_buffering=True)  # one write per line: a launcher's prefixer keeps lines whole
    sys.stderr.reconfigure(line_buffering=True)
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s",
        stream=sys.stdout,
    )
    log = logging.getLogger("train")
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log.info(
        f"[Rank {rank}] local rank {os.environ['LOCAL_RANK']} of {os.environ['LOCAL_WORLD_SIZE']}, world size {world}"
    )
    flags = Flags(args.flags, rank, args)
    side = dist.new_group()  # the desync's collective goes here, where the others never look
    model = DistributedDataParallel(Model(args.features, args.hidden, args.layers, flags), bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = batches(args.batch, args.features, flags, args.stall_ms / 1000)
    loss_fn = nn.MSELoss()
    control = torch.zeros(2)  # [stop, checkpoint now], decided by rank 0
    checkpointed = False
    started = None
    step = 0
    last = time.time()
    with profiler(args, rank) as prof:
        while True:
            x, y = next(loader)
            if flags.desync_now():
                desync_all_reduce(side)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            now = time.time()
            elapsed_ms, last = (now - last) * 1000, now
            log.info(
                f"[Rank {rank}] iteration {step:8d}/{TRAIN_ITERS:8d} | "
                f"consumed samples: {step * args.batch * world:12d} | "
                f"elapsed time per iteration (ms): {elapsed_ms:.1f} | learning rate: {LR:.3E} | "
                f"global batch size: {args.batch * world:5d} | lm loss: {loss.item():.6E} | loss scale: 1.0 | "
                f"number of skipped iterations:   0 | number of nan iterations:   0 | "
                f"samples per second: {args.batch * world / (elapsed_ms / 1000):.3f} |"
            )
            if started is None:
                started = now
            control.zero_()
            if rank == 0:
                control[0] = float(now - started >= args.seconds)
                control[1] = float(flags.checkpoint_asked() and not checkpointed)
            dist.all_reduce(control, op=dist.ReduceOp.MAX)
            if control[1] > 0:
                checkpointed = True
                args.out.mkdir(parents=True, exist_ok=True)
                hold_checkpoint(lambda: torch.save(model.state_dict(), args.out / f"model-rank{rank}.pt"), rank, args)
                last = time.time()  # Megatron stops its iteration timer while it saves
            prof.step()
            if control[0] > 0:
                break
    log.info(f"[Rank {rank}] done after {step} iterations")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
