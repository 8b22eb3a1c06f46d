"""One rank of the lab's training job: a small MLP trained with DeepSpeed (ZeRO 1, 2 or 3) on CPU over gloo.

Started by run.sh or matrix.py inside the rank's network namespace with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. It runs for --seconds from its first step; rank 0 decides when
to stop and when to checkpoint, and tells the others through a tiny all-reduce each step, so
every rank leaves (or saves) at the same step and no collective is left unmatched.

Impairments that live inside the job are switched on by creating files in --flags (job.py):
  stall       every rank's data loader sleeps --stall-ms per batch while it exists;
  checkpoint  the ranks save a DeepSpeed checkpoint at the next step and then hold for
              --pause-s seconds (a slow checkpoint write), once;
  slow        rank --slow-rank runs its forward pass --slow-extra more times while it exists;
  desync      rank --desync-rank issues, once, a collective the others never issue: an
              all_reduce of another size on a second process group. The job hangs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import deepspeed
import deepspeed.runtime.engine as ds_engine
import deepspeed.utils.comms_logging as comms_logging
import torch
import torch.distributed as dist
from deepspeed.utils.logging import log_dist, set_log_level_from_string
from deepspeed.utils.timer import SynchronizedWallClockTimer
from job import SEED, Flags, Model, add_job_arguments, batches, desync_all_reduce, hold_checkpoint, profiler
from torch import nn


def log_on_every_rank() -> None:
    """DeepSpeed 0.19 prints its step line, wall_clock_breakdown timers and the comms logger's
    lines on rank 0 only; print them on every rank, in DeepSpeed's own format, so each rank's
    log has its own timers and collectives."""
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

    def every_rank_log(message, ranks=None, **kwargs):
        log_dist(message, ranks=[-1], **kwargs)

    set_log_level_from_string("info")  # DeepSpeed 0.19 logs at WARNING unless told otherwise
    SynchronizedWallClockTimer.log = every_rank_timers
    ds_engine.DeepSpeedEngine._report_progress = every_rank_progress
    ds_engine.DeepSpeedEngine._take_model_step = step_reported_on_every_rank
    comms_logging.log_dist = every_rank_log


def ds_config(micro_batch: int, grad_accum: int, stage: int, overlap: bool, bucket: int, every: bool) -> dict:
    """--bucket 0 keeps DeepSpeed's bucket sizes (one all-reduce after backward on this model);
    a small one makes several collectives run inside backward. `every`: a progress line every step
    and the comms logger's line per collective; else DeepSpeed's defaults (every 10 steps, no logger)."""
    zero: dict = {"stage": stage, "overlap_comm": overlap, "contiguous_gradients": True}
    if bucket:
        zero |= {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if stage == 3:
        # DeepSpeed keeps parameters under 100,000 elements whole on every rank: this model's
        # layers all are, and ZeRO-3 would gather nothing
        zero["stage3_param_persistence_threshold"] = 1000
        if bucket:
            zero |= {"stage3_prefetch_bucket_size": bucket, "stage3_max_live_parameters": 4 * bucket}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "steps_per_print": 1 if every else 10,
        "wall_clock_breakdown": True,
        "zero_optimization": zero,
        # every collective DeepSpeed issues, with its time and size
        "comms_logger": {"enabled": every, "verbose": True, "prof_all": True, "debug": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_job_arguments(parser)
    parser.add_argument("--zero", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    parser.add_argument("--overlap", choices=("on", "off"), default="on", help="overlap_comm")
    parser.add_argument("--bucket", type=int, default=0, help="reduce/allgather/prefetch bucket, elements (0: default)")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step; --batch is split among them")
    parser.add_argument(
        "--printing",
        choices=("every", "default"),
        default="every",
        help="every: timers, progress and comms logger on every rank at every step; default: DeepSpeed's own",
    )
    args = parser.parse_args()

    sys.stdout.reconfigure(line_buffering=True)  # one write per line: a launcher's prefixer keeps lines whole
    sys.stderr.reconfigure(line_buffering=True)
    torch.set_num_threads(1)
    if args.printing == "every":
        log_on_every_rank()
    else:
        set_log_level_from_string("info")  # as most jobs see DeepSpeed: its INFO lines, rank 0's only
    torch.manual_seed(SEED)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    flags = Flags(args.flags, rank, args)
    side = dist.new_group()  # the desync's collective goes here, where the others never look
    micro = args.batch // args.grad_accum
    config = ds_config(micro, args.grad_accum, args.zero, args.overlap == "on", args.bucket, args.printing == "every")
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ds_config.json").write_text(json.dumps(config, indent=2))
    model = Model(args.features, args.hidden, args.layers, flags)
    # torch's AdamW, not DeepSpeed's FusedAdam: the latter JIT-compiles a C++ op on first use
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loader = batches(micro, args.features, flags, args.stall_ms / 1000)
    loss_fn = nn.MSELoss()
    control = torch.zeros(2)  # [stop, checkpoint now], decided by rank 0
    checkpointed = False
    started = None
    with profiler(args, rank) as prof:
        while True:
            for _ in range(args.grad_accum):
                x, y = next(loader)
                if flags.desync_now():
                    desync_all_reduce(side)
                loss = loss_fn(engine(x), y)
                engine.backward(loss)
                engine.step()
            if started is None:
                started = time.time()
            control.zero_()
            if rank == 0:
                control[0] = float(time.time() - started >= args.seconds)
                control[1] = float(flags.checkpoint_asked() and not checkpointed)
            dist.all_reduce(control, op=dist.ReduceOp.MAX)
            if control[1] > 0:
                checkpointed = True
                hold_checkpoint(lambda: engine.save_checkpoint(str(args.out / "checkpoints")), rank, args)
            prof.step()
            if control[0] > 0:
                break
    print(f"rank {rank} done after {engine.global_steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
