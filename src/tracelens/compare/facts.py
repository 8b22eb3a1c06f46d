"""The facts of one run that a change can be made of: one row per (area, key, host) with its value.

Each fact names the part of the step it can slow (`phase`), so that a change can be held against
the step timers: a transport or a port moves the all-reduce, an offload the optimizer step.
"""

from __future__ import annotations

import math
import re

import polars as pl

from tracelens.derived import RunContext
from tracelens.derived.nccl import NcclHost
from tracelens.tables import RunTables

SCHEMA = {"area": pl.String, "key": pl.String, "host": pl.String, "value": pl.String, "phase": pl.String}

# The part of a step each DeepSpeed setting acts on; settings not listed act on the whole step.
_DS_PHASE = (
    (r"overlap_comm|bucket_size|reduce_scatter|allgather_partitions|contiguous_gradients|zero_optimization\.stage|"
     r"zero_optimization_stage|communication_data_type|prescale_gradients|gradient_predivide", "all-reduce"),
    (r"offload", "optimizer step"),
    (r"^(?:bf16|fp16|amp)\.|precision", "compute"),
)  # fmt: skip
MAX_VALUE_CHARS = 160
NOT_NAMED = "(host not named)"
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_IGNORED_CONFIG = (
    r"^launcher\.|_path$|^checkpoint|^tensorboard|^wandb|^csv_monitor|^comet|^steps_per_print$|^wall_clock_breakdown$"
)


def run_facts(ctx: RunContext) -> pl.DataFrame:
    """Every comparable fact of a run: NCCL set-up, DeepSpeed configuration and fabric ports."""
    parts = [_nccl(ctx.nccl_hosts), _deepspeed(ctx.tables), _ports(ctx.tables)]
    return (
        pl.concat([p for p in parts if p.height], how="vertical")
        if any(p.height for p in parts)
        else pl.DataFrame(schema=SCHEMA)
    )


def sources(tables: RunTables) -> set[str]:
    """The areas a run has evidence for at all: a missing area is "not available", not "unset"."""
    have = {
        "NCCL": tables.height("nccl_events") > 0,
        "DeepSpeed": tables["deepspeed_settings"].filter(pl.col("engine").is_not_null()).height > 0,
        "fabric": tables["ib_ports"].height > 0,
        "counters": tables["ib_counters"].height > 0,
        "packets": tables.height("packets") > 0,
        "steps": tables.height("steps") > 0,
    }
    return {area for area, present in have.items() if present}


def _frame(rows: pl.DataFrame, area: str, key: pl.Expr | str, value: pl.Expr, phase: str | pl.Expr) -> pl.DataFrame:
    key_expr = pl.lit(key) if isinstance(key, str) else key
    phase_expr = pl.lit(phase) if isinstance(phase, str) else phase
    return rows.select(
        area=pl.lit(area),
        key=key_expr,
        host=pl.col("host").fill_null(NOT_NAMED),
        value=value,
        phase=phase_expr,
    ).cast(SCHEMA)  # type: ignore[arg-type]


def _nccl(hosts: list[NcclHost]) -> pl.DataFrame:
    """Per host its NCCL facts, each the distinct values joined; a setting echoed on some hosts
    is "(not set)" on the others that echo settings (a host that echoes none may just not log them)."""
    rows = []
    for h in hosts:
        facts = {  # each the host's distinct values, sorted (versions oldest first)
            "NCCL version": list(dict.fromkeys(v.version for v in h.versions)),
            "network": h.named("network"),
            "net plugin": h.named("plugin"),
            "HCAs used": sorted({f"{r.name}:{r.port}" for r in h.net if r.what == "ib_device" and r.port is not None}),
            "socket interface": h.named("socket_if"),
            "inter-node transport": sorted({t.label for t in h.transports if t.inter_node and t.label}),
            "intra-node transport": sorted({t.label for t in h.transports if not t.inter_node and t.label}),
        }
        host = h.host or NOT_NAMED
        rows += [("NCCL", key, host, ", ".join(values)) for key, values in facts.items() if values]
    echoed = sorted({name for h in hosts for name, _ in h.settings})
    for h in (h for h in hosts if h.settings):
        values: dict[str, list[str]] = {}
        for name, value in h.settings:
            values.setdefault(name, []).append(value)
        host = h.host or NOT_NAMED
        rows += [("NCCL setting", name, host, " / ".join(values.get(name, ["(not set)"]))) for name in echoed]
    return pl.DataFrame([(*r, "all-reduce") for r in rows], schema=SCHEMA, orient="row")


def _normal(value: str | None) -> str | None:
    """Config values as comparable text: `True`/`true`, `5e8`/`500000000` compare equal."""
    if value is None:
        return None
    text = ADDRESS.sub("", value.strip())  # `<... object at 0x7f6e...>` differs every run
    if text.lower() in ("true", "false", "none", "null"):
        return text.lower().replace("null", "none")
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return str(int(number)) if number == int(number) and abs(number) < 1e18 else repr(number)


def _deepspeed(tables: RunTables) -> pl.DataFrame:
    config = tables["deepspeed_settings"].filter(
        pl.col("engine").is_not_null() | (pl.col("key") == "deepspeed_version")
    )
    # object reprs (`zero_config: stage=2 contiguous_gradients=True ...`) repeat keys compared one by one
    config = config.filter(
        ~pl.col("key").str.contains(_IGNORED_CONFIG), pl.col("value").str.len_chars() <= MAX_VALUE_CHARS
    )
    if config.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    key = pl.col("key").str.replace(r"^zero_optimization_stage$", "zero_optimization.stage")
    phase = pl.lit("whole step")
    for pattern, name in reversed(_DS_PHASE):
        phase = pl.when(key.str.contains(pattern)).then(pl.lit(name)).otherwise(phase)
    rows = config.select(
        pl.col("host").fill_null(NOT_NAMED),
        key=key,
        value=pl.col("value").map_elements(_normal, return_dtype=pl.String),
        phase=phase,
    ).unique(["host", "key", "value"])
    per_host = rows.group_by("host", "key", "phase").agg(pl.col("value").unique().sort().str.join(" / "))
    area = pl.when(pl.col("key") == "deepspeed_version").then(pl.lit("DeepSpeed")).otherwise(pl.lit("DeepSpeed config"))
    return per_host.select(area=area, key="key", host="host", value="value", phase="phase").cast(SCHEMA)  # type: ignore[arg-type]


def _ports(tables: RunTables) -> pl.DataFrame:
    ports = tables["ib_ports"]
    if ports.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    latest = ports.sort("ts", nulls_last=False).unique(["host", "ca", "port"], keep="last")
    name = pl.format("{}:{}", "ca", "port")
    rate = pl.when(pl.col("rate_gbps").is_not_null()).then(
        pl.format("{} Gb/s", pl.col("rate_gbps").round(1).cast(pl.String).str.replace(r"\.0$", ""))
    )
    fields = {
        "state": pl.col("state"),
        "rate": rate,
        "width": pl.col("width"),
        "active MTU": pl.col("active_mtu").cast(pl.String),
    }
    parts = [
        _frame(
            latest.filter(expr.is_not_null()),
            "fabric",
            pl.format("port {} {}", name, pl.lit(label)),
            expr,
            "all-reduce",
        )
        for label, expr in fields.items()
    ]
    return pl.concat(parts, how="vertical")
