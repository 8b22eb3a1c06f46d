"""DeepSpeed ingest: every format of docs/formats/deepspeed.md, the real corpus, and the vectorized kinds
against the grammar."""

from __future__ import annotations

import json
import math
import random
import re
import tracemalloc
from pathlib import Path

import polars as pl
import pytest

from synth.deepspeed import DsConfig
from synth.deepspeed import ds_config as make_ds_config
from tests.helpers import FIXTURES, corpus_dir
from tracelens.ingest import InputFile, textlog
from tracelens.ingest.deepspeed import ds_config
from tracelens.ingest.deepspeed.grammar import parse_body
from tracelens.ingest.deepspeed.log import HOT, extract_hot, split_envelope, timer_column
from tracelens.ingest.text.lines import checked_float, read_chunks

EXAMPLES = {  # the complete DeepSpeedExamples logs: progress lines per engine
    "DeepSpeedExamples__step1_supervised_finetuning__opt-1.3b-globalBatchSize128.log": {"0": 736},
    "DeepSpeedExamples__step2_dpo_finetuning__opt-350M_globalBatchSize-32.log": {"0": 236},
    "DeepSpeedExamples__step2_reward_model_finetuning__opt-350m_globalBatchSize-64.log": {"0": 184},
    "DeepSpeedExamples__step3_rlhf_finetuning__actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log": {
        "0": 47,
        "1": 47,
    },
}


def ingest(path: Path):
    return textlog.ingest(InputFile(path, path.name, "log"))


def ingest_text(tmp_path: Path, text: str):
    path = tmp_path / "train.log"
    path.write_text(text)
    return ingest(path)


def corpus(name: str) -> Path:
    return corpus_dir("deepspeed") / name


# ---------------------------------------------------------------- the real corpus


def test_every_corpus_file_is_read_without_error():
    for path in sorted(corpus_dir("deepspeed").glob("*.log")):
        result = ingest(path)
        assert result.account.errors == [], path.name
        assert result.account.parsed > 0, path.name


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_give_one_row_per_logged_step(name):
    path = corpus(name)
    result = ingest(path)
    steps = result.tables["steps"]
    progress = sum("] step=" in line for line in path.read_text().splitlines())
    assert steps.height == progress
    assert dict(steps.group_by("engine").len().iter_rows()) == EXAMPLES[name]
    assert steps.select(pl.struct("engine", "step").is_unique().all()).item()


def test_examples_keep_step_throughput_and_engines_together():
    sft = ingest(corpus(next(iter(EXAMPLES)))).tables["steps"].row(0, named=True)
    assert (sft["step"], sft["skipped"], sft["rank"], sft["epoch"], sft["micro_step"]) == (10, 6, 0, 0, 10)
    assert sft["lr"] == pytest.approx(9.649992967150629e-06)
    assert sft["samples_per_sec"] == pytest.approx(171.97903593624417)
    assert sft["avg_samples_per_sec"] == pytest.approx(173.4455644119137)
    assert str(sft["ts"]) == "2023-04-18 01:46:59.142000+00:00"
    rlhf = ingest(corpus(list(EXAMPLES)[3])).tables["steps"].filter(pl.col("step") == 10).sort("engine")
    assert rlhf["skipped"].to_list() == [4, 3]  # actor and critic, each its own skipped count
    assert rlhf["samples_per_sec"].to_list()[0] == pytest.approx(78.87912870644737)  # the timer line is the actor's
    dpo = ingest(corpus(list(EXAMPLES)[1])).tables["steps"].filter(pl.col("step") == 10).row(0, named=True)
    assert (dpo["micro_step"], dpo["skipped"]) == (20, 4)  # gradient accumulation 2


def test_unrecognised_lines_are_counted_and_sampled():
    account = ingest(corpus("alcf_megatron_deepspeed_aurora_zero2_2024-04-04.log")).account
    # 5 lines of activation checkpointing chatter behind DeepSpeed's prefix (the samples show them
    # first), 11 lines of other programs that no parser reads
    assert account.unrecognized == 16 and account.ignored == 0
    assert "Activation Checkpointing Information" in account.samples[0][1]


def test_megatron_and_new_style_timers_merge_into_one_step():
    rows = ingest(corpus("alcf_megatron_deepspeed_aurora_zero2_2024-04-04.log")).tables["steps"].sort("step")
    first = rows.row(0, named=True)
    assert first["step"] == 1 and rows["step"].to_list() == [1, 2]
    assert first["fwd_ms"] == 6567.66 and first["bwd_ms"] == 17950.35 and first["bwd_inner_ms"] == 17711.19
    assert first["bwd_allreduce_ms"] == 239.11 and first["step_ms"] == 1139.29
    assert first["optimizer_allgather_ms"] == 884.11 and first["optimizer_step_ms"] == 23.44
    assert first["iter_ms"] == 25849.1 and first["samples_per_sec"] == 3.714
    assert first["message"].startswith("time (ms) | fwd: 6567.66")


def test_old_formats():
    v01 = ingest(corpus("ds_docs_cifar10_pdsh_worker0_v0.1_2020-02-06.log"))
    steps = v01.tables["steps"].sort("step")
    assert set(steps["host"].to_list()) == {"worker-0"}
    assert steps.row(0, named=True)["lr"] == 0.001 and steps["step"].to_list()[:3] == [0, 50, 100]
    assert steps.row(1, named=True)["avg_samples_per_sec"] == pytest.approx(1292.6411179579866)
    config = dict(v01.tables["deepspeed_settings"].select("key", "value").iter_rows())
    assert config["allgather_size"] == "500000000" and config["tensorboard_output_path"] == ""
    assert config["optimizer.params.lr"] == "0.001"  # the json block, continued without prefix
    assert config["launcher.dist_world_size"] == "1" and config["NCCL_VERSION"] == "2.4.2"
    assert config["deepspeed_version"] == "2.1"
    micro = ingest(corpus("gh_deepspeed_issue255_2020_forward_microstep.log")).tables["steps"].sort("line")
    timed = micro.filter(pl.col("fwd_ms").is_not_null())
    assert timed.height == 8 and timed["fwd_ms"][0] == 193.65 and timed["bwd_allreduce_ms"][0] == 0.05
    rank0 = ingest(corpus("gh_accelerate_issue1589_2023_rank0_time_ms.log")).tables["steps"].sort("line")
    assert rank0["fwd_ms"].to_list() == [27.41, 27.46] and rank0["bwd_allreduce_ms"].to_list() == [22.40, 22.50]


def test_comms_logger():
    verbose = ingest(corpus("ds_docs_comms_logger_verbose_2022-06-26.log")).tables["comm_ops"].row(0, named=True)
    assert (verbose["op"], verbose["kind"], verbose["rank"], verbose["count"]) == ("reduce_scatter_base", "op", 0, 1)
    assert verbose["msg_bytes"] == round(678.86 * 1024**2) and verbose["total_ms"] == 9.46
    assert (verbose["algbw_gbps"], verbose["busbw_gbps"]) == (1204.52, 1129.23)
    summary = ingest(corpus("ds_docs_comms_logger_summary_debug.log")).tables["comm_ops"]
    assert summary["op"].to_list() == ["broadcast", "broadcast", "reduce_scatter_base"]
    assert summary["caller"].to_list()[-1] == "reduce_scatter_fn"
    last = summary.row(-1, named=True)
    assert (last["count"], last["total_ms"], last["avg_ms"], last["algbw_gbps"], last["busbw_gbps"]) == (
        80,
        1527.17,
        13.94,
        1211.75,
        1136.01,
    )
    padded = ingest(corpus("gh_deepspeed_pr2012_comms_summary_2022.log"))
    assert padded.account.unrecognized == 0 and padded.tables["comm_ops"]["msg_bytes"].to_list()[:2] == [0, 2048]


def test_config_echo_and_zero_init():
    echo = dict(
        ingest(corpus("gh_deepspeed_issue745_config_echo_2021.log"))
        .tables["deepspeed_settings"]
        .select("key", "value")
        .iter_rows()
    )
    assert echo["checkpoint_tag_validation_enabled"] == "True" and echo["allreduce_always_fp32"] == "False"
    assert echo["dynamic_loss_scale_args"].startswith("{'init_scale': 65536")
    init = dict(
        ingest(corpus("gh_accelerate_issue1970_zero2_init_2023.log"))
        .tables["deepspeed_settings"]
        .select("key", "value")
        .iter_rows()
    )
    assert init["zero_optimization.reduce_bucket_size"] == "500000000"
    assert init["zero_optimization.cpu_offload"] == "False"
    dpo = ingest(corpus(list(EXAMPLES)[1])).tables["deepspeed_settings"]
    assert set(dpo["engine"].drop_nulls().to_list()) == {"0", "1"}  # two echoes: actor and reference
    first = dict(dpo.filter(pl.col("engine") == "0").select("key", "value").iter_rows())
    assert first["zero_optimization.overlap_comm"] in ("True", "true")
    assert first["zero_optimization.offload_optimizer.device"] == "none"
    assert first["autotuning_config.metric"] == "throughput"  # a multi-line JSON value
    assert first["train_batch_size"] == "32" and first["gradient_accumulation_steps"] == "2"


# ---------------------------------------------------------------- wrappers and versions (formats from the docs)

STAMP = "[2023-06-21 07:39:09,625] [INFO] [logging.py:96:log_dist] [Rank 0] "


def test_prefix_anywhere_in_the_line(tmp_path):
    lines = [
        "gpu-7: " + STAMP + "step=12, skipped=0, lr=[0.1], mom=[0.9]",
        "gpu-7:   3%|███          | 12/345 [00:07<06:50,  1.23s/it]"
        + STAMP
        + "time (ms) | fwd: 10.00 | bwd: 20.00 | step: 5.00",
        "2023-08-02 00:41:17.936 | INFO     | __main__:log_dist:54 - [Rank 0] step=13, skipped=0, lr=[0.1], mom=[0.9]",
        "[INFO|trainer.py:1013] 2021-10-08 20:03:14,331 >> step=14, skipped=1, lr=[0.1], mom=[0.9]",
        "2023-08-02 00:41:18.001 | INFO     | __main__:main:10 - loss went down",  # an app's own loguru line: not ours
        "steps: 100 loss: 0.6931 iter time (s): 0.532 samples/sec: 240.4",
    ]
    result = ingest_text(tmp_path, "\n".join(lines) + "\n")
    steps = result.tables["steps"].sort("line")
    assert steps["step"].to_list() == [12, 13, 14, 100]
    assert steps["host"].to_list() == ["gpu-7", None, None, None]
    assert steps.filter(pl.col("step") == 12)["fwd_ms"].item() == 10.0
    assert steps.filter(pl.col("step") == 100)["iter_ms"].item() == 532.0
    assert str(steps.filter(pl.col("step") == 13)["ts"].item()) == "2023-08-02 00:41:17.936000+00:00"
    assert (result.account.parsed, result.account.unrecognized) == (5, 1)  # the app's own line


def test_unknown_message_with_deepspeed_prefix_is_unrecognized_and_broken_kinds_too(tmp_path):
    text = (
        STAMP
        + "something DeepSpeed says that tracelens does not know\n"
        + STAMP
        + "step=oops, skipped=0\n"
        + "plain app line\n"
    )
    result = ingest_text(tmp_path, text)
    assert (result.account.unrecognized, result.account.parsed) == (3, 0)
    assert [line for line, _ in result.account.samples] == [1, 2, 3]  # DeepSpeed's own lines first
    assert "steps" not in result.tables


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\xff\xfe" * 1000, b"[2023-06-21 07:39:09,6", b"time (ms) | fwd: \r\n" * 3, "é".encode("latin-1") * 50],
)
def test_bad_input_never_raises(tmp_path, data):
    path = tmp_path / "train.log"
    path.write_bytes(data)
    assert ingest(path).account.errors == []


def test_two_engines_with_their_own_timers(tmp_path):
    a, b = STAMP + "step=10, skipped=0, lr=[0.1], mom=[0.9]", STAMP + "step=10, skipped=2, lr=[0.2], mom=[0.9]"
    timers = STAMP + "time (ms) | fwd: {0} | bwd: {0} | bwd_inner: {0} | bwd_allreduce: 0.00 | step: 1.00"
    result = ingest_text(tmp_path, "\n".join([a, timers.format(1.0), b, timers.format(2.0)]) + "\n")
    rows = result.tables["steps"].sort("engine")
    assert rows.select("engine", "step", "skipped", "fwd_ms").rows() == [("0", 10, 0, 1.0), ("1", 10, 2, 2.0)]


# ---------------------------------------------------------------- ds_config.json


def test_ds_config_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(make_ds_config(DsConfig(overlap_comm=False)), indent=2))
    assert ds_config.sniff(path.read_bytes())
    result = ds_config.ingest(InputFile(path, "node01/ds_config.json", "ds_config"))
    rows = {r["key"]: r for r in result.tables["deepspeed_settings"].iter_rows(named=True)}
    assert rows["zero_optimization.overlap_comm"]["value"] == "false"
    assert rows["zero_optimization.reduce_bucket_size"]["value"] == "500000000.0"
    assert rows["zero_optimization.offload_optimizer.device"]["value"] == "none"
    assert (
        rows["zero_optimization.overlap_comm"]["line"]
        == path.read_text().splitlines().index('    "overlap_comm": false,') + 1
    )
    assert all(r["source"] == "ds_config.json" for r in rows.values())


def test_ds_config_bad_json_is_one_line_error(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"zero_optimization": {"stage": 2,,}')
    assert ds_config.sniff(path.read_bytes()) and not ds_config.sniff(b'{"name": "not deepspeed"}')
    errors = ds_config.ingest(InputFile(path, "ds_config.json", "ds_config")).account.errors
    assert len(errors) == 1 and errors[0].startswith("ds_config.json: not valid JSON") and "\n" not in errors[0]


def test_a_ds_config_head_before_gigabytes_is_refused_before_it_is_read(tmp_path):
    """A config's head before a sparse hole of 4 GiB was read whole: 8 GB of memory for a few bytes."""
    path = tmp_path / "ds_config.json"
    with path.open("wb") as fh:
        fh.write(b'{\n  "train_micro_batch_size_per_gpu": 4,\n')
        fh.truncate(4 << 30)
    tracemalloc.start()
    try:
        result = ds_config.ingest(InputFile(path, "ds_config.json", "ds_config"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.account.errors == [
        "ds_config.json: DeepSpeed config of 4,294,967,296 bytes is larger than the 16 MiB read"
    ]
    assert peak < 16 << 20 and "deepspeed_settings" not in result.tables


# ---------------------------------------------------------------- vectorized kinds == grammar


# Synthetic lines in the documented shapes of the hot kinds the fixtures do not log
# (docs/formats/deepspeed.md), so the agreement test covers every kind without the corpus.
SYNTHETIC_HOT = [
    "[2024-03-01 10:00:00,001] [INFO] [logging.py:96:log_dist] [Rank 0] comm op: all_reduce | time (ms): 3.21"
    " | msg size: 256.0 MB | algbw (Gbps): 652.11 | busbw (Gbps): 611.35",
    "[2022-06-26 01:00:00,002] [INFO] [logging.py:69:log_dist] [Rank 0] rank=0 | comm op: all_gather_base"
    " | time (ms): 7.5 | msg size: 1.5 GB | algbw (Gbps): 901.2  | busbw (Gbps): 844.87",
    " iteration       12/    5000 | consumed samples:         1536 | elapsed time per iteration (ms): 812.4"
    " | learning rate: 1.500E-04 | global batch size:   128 | lm loss: 7.731204E+00 | loss scale: 1.0"
    " | samples per second: 157.563 |",
    "steps: 100 loss: 2.3456 iter time (s): 0.523 samples/sec: 244.678",
]


def _hot_bodies() -> list[tuple[str, pl.DataFrame]]:
    paths = sorted(FIXTURES.glob("ds-*/*/*.log"))
    if (corpus_root := FIXTURES.parent.parent / "shared" / "corpus" / "deepspeed").is_dir():
        paths += sorted(corpus_root.glob("*.log"))
    synthetic = pl.DataFrame({"line": list(range(1, len(SYNTHETIC_HOT) + 1)), "text": SYNTHETIC_HOT})
    out = [("synthetic", split_envelope(synthetic))]
    for path in paths:
        for chunk in read_chunks(path):
            out.append((path.name, split_envelope(chunk)))
    return out


def _by_grammar(kind: str, body: str) -> dict | None:
    """The grammar's fields in the vectorized extraction's columns."""
    fields = parse_body(kind, body)
    if fields is None:
        return None
    if kind == "progress":
        return {"step": fields["step"], "skipped": fields["skipped"], "lr": (fields["lr"] or [None])[0]}
    if kind == "timers":
        return {col: v for name, v in fields.items() if (col := timer_column(name))}
    if kind == "throughput":
        return {k: fields.get(k) for k in ("epoch", "micro_step", "step", "samples_per_sec", "avg_samples_per_sec")}
    if kind == "iteration":
        labels = {
            "iter_ms": "elapsed time per iteration (ms)",
            "lr": "learning rate",
            "samples_per_sec": "samples per second",
        }
        return {"step": fields["step"]} | {
            c: checked_float(fields[label]) for c, label in labels.items() if label in fields
        }
    if kind == "pipe_step":
        return {
            "step": fields["step"],
            "iter_ms": fields["iter_s"] * 1000,
            "samples_per_sec": fields["samples_per_sec"],
        }
    return {k: fields.get(k) for k in ("op", "caller", "msg_bytes", "latency_ms", "algbw_gbps", "busbw_gbps")}


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b))


def test_vectorized_kinds_equal_the_grammar():
    checked = dict.fromkeys(HOT, 0)
    for name, recs in _hot_bodies():
        for kind, pattern in HOT.items():
            rows = recs.filter(pl.col("body").str.contains(pattern))
            if rows.height == 0:
                continue
            fast = extract_hot(kind, rows)[0].to_dicts()
            for body, got in zip(rows["body"].to_list(), fast):
                want = _by_grammar(kind, body)
                assert want is not None, f"{name}: grammar rejects a {kind} body the regex accepts: {body!r}"
                for col, value in want.items():
                    assert _same(got[col], value), f"{name}: {kind}.{col}: {got[col]!r} != {value!r} in {body!r}"
                checked[kind] += 1
    assert all(checked[k] for k in ("progress", "timers", "throughput", "iteration", "comm_op")), checked


def _redrawn(body: str, rand: random.Random) -> str:
    """The body with each number that stands alone drawn anew, as DeepSpeed may print it: an integer, a
    decimal, an exponent, a huge value."""
    forms = [
        lambda: str(rand.randrange(10 ** rand.randint(1, 6))),
        lambda: f"{rand.uniform(0, 1e4):.{rand.randint(0, 6)}f}",
        lambda: f"{rand.uniform(0, 10):.3E}",
        lambda: f"{rand.uniform(0, 10):.2e}".replace("e-0", "e-"),
        lambda: "1" + "0" * rand.randint(12, 30),
    ]
    return re.sub(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])", lambda m: rand.choice(forms)(), body)


def _mutated(body: str, rand: random.Random) -> str:
    """The body with a character dropped or doubled, a blank doubled, dropped or made a tab."""
    at = rand.randrange(len(body))
    return rand.choice(
        [
            lambda: body[:at] + body[at + 1 :],
            lambda: body[:at] + body[at] + body[at:],
            lambda: body[:at] + " " + body[at:],
            lambda: body.replace(" ", "", 1),
            lambda: body.replace(" ", "\t", 1),
        ]
    )()


def _fast_vs_grammar(kind: str, bodies: list[str], misses: bool) -> list[str]:
    """Every body of `bodies` where the vectorized path and the grammar disagree on `kind`: a body the
    regex takes must parse to the same fields, or hold a number out of range for both (the fast path
    leaves it out as bad, the grammar raises); with `misses`, a body the grammar parses must be taken."""
    frame = pl.DataFrame(
        {"line": range(len(bodies)), "host": None, "ts": None, "ts_text": None, "rank": None, "body": bodies},
        schema={"line": pl.Int64, "host": pl.String, "ts": pl.Datetime("ns", "UTC"), "ts_text": pl.String,
                "rank": pl.Int64, "body": pl.String},
    )  # fmt: skip
    rows, bad = extract_hot(kind, frame.filter(pl.col("body").str.contains(HOT[kind])))
    fast, bad_lines = {row["line"]: row for row in rows.to_dicts()}, set(bad.to_list())
    problems = []
    for line, body in enumerate(bodies):
        try:
            want = _by_grammar(kind, body)
            if want and any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in want.values()):
                raise ValueError("an integer no Int64 column holds")
        except ValueError:  # a number out of range
            if line in fast:
                problems.append(f"{kind}: the fast path keeps a value the grammar refuses: {body!r}")
            continue
        if line in fast:
            got = fast[line]
            if want is None or not all(_same(got[c], v) for c, v in want.items()):
                problems.append(f"{kind}: {body!r}\n  fast {got}\n  lark {want}")
        elif want is not None and (line in bad_lines or misses):
            problems.append(f"{kind}: the fast path leaves out {body!r}, the grammar reads {want}")
    return problems


def test_vectorized_kinds_equal_the_grammar_on_random_bodies():
    """Bodies of every hot kind with their numbers drawn anew, then mutated: the fast path and the
    grammar agree on each (lark is the specification; the regexes only make it fast)."""
    rand = random.Random(11)
    by_kind: dict[str, list[str]] = {kind: [] for kind in HOT}
    for _, recs in _hot_bodies():
        for kind, pattern in HOT.items():
            bodies = recs.filter(pl.col("body").str.contains(pattern))["body"]
            by_kind[kind] += bodies.unique().sort().head(40).to_list()
    problems = []
    for kind, bodies in by_kind.items():
        assert bodies, f"no {kind} body to draw from"
        redrawn = [_redrawn(body, rand) for _ in range(10) for body in bodies]
        problems += _fast_vs_grammar(kind, redrawn, misses=True)
        problems += _fast_vs_grammar(kind, [_mutated(body, rand) for body in redrawn], misses=False)
    assert problems == []


def test_bare_rank_tagged_timer_lines_of_deepspeed_019_belong_to_the_step_before(tmp_path):
    """DeepSpeed 0.19 prints its timers as `[Rank 1] time (ms) | ...`, no logger prefix (real lab
    runs, fixtures/lab-*): they are read, with their rank, into the step line before them."""
    step = (
        "[2026-12-01 03:12:24,553] [INFO] [logging.py:123:log_dist] "
        "[Rank 1] step={n}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
    )
    text = "\n".join(
        f"{step.format(n=n)}\n"
        f"[Rank 1] time (ms) | fwd: {40 + n} | bwd: 79.12 | bwd_inner: 69.41 | bwd_allreduce: 9.67 | step: 6.13\n"
        "[Rank 1] time (ms) | optimizer_allgather: 6.85 | optimizer_gradients: 0.22 | optimizer_step: 3.68\n"
        f"other output {n}"
        for n in (240, 241)
    )
    result = ingest_text(tmp_path, text + "\n")
    rows = result.tables["steps"].filter(pl.col("fwd_ms").is_not_null()).sort("step")
    assert rows.select("rank", "step", "fwd_ms", "bwd_allreduce_ms").rows() == [
        (1, 240, 280.0, 9.67),
        (1, 241, 281.0, 9.67),
    ]
    assert result.account.parsed == 6 and result.account.unrecognized == 2  # the `other output` lines


@pytest.mark.parametrize(
    "cells",
    [
        ["fwd_microstep: {}", "bwd_microstep: {}", "step_microstep: {}"],
        ["forward: {}", "backward: {}", "my_timer: {}", "step: {}"],  # a timer no column takes
        ["fwd: {}", "forward: {}", "step: {}"],  # one column given twice
    ],
)
def test_timer_lines_of_one_set_read_as_the_general_reading_does(cells: list[str]):
    rng = random.Random(len(cells))
    values = ["12.5", "0", "nan", "1e309", "-3", "7.25e2", "inf"]
    bodies = ["time (ms) | " + " | ".join(cell.format(rng.choice(values)) for cell in cells) for _ in range(200)] + [
        "rank=3 time (ms) | " + " | ".join(cell.format("1.5") for cell in cells)
    ]
    recs = pl.DataFrame(
        {"line": range(len(bodies)), "host": "n1", "ts": None, "ts_text": None, "rank": 0, "body": bodies},
        schema_overrides={"ts": pl.Datetime("ns", "UTC"), "ts_text": pl.String},
    )
    fast = extract_hot("timers", recs)
    # the same bodies with one line of other timers: the chunk takes the general reading
    odd = pl.DataFrame(
        {"line": [-1], "host": "n1", "ts": None, "ts_text": None, "rank": 0, "body": ["time (ms) | other: 1"]},
        schema=recs.schema,
    )
    general = extract_hot("timers", pl.concat([odd, recs]))
    assert fast[0].equals(general[0].filter(pl.col("line") >= 0))
    assert fast[1].to_list() == [line for line in general[1].to_list() if line >= 0]
    assert fast[1].len() > 0  # the out-of-range values were found bad
