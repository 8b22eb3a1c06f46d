"""Launch a hang scenario of lab/hang/worker.py on this machine and keep what it left behind.

    lab/hang/.venv/bin/python lab/hang/run.py SCENARIO OUT_DIR [--world 4] [--bad-rank 2] [--bad-step 6]

Starts one process per rank (gloo over 127.0.0.1, TORCH_FR_BUFFER_SIZE=2000), each rank's
stdout to OUT_DIR/rankN/train.log. For `kill` it sends SIGKILL to the bad rank once that rank
has logged the step before the bad one. When no rank has logged anything for --stall-s
seconds, it takes `py-spy dump` (and `py-spy dump --native` of the bad rank) of every live
rank, waits for the ranks' own Flight Recorder dumps, then ends the ranks it started.
OUT_DIR/lab.json records the command, the times (UTC) and what was injected.
"""

import argparse
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["healthy", "skip", "size", "sleep", "kill"])
    p.add_argument("out", type=Path)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--bad-rank", type=int, default=2)
    p.add_argument("--bad-step", type=int, default=6)
    p.add_argument("--stall-s", type=float, default=12.0)
    p.add_argument("--limit-s", type=float, default=120.0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(a.world),
        TORCH_FR_BUFFER_SIZE="2000",
        OMP_NUM_THREADS="1",
    )
    record = {
        "scenario": a.scenario,
        "world": a.world,
        "bad_rank": a.bad_rank,
        "bad_step": a.bad_step,
        "command": " ".join(sys.argv),
        "started": utc(),
        "events": [],
    }
    procs, logs = {}, {}
    for rank in range(a.world):
        folder = a.out / f"rank{rank}"
        folder.mkdir(exist_ok=True)
        logs[rank] = folder / "train.log"
        cmd = [
            sys.executable,
            str(HERE / "worker.py"),
            "--scenario",
            a.scenario,
            "--bad-rank",
            str(a.bad_rank),
            "--bad-step",
            str(a.bad_step),
            "--out",
            str(folder),
        ]
        procs[rank] = subprocess.Popen(
            cmd, env=dict(env, RANK=str(rank)), stdout=logs[rank].open("wb"), stderr=subprocess.STDOUT
        )
        record["events"].append({"at": utc(), "what": f"started rank {rank} pid {procs[rank].pid}"})
    begin, killed, dumped_stacks = time.monotonic(), False, False
    last_change, sizes = time.monotonic(), {}
    while time.monotonic() - begin < a.limit_s:
        time.sleep(0.25)
        now_sizes = {r: logs[r].stat().st_size for r in logs}
        if now_sizes != sizes:
            sizes, last_change = now_sizes, time.monotonic()
        if a.scenario == "kill" and not killed and f"step={a.bad_step - 1} ".encode() in logs[a.bad_rank].read_bytes():
            procs[a.bad_rank].send_signal(signal.SIGKILL)
            killed = True
            record["events"].append({"at": utc(), "what": f"SIGKILL to rank {a.bad_rank} pid {procs[a.bad_rank].pid}"})
        alive = {r: pr for r, pr in procs.items() if pr.poll() is None}
        if not alive:
            break
        training = all(b"step=1 " in logs[r].read_bytes() for r in logs)  # imports and rendezvous are not a stall
        if training and not dumped_stacks and time.monotonic() - last_change > a.stall_s and a.scenario != "healthy":
            for r, pr in alive.items():
                for native in [False, True] if r == a.bad_rank else [False]:
                    name = f"pyspy_native_rank{r}.txt" if native else f"pyspy_rank{r}.txt"
                    cmd = ["py-spy", "dump", "--pid", str(pr.pid)] + (["--native"] if native else [])
                    with (a.out / f"rank{r}" / name).open("wb") as fh:
                        subprocess.run(
                            [str(Path(sys.executable).parent / cmd[0]), *cmd[1:]],
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            timeout=60,
                        )
                    record["events"].append({"at": utc(), "what": " ".join(cmd) + f" > rank{r}/{name}"})
            dumped_stacks = True
            record["events"].append({"at": utc(), "what": "job stalled: stack dumps taken"})
        if dumped_stacks and all((a.out / f"rank{r}" / f"fr_trace_rank_{r}").exists() for r in alive):
            time.sleep(1.0)
            break
    for r, pr in procs.items():
        if pr.poll() is None:
            pr.send_signal(signal.SIGTERM)
            record["events"].append({"at": utc(), "what": f"ended rank {r} (SIGTERM from the launcher)"})
    for pr in procs.values():
        try:
            pr.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pr.kill()
    record["ended"] = utc()
    record["exit_codes"] = {r: pr.returncode for r, pr in procs.items()}
    (a.out / "lab.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
