"""One rank of a small data-parallel training job on CPU with gloo, made to hang on purpose.

Run by lab/hang/run.py, one process per rank. Every rank trains a small MLP: a data loader
yields a batch, forward, backward, one all_reduce per gradient on the default process group,
and one all_reduce of the loss on a second process group ("metrics"). PyTorch's Flight
Recorder is on (TORCH_FR_BUFFER_SIZE). A rank that has made no progress for --dump-after
seconds, or whose collective failed, writes its Flight Recorder dump (pickle and JSON) the
way TORCH_NCCL_DUMP_ON_TIMEOUT would, then exits.

Scenarios (--scenario, acting on --bad-rank at --bad-step):
  healthy   nothing goes wrong; every rank dumps once at the end
  skip      the bad rank skips the loss all_reduce on the metrics group and goes on to the
            next step's gradient all_reduce: the others wait in the metrics all_reduce
  size      the bad rank all_reduces a gradient of a different size
  sleep     the bad rank's data loader sleeps (a stuck input pipeline)
  kill      the launcher kills the bad rank with SIGKILL (see run.py)
"""

import argparse
import datetime as dt
import logging
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

log = logging.getLogger("train")


def utc_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


class Loader:
    """A data loader: random regression batches; the sleep scenario stalls it on the bad rank."""

    def __init__(self, args, rank):
        self.args, self.rank = args, rank
        self.gen = torch.Generator().manual_seed(rank)

    def next_batch(self, step):
        if self.args.scenario == "sleep" and self.rank == self.args.bad_rank and step == self.args.bad_step:
            log.info("data loader: waiting for the next shard")
            time.sleep(self.args.sleep_s)  # stuck input pipeline
        x = torch.randn(32, 64, generator=self.gen)
        return x, x.sum(dim=1, keepdim=True)


def dump_flight_recorder(out, rank, why):
    """Write this rank's Flight Recorder buffer as pickle (named like TORCH_FR_DUMP_TEMP_FILE's
    default, no extension) and as JSON."""
    c10d = torch._C._distributed_c10d
    pkl = c10d._dump_fr_trace(True, True, False)
    with open(os.path.join(out, f"fr_trace_rank_{rank}"), "wb") as fh:
        fh.write(pkl)
    js = c10d._dump_fr_trace_json(True, True)
    with open(os.path.join(out, f"fr_trace_rank_{rank}.json"), "wb") as fh:
        fh.write(js if isinstance(js, bytes) else js.encode())
    log.info("Flight Recorder dump written (%s)", why)


class Progress:
    """The watchdog: dumps the Flight Recorder when the main loop stops making progress."""

    def __init__(self, args, rank):
        self.args, self.rank, self.last, self.dumped = args, rank, time.monotonic(), threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="fr_watchdog").start()

    def tick(self):
        self.last = time.monotonic()

    def dump_once(self, why):
        if not self.dumped.is_set():
            self.dumped.set()
            dump_flight_recorder(self.args.out, self.rank, why)

    def _watch(self):
        while not self.dumped.is_set():
            time.sleep(0.5)
            if time.monotonic() - self.last > self.args.dump_after:
                log.error("watchdog: no progress for %.0f s, dumping the Flight Recorder", self.args.dump_after)
                self.dump_once("no progress")


def train(args, rank, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    metrics = dist.new_group(list(range(world)))  # a second process group for the loss
    loader, progress = Loader(args, rank), Progress(args, rank)
    for step in range(1, args.steps + 1):
        x, y = loader.next_batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for i, p in enumerate(model.parameters()):
            grad = p.grad
            if args.scenario == "size" and rank == args.bad_rank and step == args.bad_step and i == 0:
                grad = torch.cat([grad.flatten(), torch.zeros(7)])  # a gradient of another size
            dist.all_reduce(grad)
        opt.step()
        skip = args.scenario == "skip" and rank == args.bad_rank and step == args.bad_step
        if skip:
            log.info("step %d: loss not finite on this rank, skipping the metrics all_reduce", step)
        else:
            stat = loss.detach().reshape(1)
            dist.all_reduce(stat, group=metrics)
            loss = stat / world
        loss = loss.detach()
        log.info("step=%d loss=%.4f", step, loss.item())
        progress.tick()
        time.sleep(args.step_s)
    progress.dump_once("end of training")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--bad-rank", type=int, default=2)
    parser.add_argument("--bad-step", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--sleep-s", type=float, default=600.0)
    parser.add_argument("--dump-after", type=float, default=8.0)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format=f"[%(asctime)s] [%(levelname)s] [rank{rank}] %(message)s",
    )
    logging.Formatter.formatTime = lambda self, record, datefmt=None: utc_stamp()
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout_s))
    log.info("pid %d, world size %d, backend gloo, torch %s", os.getpid(), world, torch.__version__)
    try:
        train(args, rank, world)
    except Exception as exc:  # a failed collective: dump like the watchdog would, then fail
        log.exception("collective failed: %s", exc)
        dump_flight_recorder(args.out, rank, "collective failed")
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
