"""TL501-TL504: DeepSpeed settings that cost communication.

Settings come from ds_config.json and from the log's configuration echo (zero_config and
the user JSON), all under the dotted keys of ds_config.json (`zero_optimization.stage`).
Each finding names the config change.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.step_times import COMM_BOUND_SHARE
from tracelens.findings import Finding, Severity
from tracelens.findings.evidence import evidence
from tracelens.prose import count
from tracelens.rules import Setting, rule

ZERO = "zero_optimization"
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size / allgather_bucket_size default
SMALL_BUCKET = DEFAULT_BUCKET // 10


def _settings(ctx: RunContext, *keys: str) -> pl.DataFrame:
    """The deepspeed_settings rows for `keys`, in file order."""
    return (
        ctx["deepspeed_settings"]
        .filter(pl.col("key").is_in(list(keys)) & (pl.col("source") != "launcher_env"))
        .sort("file", "line")
    )


def _flag(value: str | None) -> bool | None:
    text = (value or "").strip().lower()
    return {"true": True, "1": True, "false": False, "0": False}.get(text)


def _number(value: str | None) -> float | None:
    try:
        number = float((value or "").replace(",", ""))
    except ValueError:
        return None  # "auto" (HF Accelerate fills it in), or not a number
    return number if math.isfinite(number) else None  # NaN, Infinity, 1e400: no setting a rule can use


def _setting(row: Mapping[str, Any]) -> str:
    return f"{row['key']} = {row['value']}"


def _zero_stages(ctx: RunContext) -> set[int]:
    rows = _settings(ctx, f"{ZERO}.stage", "zero_optimization_stage")
    return {int(n) for n in (_number(v) for v in rows["value"].to_list()) if n is not None}


@rule("TL501", "overlap-comm-off", Severity.WARNING, needs=("deepspeed_settings",))
def overlap_comm_off(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: ZeRO (stage 1, 2 or 3) with `overlap_comm` false, in ds_config.json or in
    the configuration DeepSpeed echoes at start (`zero_config ... overlap_comm=False`).

    Why it slows the run: with overlap_comm off, ZeRO reduces the gradient buckets after the
    backward pass instead of while it runs, so all of that communication sits on the
    critical path of every step (it shows as `bwd_allreduce` time). With it on, the
    reduce-scatter of one bucket overlaps the backward computation of the next.

    How to fix: set `"zero_optimization": {"overlap_comm": true}` in ds_config.json (it costs
    some extra GPU memory for the buckets: 4.5x `reduce_bucket_size`; lower the bucket size
    if memory is tight rather than turning overlap off).
    """
    stages = _zero_stages(ctx)
    if not stages or max(stages) < 1:
        return
    off = _settings(ctx, f"{ZERO}.overlap_comm").filter(
        pl.col("value").map_elements(_flag, return_dtype=pl.Boolean).not_()
    )
    if off.height:
        yield Finding(
            severity=Severity.WARNING,
            title="overlap_comm is off under ZeRO",
            summary=f"ZeRO stage {max(stages)} runs with overlap_comm false ({count(off.height, 'setting')}): gradient "
            "reduction waits for the backward pass instead of overlapping it.",
            fix='Set "zero_optimization": {"overlap_comm": true} in ds_config.json.',
            evidence=evidence(off, _setting),
        )


@rule(
    "TL502",
    "small-comm-bucket",
    Severity.WARNING,
    needs=("deepspeed_settings",),
    settings={
        "small_bucket": Setting(
            "bytes", "A reduce or all-gather bucket below this size is reported (DeepSpeed's default is 500,000,000)."
        ),
    },
)
def small_comm_bucket(ctx: RunContext, *, small_bucket: int = SMALL_BUCKET) -> Iterator[Finding]:
    """
    What it finds: a ZeRO `reduce_bucket_size` or `allgather_bucket_size` more than ten times
    smaller than DeepSpeed's default of 500,000,000 elements (ds_config.json, the echoed
    zero_config, or the `Reduce bucket size` / `Allgather bucket size` lines of ZeRO init).

    Why it slows the run: every bucket is one collective. Small buckets mean many small
    all-reduces / all-gathers, each paying NCCL's launch and latency cost and none reaching
    the link's bandwidth, so communication takes longer and overlaps less.

    How to fix: raise `"reduce_bucket_size"` and `"allgather_bucket_size"` in
    `zero_optimization` towards 5e8 (lower them only as far as GPU memory demands).
    """
    rows = _settings(ctx, f"{ZERO}.reduce_bucket_size", f"{ZERO}.allgather_bucket_size")
    small = rows.filter(pl.col("value").map_elements(_number, return_dtype=pl.Float64) < small_bucket)
    if small.height:
        sizes = sorted({int(n) for v in small["value"].to_list() if (n := _number(v)) is not None})
        yield Finding(
            severity=Severity.WARNING,
            title="ZeRO communication buckets far below the default",
            summary=(
                f"{'Bucket size' if len(sizes) == 1 else 'Bucket sizes'} "
                f"{', '.join(f'{s:,}' for s in sizes)} elements, more than 10x below the "
                f"default {DEFAULT_BUCKET:,}: many small collectives instead of few large ones."
            ),
            fix=(
                'Set "zero_optimization": {"reduce_bucket_size": 5e8, '
                '"allgather_bucket_size": 5e8} (or as large as memory allows).'
            ),
            evidence=evidence(small, _setting),
        )


@rule("TL503", "cpu-offload", Severity.INFO, needs=("deepspeed_settings",))
def cpu_offload(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: ZeRO offloading optimizer state or parameters to the CPU or NVMe
    (`offload_optimizer.device` / `offload_param.device` of cpu or nvme, the older
    `cpu_offload: true`, or ZeRO init's `CPU Offload: True`).

    Why it slows the run: every step then moves gradients and parameters across PCIe between
    GPU and host memory and runs the optimizer on the CPU; that traffic competes with the
    NIC for PCIe bandwidth (GPUDirect RDMA shares the PCIe switch) and the CPU optimizer
    step is often longer than the GPU work. It saves GPU memory at a price in step time.

    How to fix: if the model fits without it, set `"offload_optimizer": {"device": "none"}`
    and `"offload_param": {"device": "none"}`; otherwise keep `pin_memory: true`, use ZeRO-3
    across more GPUs, or offload only the optimizer.
    """
    rows = _settings(
        ctx,
        f"{ZERO}.offload_optimizer.device",
        f"{ZERO}.offload_param.device",
        f"{ZERO}.cpu_offload",
        f"{ZERO}.cpu_offload_param",
    )
    device = pl.col("value").str.to_lowercase().str.strip_chars("'\" ")
    offloaded = rows.filter(device.is_in(["cpu", "nvme", "true", "offloaddeviceenum.cpu", "offloaddeviceenum.nvme"]))
    if offloaded.height:
        what = sorted({k.removeprefix(f"{ZERO}.").split(".")[0] for k in offloaded["key"].to_list()})
        yield Finding(
            severity=Severity.INFO,
            title="ZeRO offloads to the CPU",
            summary=f"ZeRO offload is on ({', '.join(what)}): optimizer state or parameters cross PCIe every step.",
            evidence=evidence(offloaded, _setting),
        )


@rule(
    "TL504",
    "no-grad-accumulation-comm-bound",
    Severity.WARNING,
    needs=("deepspeed_settings", "steps"),
    settings={
        "comm_bound_share": Setting(
            "share of the step",
            "All-reduce + all-gather time at or above this share makes the run communication-bound.",
        ),
    },
)
def no_grad_accumulation(ctx: RunContext, *, comm_bound_share: float = COMM_BOUND_SHARE) -> Iterator[Finding]:
    """
    What it finds: `gradient_accumulation_steps` of 1 in a run whose steps are
    communication-bound (the gradient all-reduce and ZeRO all-gather take 35% or more of the
    step in wall_clock_breakdown's timers).

    Why it slows the run: gradients are reduced across all ranks once per optimizer step.
    With no accumulation that is once per micro-batch, so the whole gradient volume crosses
    the network for every micro-batch; accumulating over N micro-batches divides that
    traffic by N for the same global batch.

    How to fix: raise `"gradient_accumulation_steps"` (and lower
    `train_micro_batch_size_per_gpu` or keep `train_batch_size` consistent), e.g. to 4 or 8.
    """
    gas = _settings(ctx, "gradient_accumulation_steps")
    single = gas.filter(pl.col("value").map_elements(_number, return_dtype=pl.Float64) == 1)
    if single.height == 0:
        return
    steady = ctx.step_series.scan().filter((pl.col("basis") == "timers") & ~pl.col("slow"))
    share = steady.select((pl.col("comm_ms") / pl.col("time_ms")).median()).collect(engine="streaming").item()
    if share is not None and share >= comm_bound_share:
        yield Finding(
            severity=Severity.WARNING,
            title="No gradient accumulation on a communication-bound run",
            summary=f"gradient_accumulation_steps is 1 while the gradient all-reduce/all-gather take {share:.0%} "
            "of each step: the full gradient volume crosses the network for every micro-batch.",
            fix='Set "gradient_accumulation_steps" to 4 or more (keeping train_batch_size consistent).',
            evidence=evidence(single, _setting),
        )
