"""DeepSpeed log variants the corpus lacks: other versions and launchers, built line by line from
the formats documented in docs/formats/deepspeed.md.

Each test writes a small log in one version's or wrapper's shape and checks what lands in
`steps`, `comm_ops` and `deepspeed_settings`, and how the lines are counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.ingest import InputFile, textlog

LOGGER = "[2023-06-21 07:39:09,625] [INFO] [logging.py:96:log_dist] "  # v0.2+
RANK0 = LOGGER + "[Rank 0] "
TIMER = "[2023-06-21 07:39:09,626] [INFO] [timer.py:260:stop] "  # ThroughputTimer: no [Rank N]
PROGRESS = "step={}, skipped=0, lr=[0.0001, 0.0001], mom=[(0.9, 0.95), (0.9, 0.95)]"


def ingest(tmp_path: Path, lines: list[str], name: str = "train.log", newline: str = "\n"):
    path = tmp_path / name
    path.write_bytes((newline.join(lines) + newline).encode())
    return textlog.ingest(InputFile(path, name, "log"))


def steps(result) -> list[dict]:
    return result.tables["steps"].sort("line").to_dicts()


def counts(result) -> tuple[int, int, int]:
    return result.account.parsed, result.account.unrecognized, result.account.ignored


# ---------------------------------------------------------------- versions of the step lines


def test_v01_logger_progress_and_bare_timers(tmp_path):
    result = ingest(
        tmp_path,
        [
            "[INFO 2020-02-06 19:53:56] rank:0 step=50, skipped=1, lr=[0.001], mom=[[0.8, 0.999]]",
            "time (ms) | forward_microstep: 193.65 | backward_microstep: 300.10 | backward_inner_microstep: 250.00"
            " | backward_allreduce_microstep: 0.05 | step_microstep: 3.00",
            (
                "time (ms) | forward: 193.65 | backward: 300.10 | "
                "backward_inner: 250.00 | backward_allreduce: 0.05 | step: 3.00"
            ),
        ],
    )
    (row,) = steps(result)
    assert (row["step"], row["skipped"], row["lr"], row["rank"]) == (50, 1, 0.001, 0)
    assert (row["fwd_ms"], row["bwd_ms"], row["bwd_inner_ms"], row["bwd_allreduce_ms"], row["step_ms"]) == (
        193.65,
        300.1,
        250.0,
        0.05,
        3.0,
    )
    assert str(row["ts"]) == "2020-02-06 19:53:56+00:00"
    assert counts(result) == (3, 0, 0)


def test_v03_rank_timers_printed_bare(tmp_path):
    body = "rank=3 time (ms) | forward_microstep: 10.00 | backward_microstep: 20.00 | backward_inner_microstep: 15.00"
    result = ingest(tmp_path, [body + " | backward_allreduce_microstep: 5.00 | step_microstep: 1.00"])
    (row,) = steps(result)
    assert (row["rank"], row["fwd_ms"], row["bwd_allreduce_ms"], row["ts"]) == (3, 10.0, 5.0, None)


def test_v057_to_v0100_rank_timers_behind_log_dist(tmp_path):
    micro = "rank=0 time (ms) | forward_microstep: 27.41 | backward_microstep: 80.00 | backward_inner_microstep: 57.60"
    micro += " | backward_allreduce_microstep: 22.40 | step_microstep: 4.00"
    result = ingest(
        tmp_path,
        [
            RANK0 + PROGRESS.format(10),
            RANK0 + micro,
            RANK0 + micro.replace("_microstep", ""),
        ],
    )
    (row,) = steps(result)
    assert (row["step"], row["rank"], row["fwd_ms"], row["bwd_allreduce_ms"], row["step_ms"]) == (
        10,
        0,
        27.41,
        22.4,
        4.0,
    )
    assert row["message"].startswith("rank=0 time (ms) | forward: 27.41")  # the global line is the evidence


def test_v0101_short_names_zero_optimizer_and_throughput(tmp_path):
    result = ingest(
        tmp_path,
        [  # engine.step(): the ZeRO optimizer's timers, the progress line, then the engine's timers
            RANK0 + "time (ms) | optimizer_allgather: 12.50 | optimizer_gradients: 3.25 | optimizer_step: 40.00",
            RANK0 + PROGRESS.format(10),
            RANK0 + "time (ms) | fwd_microstep: 97.76 | bwd_microstep: 246.21 | bwd_inner_microstep: 216.15"
            " | bwd_allreduce_microstep: 30.06 | step_microstep: 71.04",
            RANK0 + "time (ms) | fwd: 97.76 | bwd: 246.21 | bwd_inner: 216.15 | bwd_allreduce: 30.06 | step: 71.04",
            TIMER + "epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=171.84931800059496,"
            " CurrSamplesPerSec=170.5, MemAllocated=5.53GB, MaxMemAllocated=8.61GB",
        ],
    )
    (row,) = steps(result)
    assert (row["step"], row["fwd_ms"], row["bwd_inner_ms"], row["step_ms"]) == (10, 97.76, 216.15, 71.04)
    assert (row["optimizer_allgather_ms"], row["optimizer_gradients_ms"], row["optimizer_step_ms"]) == (
        12.5,
        3.25,
        40.0,
    )
    assert (row["epoch"], row["micro_step"], row["samples_per_sec"]) == (0, 20, 170.5)
    assert row["avg_samples_per_sec"] == pytest.approx(171.84931800059496)


def test_zero3_timers_keep_optimizer_step_and_ignore_the_rest(tmp_path):
    result = ingest(
        tmp_path,
        [
            RANK0 + "time (ms) | optimizer_step: 2.75 | optimizer_swap_in_state: 0.10 | init_optimizer_state: 0.20",
            RANK0 + PROGRESS.format(4),
            RANK0 + "time (ms) | fwd: 1.00 | bwd: 2.00 | bwd_inner: 1.50 | bwd_allreduce: 0.50 | step: 3.00",
        ],
    )
    (row,) = steps(result)
    assert (row["step"], row["optimizer_step_ms"], row["step_ms"]) == (4, 2.75, 3.0)
    assert counts(result) == (3, 0, 0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (TIMER + "0/20, RunningAvgSamplesPerSec=12.5, CurrSamplesPerSec=13.0, "
                 "MemAllocated=1.2GB, MaxMemAllocated=2.3GB",
         {"epoch": 0, "step": 20, "avg_samples_per_sec": 12.5, "samples_per_sec": 13.0}),  # v0.7
        (TIMER + "0/50, SamplesPerSec=1292.6411179579866, vm percent: 12.3, swap percent: 0.0",
         {"epoch": 0, "step": 50, "avg_samples_per_sec": 1292.6411179579866, "samples_per_sec": None}),  # up to v0.6
        ("steps: 100 loss: 0.6931 iter time (s): 0.532 samples/sec: 240.4",
         {"step": 100, "iter_ms": 532.0, "samples_per_sec": 240.4, "host": None}),  # pipeline engine, plain print
        ("steps: 200 loss: 0.5000 lm_loss: 0.4900 iter time (s): 1.250 samples/sec: 102.4",
         {"step": 200, "iter_ms": 1250.0, "samples_per_sec": 102.4}),
    ],
)  # fmt: skip
def test_throughput_and_pipeline_lines(tmp_path, line, expected):
    result = ingest(tmp_path, [line])
    (row,) = steps(result)
    assert {k: row[k] for k in expected} == expected
    assert counts(result) == (1, 0, 0)


def test_pipeline_timers_are_kept_as_lines_of_their_step(tmp_path):
    result = ingest(
        tmp_path,
        [
            RANK0 + PROGRESS.format(1),
            RANK0 + "time (ms) | pipe_send_output: 1.20 | pipe_send_grad: 0.80 | pipe_recv_input: 3.10"
            " | pipe_recv_grad: 2.00",
        ],
    )
    assert [r["step"] for r in steps(result)] == [1] and counts(result) == (2, 0, 0)


def test_overflow_is_known_but_not_a_step(tmp_path):
    result = ingest(
        tmp_path,
        [
            "[2023-06-21 07:39:09,625] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
            "Skipping step. Attempted loss scale: 65536, reducing to 32768",
            RANK0 + "step=1, skipped=1, lr=[0.0001], mom=[(0.9, 0.95)]",
        ],
    )
    assert [(r["step"], r["skipped"]) for r in steps(result)] == [(1, 1)]
    assert counts(result) == (1, 0, 1)


@pytest.mark.parametrize("prefix", ["", RANK0, "[default0]:" + RANK0])
def test_megatron_iteration_lines(tmp_path, prefix):
    line = (
        " iteration        3/  317892 | consumed samples:          288 | elapsed time per iteration (ms): 25849.1"
        " | learning rate: 1.500E-04 | global batch size:    96 | lm loss: 1.085E+01 | loss scale: 1.0"
        " | number of skipped iterations:   1 | samples per second: 3.714 |"
    )
    (row,) = steps(ingest(tmp_path, [prefix + line.lstrip() if prefix else line]))
    assert (row["step"], row["iter_ms"], row["lr"], row["samples_per_sec"], row["skipped"]) == (
        3,
        25849.1,
        1.5e-4,
        3.714,
        1,
    )


# ---------------------------------------------------------------- wrappers

WRAPPED = [
    ("worker-0: ", {"host": "worker-0"}),  # pdsh, host names
    ("104.171.201.172: ", {"host": "104.171.201.172"}),  # pdsh, IPs
    ("[default0]:", {"host": None}),  # torchrun: role and local rank, not the global rank
    ("[rank5]:", {"host": None, "rank": 5}),  # torchrun 2.2+
    ("[1,5]<stdout>:", {"host": None, "rank": 5}),  # Open MPI --tag-output
    ("node3: [rank5]:", {"host": "node3", "rank": 5}),
    ("  3%|███▎          | 12/345 [00:07<06:50,  1.23s/it]", {"host": None}),  # tqdm glued before the record
]


@pytest.mark.parametrize(("wrapper", "expected"), WRAPPED, ids=[w for w, _ in WRAPPED])
def test_wrapped_logger_lines(tmp_path, wrapper, expected):
    logged = LOGGER + "[Rank 5] "
    result = ingest(
        tmp_path,
        [
            wrapper + logged + PROGRESS.format(7),
            wrapper + logged + "time (ms) | fwd: 1.00 | bwd: 2.00 | bwd_inner: 1.50 | bwd_allreduce: 0.50 | step: 3.00",
            wrapper + TIMER + "epoch=0/micro_step=7/global_step=7, RunningAvgSamplesPerSec=9.5, CurrSamplesPerSec=9.75,"
            " MemAllocated=1.0GB, MaxMemAllocated=2.0GB",
        ],
    )
    rows = steps(result)
    ranked = [r for r in rows if r["rank"] == 5]
    assert len(ranked) == 1 and (ranked[0]["step"], ranked[0]["fwd_ms"], ranked[0]["skipped"]) == (7, 1.0, 0)
    assert all(r["host"] == expected["host"] for r in rows)
    assert str(ranked[0]["ts"]) == "2023-06-21 07:39:09.625000+00:00"
    throughput = [r for r in rows if r["samples_per_sec"] is not None]
    assert throughput[0]["rank"] == expected.get("rank")  # no [Rank N]: the tag's rank, else none (rank 0's row)
    assert counts(result) == (3, 0, 0)


@pytest.mark.parametrize(
    "wrapper",
    ["", "worker-1: ", "10.0.0.7: ", "[default0]:", "[rank0]:", "[1,0]<stdout>:"],
)
def test_bare_prints_behind_launcher_tags(tmp_path, wrapper):
    result = ingest(
        tmp_path,
        [
            wrapper
            + (
                "rank=0 time (ms) | forward: 5.00 | backward: 6.00 | "
                "backward_inner: 4.00 | backward_allreduce: 2.00 | step: 1.00"
            ),
            wrapper + "steps: 10 loss: 0.6931 iter time (s): 0.500 samples/sec: 64.000",
        ],
    )
    rows = steps(result)
    assert {r["step"] for r in rows} == {1, 10}
    assert [r["fwd_ms"] for r in rows if r["fwd_ms"] is not None] == [5.0]
    assert counts(result) == (2, 0, 0)


def test_foreign_loggers_carrying_deepspeed_messages(tmp_path):
    result = ingest(
        tmp_path,
        [
            "2023-08-02 00:41:17.936 | INFO     | __main__:log_dist:54 - [Rank 0] " + PROGRESS.format(13),
            "[INFO|trainer.py:1013] 2021-10-08 20:03:14,331 >> " + PROGRESS.format(14),
            "2023-08-02 00:41:18.001 | INFO     | __main__:main:10 - loss went down",  # the app's own line
            "[INFO|trainer.py:1020] 2021-10-08 20:03:15,000 >> ***** Running training *****",
        ],
    )
    rows = steps(result)
    assert [r["step"] for r in rows] == [13, 14]
    assert [str(r["ts"]) for r in rows] == ["2023-08-02 00:41:17.936000+00:00", "2021-10-08 20:03:14.331000+00:00"]
    assert counts(result) == (2, 2, 0)  # other loggers' own lines: no parser reads them, so unrecognised


def test_crlf_logs_read_the_same(tmp_path):
    lines = [
        "worker-0: " + RANK0 + PROGRESS.format(3),
        "worker-0: " + RANK0 + "time (ms) | fwd: 1.00 | bwd: 2.00 | step: 3.00",
    ]
    unix, dos = ingest(tmp_path, lines, "unix.log"), ingest(tmp_path, lines, "dos.log", newline="\r\n")
    assert steps(unix) == [{**row, "file": "unix.log"} for row in steps(dos)]
    assert steps(dos)[0]["message"].endswith("step: 3.00")


def test_per_rank_logs_take_the_rank_from_the_file_name(tmp_path):
    lines = [
        "rank=0 time (ms) | forward: 5.00 | backward: 6.00 | step: 1.00",
        LOGGER + "[Rank 3] " + PROGRESS.format(2),
    ]
    result = ingest(tmp_path, lines, name="20230621073909_rank3.log")
    assert {r["rank"] for r in steps(result)} == {0, 3}  # a line's own rank wins over the file's
    bare = ingest(
        tmp_path, ["time (ms) | forward: 5.00 | backward: 6.00 | step: 1.00"], name="20230621073909_rank3.log"
    )
    assert steps(bare)[0]["rank"] == 3


def test_engines_interleaved_on_many_hosts(tmp_path):
    def host(h: str, rank: int, step: int, skipped: int, fwd: float) -> list[str]:
        logged = f"{h}: {LOGGER}[Rank {rank}] "
        return [
            logged + f"step={step}, skipped={skipped}, lr=[0.0001], mom=[(0.9, 0.95)]",
            logged + f"time (ms) | fwd: {fwd:.2f} | bwd: 2.00 | bwd_inner: 1.50 | bwd_allreduce: 0.50 | step: 3.00",
        ]

    lines = (
        host("n1", 0, 10, 4, 1.0) + host("n2", 8, 10, 4, 1.5) + host("n1", 0, 10, 3, 2.0) + host("n2", 8, 10, 3, 2.5)
    )
    rows = steps(ingest(tmp_path, lines))  # actor then critic, each on both nodes
    got = sorted((r["host"], r["rank"], r["engine"], r["skipped"], r["fwd_ms"]) for r in rows)
    assert got == [("n1", 0, "0", 4, 1.0), ("n1", 0, "1", 3, 2.0), ("n2", 8, "0", 4, 1.5), ("n2", 8, "1", 3, 2.5)]


# ---------------------------------------------------------------- comms logger


def test_comms_logger_verbose_both_eras(tmp_path):
    result = ingest(
        tmp_path,
        [
            RANK0 + "comm op: all_reduce | time (ms): 3.21 | msg size: 256.0 MB"
            " | algbw (Gbps): 652.11 | busbw (Gbps): 611.35",
            "[2022-06-26 01:00:00,002] [INFO] [logging.py:69:log_dist] [Rank 0] rank=0 | comm op: reduce_scatter_base"
            " | time (ms): 9.46 | msg size: 678.86 MB | algbw (Gbps): 1204.52  | busbw (Gbps): 1129.23 ",
            RANK0 + "comm op: broadcast | [Caller Func: _broadcast_model] | time (ms): 0.50 | msg size: 2.0 KB"
            " | algbw (Gbps): 0.03 | busbw (Gbps): 0.03",
        ],
    )
    ops = result.tables["comm_ops"].sort("line").to_dicts()
    assert [(o["op"], o["kind"], o["rank"], o["caller"]) for o in ops] == [
        ("all_reduce", "op", 0, None), ("reduce_scatter_base", "op", 0, None),
        ("broadcast", "op", 0, "_broadcast_model"),
    ]  # fmt: skip
    assert [o["msg_bytes"] for o in ops] == [256 * 1024**2, round(678.86 * 1024**2), 2048]
    assert (ops[1]["total_ms"], ops[1]["algbw_gbps"], ops[1]["busbw_gbps"]) == (9.46, 1204.52, 1129.23)
    assert counts(result) == (3, 0, 0)


def _cells(*values: str) -> str:
    return "".join(f"{v: <20}" for v in values)


def test_comms_summary_with_callers_and_straggler_table(tmp_path):
    header = _cells(
        "Comm. Op",
        "Message Size",
        "Count",
        "Total Latency(ms)",
        "Avg Latency(ms)",
        "tput_avg (Gbps)",
        "busbw_avg (Gbps)",
    )
    straggler = _cells(
        "Comm. Op",
        "Message Size",
        "Count",
        "Total comm lat(ms)",
        "Total straggler(ms)",
        "Avg comm lat(ms)",
        "Avg straggler(ms)",
    )
    lines = [
        header,
        "all_reduce | [Caller Func: allreduce_bucket]",
        _cells("", "256.0 MB", "40", "160.00", "3.98", "652.11", "611.35"),
        _cells("", "2.0 KB", "2", "0.10", "0.05", "0.33", "0.31"),
        "broadcast",
        _cells("", "0B", "1", "0.02", "0.02", "0.00", "0.00"),
        "_______________________________",
        "Breakdown with straggler effect",
        "-------------------------------",
        straggler,
        "all_reduce | [Caller Func: allreduce_bucket]",
        _cells("", "256.0 MB", "40", "160.00", "120.00", "3.98", "2.99"),
    ]
    result = ingest(tmp_path, ["worker-0: " + LOGGER + "[Rank 0] " + PROGRESS.format(1), *lines])
    ops = result.tables["comm_ops"].sort("line").to_dicts()
    assert [(o["op"], o["kind"], o["msg_bytes"], o["count"]) for o in ops] == [
        ("all_reduce", "summary", 256 * 1024**2, 40), ("all_reduce", "summary", 2048, 2),
        ("broadcast", "summary", 0, 1), ("all_reduce", "straggler", 256 * 1024**2, 40),
    ]  # fmt: skip
    assert ops[0]["caller"] == "allreduce_bucket" and (ops[0]["avg_ms"], ops[0]["busbw_gbps"]) == (3.98, 611.35)
    assert (ops[3]["straggler_total_ms"], ops[3]["straggler_avg_ms"], ops[3]["avg_ms"]) == (120.0, 2.99, 3.98)
    assert counts(result) == (len(lines) + 1, 0, 0)


# ---------------------------------------------------------------- config echo and launcher


def config_of(result) -> dict[str, str]:
    return dict(result.tables["deepspeed_settings"].select("key", "value").iter_rows())


@pytest.mark.parametrize("bucket", ["500,000,000", "500000000"])
def test_config_echo_with_json_and_pydantic_values(tmp_path, bucket):
    zero = (
        f"stage=2 contiguous_gradients=True reduce_scatter=True reduce_bucket_size={bucket} allgather_partitions=True"
        f" allgather_bucket_size={bucket} overlap_comm=True offload_param=None"
        " offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='none', nvme_path=None, pin_memory=False)"
    )
    echo = "[2023-06-21 07:39:08,001] [INFO] [config.py:964:print] "
    result = ingest(
        tmp_path,
        [
            echo + "DeepSpeedEngine configuration:",
            echo + "  activation_checkpointing_config  {",
            '    "partition_activations": false, ',
            '    "number_checkpoints": null',
            "}",
            echo + "  checkpoint_tag_validation_enabled  True",
            echo + "  gradient_accumulation_steps .. 2",
            echo + "  zero_config .................. " + zero,
            echo + "  json = {",
            '    "train_batch_size": 64, ',
            '    "zero_optimization": {',
            '        "stage": 2',
            "    }",
            "}",
            "[2023-06-21 07:39:08,002] [INFO] [stage_1_and_2.py:149:__init__] Reduce bucket size " + bucket,
            "[2023-06-21 07:39:08,003] [INFO] [stage_1_and_2.py:150:__init__] Allgather bucket size " + bucket,
        ],
    )
    config = config_of(result)
    assert config["activation_checkpointing_config.partition_activations"] == "false"
    assert config["checkpoint_tag_validation_enabled"] == "True" and config["gradient_accumulation_steps"] == "2"
    assert config["zero_optimization.reduce_bucket_size"] == "500000000"
    assert config["zero_optimization.overlap_comm"] == "True"
    assert config["zero_optimization.offload_optimizer.device"] == "none"
    assert config["train_batch_size"] == "64" and config["zero_optimization.stage"] == "2"
    assert config["zero_optimization.allgather_bucket_size"] == "500000000"
    assert counts(result)[1] == 0


def test_2020_deepspeedlight_echo(tmp_path):
    result = ingest(
        tmp_path,
        [
            "[INFO 2020-02-06 19:53:50] DeepSpeedLight configuration:",
            "[INFO 2020-02-06 19:53:50]   allgather_size ............... 500000000",
            "[INFO 2020-02-06 19:53:50]   train_batch_size ............. 128",
        ],
    )
    config = config_of(result)
    assert (config["allgather_size"], config["train_batch_size"]) == ("500000000", "128")
    assert counts(result) == (3, 0, 0)


def test_launcher_preamble(tmp_path):
    launch = "[2023-06-21 07:38:00,000] [INFO] [launch.py:146:main] "
    result = ingest(
        tmp_path,
        [
            (
                "[2023-06-21 07:37:59,000] [INFO] [multinode_runner.py:65:get_cmd] "
                "Running on the following workers: worker-0,worker-1"
            ),
            (
                "[2023-06-21 07:37:59,000] [INFO] [runner.py:607:main] cmd = /usr/bin/python -u -m "
                "deepspeed.launcher.launch --world_info=e30= train.py"
            ),
            "worker-0: "
            + launch
            + "WORLD INFO DICT: {'worker-0': [0, 1, 2, 3, 4, 5, 6, 7], 'worker-1': [0, 1, 2, 3, 4, 5, 6, 7]}",
            "worker-0: " + launch + "nnodes=2, num_local_procs=8, node_rank=0",
            "worker-0: "
            + launch
            + "global_rank_mapping=defaultdict(<class 'list'>, {'worker-0': [0, 1, 2, 3, 4, 5, 6, 7]})",
            "worker-0: " + launch + "dist_world_size=16",
            "worker-0: " + launch + "Setting CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
            "worker-0: "
            + launch
            + "process 4242 spawned with command: ['/usr/bin/python', '-u', 'train.py', '--local_rank=0']",
            "worker-0: [2023-06-21 07:38:00,000] [INFO] [launch.py:138:main] 0 NCCL_IB_DISABLE=1",
            "worker-0: [2023-06-21 07:39:00,000] [INFO] [launch.py:347:main] Process 4242 exits successfully.",
        ],
    )
    config = config_of(result)
    assert (config["launcher.nnodes"], config["launcher.num_local_procs"], config["launcher.dist_world_size"]) == (
        "2",
        "8",
        "16",
    )
    assert config["launcher.cuda_visible_devices"] == "0,1,2,3,4,5,6,7" and config["NCCL_IB_DISABLE"] == "1"
    assert config["launcher.command"].startswith("['/usr/bin/python'")
    assert config["launcher.workers"] == "worker-0,worker-1"
    assert counts(result) == (9, 0, 1)  # `Process ... exits` is known chatter


def test_unknown_deepspeed_messages_are_counted_and_sampled(tmp_path):
    result = ingest(
        tmp_path,
        [
            "worker-0: " + RANK0 + "Activation Checkpointing Information",
            "[default0]:" + RANK0 + "step=oops, skipped=0",
            "[1,0]<stdout>:" + RANK0 + "time (ms) | fwd: fast",
            "an application line",
        ],
    )
    assert counts(result) == (0, 4, 0)
    assert [line for line, _ in result.account.samples] == [1, 2, 3, 4]


def test_non_ascii_host_and_rank_keep_their_text(tmp_path):
    # str.find counts bytes: slicing by characters after a non-ASCII host cut the wrong text.
    line = (
        "nodé01: [2024-03-01 10:00:00,001] [INFO] [logging.py:96:log_dist] "
        "[Rank 3] step=40, skipped=0, lr=[0.001], mom=[(0.9, 0.95)]"
    )
    (row,) = steps(ingest(tmp_path, [line]))
    assert (row["host"], row["rank"], row["step"]) == ("nodé01", 3, 40)
