"""Make runs of the lab's matrix for real: lab/matrix.py RUN_ID ... (as root).

Each row of matrix.tsv is one run: a job shape (engine, world size, ranks per host, ZeRO stage,
overlap_comm, buckets, gradient accumulation, how hosts are named, how logs are laid out, what
DeepSpeed prints: `every` rank's timers, progress and comms logger lines at every step, or its
`default`: timers and progress on rank 0, a progress line every 10 steps) and one fault. A run:

1. makes two network namespaces (net.sh), the "hosts", joined by a veth pair; every rank of a
   host runs in its namespace, pinned to that host's CPU (`taskset`) at nice -10;
2. records the link with `tcpdump -s 96` from the first host;
3. starts the job: DeepSpeed (train.py) or PyTorch DDP (train_ddp.py), each rank writing its own
   log (layout `rank`), or a host's ranks sharing one log as a launcher prints it: pdsh's
   `host: ` before every line (`pdsh`), one node's console with no prefix (`console`, as the
   `deepspeed` launcher prints its local ranks), or torchrun's own `--tee 3` console with
   `[default0]:` (`torchrun`, which then starts the host's ranks itself);
4. waits for every rank's first logged step (rank 0's under `default` printing), then FAULT_AFTER s,
   switches the fault on and records the UTC time, and off FAULT_FOR s later (a blackout BLACKOUT_S;
   a checkpoint when its pause ends; a hang never: HANG_WAIT s on, py-spy dumps every rank and the job is killed);
5. writes the fixture (matrix_fixture.py) into OUT/<run id>/; with --profile every rank also runs
   under torch.profiler and its trace, cut to the steps around the fault, goes beside its host's logs
   (trace_fixture.py). --table reads the runs from another table of matrix.tsv's columns.

Options from the environment: LAB_PYTHON (the lab venv's python;
by default lab/.venv's, where setup.sh puts it),
RUN_S (75: training time from the first step), FAULT_AFTER (25), FAULT_FOR (25),
BLACKOUT_S (8), HANG_WAIT (40), HOGS (3 busy loops per rank of a contended host), LOSS_SKEW (4: the
clock-skew run's loss, percent), SKEW (+2.5).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

LAB = Path(__file__).resolve().parent
TABLE = LAB / "matrix.tsv"
PY = os.environ.get("LAB_PYTHON") or str(LAB / ".venv" / "bin" / "python")  # setup.sh's default venv
NS = ("tl-lab-a", "tl-lab-b")
DEV = ("tl-veth-a", "tl-veth-b")
IP = ("10.99.0.1", "10.99.0.2")
PORT = 29511
NAMES = {
    "ip": IP,
    "node": ("node-a", "node-b"),
    "master": ("master", "worker-b"),
    "trainer": ("trainer0", "trainer1"),
    "compute": ("compute-1", "compute-2"),
    "dgx": ("dgx-07", "dgx-12"),
}
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
STEP = re.compile(r"\[Rank (\d+)\] (?:step=\d+,|iteration +\d+/)")
# samples per host and step (a host's ranks share its one CPU): steps of about 0.5 s
BATCH = {"deepspeed": 24576, "ddp": 24576}


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


RUN_S = env_float("RUN_S", 75)
FAULT_AFTER = env_float("FAULT_AFTER", 25)
FAULT_FOR = env_float("FAULT_FOR", 25)
BLACKOUT_S = env_float("BLACKOUT_S", 8)
HANG_WAIT = env_float("HANG_WAIT", 40)
HOGS = int(env_float("HOGS", 3))
SLOW_EXTRA = 10  # a slow rank's extra forward passes per micro-step (job.py's default)
SMALL_BUCKET = 50_000  # elements: several collectives inside backward on this model
LOSS_SKEW = int(env_float("LOSS_SKEW", 4))
SKEW = env_float("SKEW", 2.5)
PROFILE = False  # set by --profile: every rank writes a PyTorch profiler trace into the work folder


@dataclass(frozen=True)
class Run:
    """One row of matrix.tsv."""

    id: str
    engine: str  # deepspeed | ddp
    world: int
    per_host: int
    zero: int  # 0 for ddp
    overlap: str  # on | off | - (ddp)
    bucket: str  # default | small | a size in elements
    grad_accum: int
    names: str  # a key of NAMES
    layout: str  # rank | pdsh | console | torchrun
    printing: str  # every: every rank's timers, progress and comms logger at every step | default: DeepSpeed's
    fault: str  # name[:argument[:detail]]
    held_out: bool

    @property
    def hosts(self) -> tuple[str, str]:
        return NAMES[self.names]

    @property
    def kind(self) -> str:
        return self.fault.split(":")[0]

    @property
    def arg(self) -> int:
        return int(self.fault.split(":")[1]) if ":" in self.fault else -1

    @property
    def detail(self) -> str:
        """The fault's third part: a slow rank's extra forward passes, a contended host's busy loops per
        rank, `in` for loss only into the second host; "" when not given."""
        parts = self.fault.split(":")
        return parts[2] if len(parts) > 2 else ""

    @property
    def bucket_elements(self) -> int:
        """DeepSpeed's reduce/allgather/prefetch bucket in elements, 0 for its default."""
        return {"default": 0, "small": SMALL_BUCKET}.get(self.bucket) or int(self.bucket)

    @property
    def extra_forwards(self) -> int:
        return int(self.detail) if self.kind == "slow-rank" and self.detail else SLOW_EXTRA

    @property
    def hogs_per_rank(self) -> int:
        return int(self.detail) if self.kind == "host-contention" and self.detail else HOGS

    def host_of(self, rank: int) -> int:
        return rank // self.per_host


def read_table(path: Path = TABLE) -> list[Run]:
    with open(path) as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#")]
    header, *body = rows
    runs = []
    for row in body:
        r = dict(zip(header, row, strict=True))
        runs.append(
            Run(
                id=r["id"],
                engine=r["engine"],
                world=int(r["world"]),
                per_host=int(r["per_host"]),
                zero=int(r["zero"]) if r["zero"] != "-" else 0,
                overlap=r["overlap"],
                bucket=r["bucket"],
                grad_accum=int(r["grad_accum"]),
                names=r["names"],
                layout=r["layout"],
                printing=r["printing"],
                fault=r["fault"],
                held_out=r["held_out"] == "yes",
            )
        )
    return runs


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def sh(script: str) -> None:
    """A bash snippet with net.sh's functions and this run's namespaces, devices and addresses."""
    prelude = f"NS=({' '.join(NS)}); DEV=({' '.join(DEV)}); IP=({' '.join(IP)}); source {LAB}/net.sh; "
    subprocess.run(["bash", "-c", prelude + script], check=True)


class Lab:
    """One run in progress: its processes (each started in a session of its own, ended by pid)."""

    def __init__(self, run: Run, work: Path):
        self.run, self.work = run, work
        self.procs: list[subprocess.Popen] = []
        self.ranks: list[subprocess.Popen] = []  # the job's launched processes (ranks or torchruns)
        self.hogs: list[subprocess.Popen] = []
        self.prioritised: set[int] = set()
        self.events: dict[str, str] = {}
        self.flags = work / "flags"
        self.flags.mkdir(parents=True)

    def note(self, what: str) -> str:
        self.events[what] = now()
        print(f"{self.events[what]} {self.run.id}: {what}", file=sys.stderr, flush=True)
        return self.events[what]

    def spawn(self, cmd: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def prioritise(self, pids) -> None:
        """nice -10 for each session's autogroup too: with autogroups on (the kernel's default) a process's
        nice counts only within its session, and every other session gets an equal share of the CPU."""
        for pid in set(pids) - self.prioritised:
            try:
                Path(f"/proc/{pid}/autogroup").write_text("-10")
                self.prioritised.add(pid)
            except OSError:
                pass

    def end(self, p: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------ the job

    def job_args(self) -> list[str]:
        run = self.run
        batch = BATCH[run.engine] // run.per_host
        args = [
            "--seconds",
            str(RUN_S),
            "--flags",
            str(self.flags),
            "--out",
            str(self.work / "out"),
            "--batch",
            str(batch),
            "--pause-s",
            "15",
        ]
        if PROFILE:
            args += ["--profile", str(self.work / "traces")]
        if run.kind == "slow-rank":
            args += ["--slow-rank", str(run.arg), "--slow-extra", str(run.extra_forwards)]
        if run.kind == "hang":
            args += ["--desync-rank", str(run.arg)]
        if run.engine == "deepspeed":
            args += [
                "--zero",
                str(run.zero),
                "--overlap",
                run.overlap,
                "--grad-accum",
                str(run.grad_accum),
                "--bucket",
                str(run.bucket_elements),
                "--printing",
                run.printing,
            ]
            return [str(LAB / "train.py"), *args]
        return [str(LAB / "train_ddp.py"), *args, "--bucket-mb", "0.2" if run.bucket == "small" else "25"]

    def host_env(self, h: int) -> dict[str, str]:
        env = {
            "MASTER_ADDR": IP[0],
            "MASTER_PORT": str(PORT),
            "WORLD_SIZE": str(self.run.world),
            "LOCAL_WORLD_SIZE": str(self.run.per_host),
            "GLOO_SOCKET_IFNAME": DEV[h],
            "DS_ACCELERATOR": "cpu",
            "DS_BUILD_OPS": "0",
            "TORCH_CPP_LOG_LEVEL": "INFO",
            "TORCH_DISTRIBUTED_DEBUG": "INFO",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(LAB),
        }
        if self.run.kind == "clock-skew" and h == 1:
            env |= {"LD_PRELOAD": FAKETIME, "FAKETIME": f"+{SKEW}s", "FAKETIME_DONT_RESET": "1"}
        return env

    def in_host(self, h: int, env: dict[str, str], cmd: list[str]) -> list[str]:
        return [
            "ip",
            "netns",
            "exec",
            NS[h],
            "taskset",
            "-c",
            str(h),
            "nice",
            "-n",
            "-10",
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            *cmd,
        ]

    def start_job(self) -> None:
        run = self.run
        for h, host in enumerate(run.hosts):
            folder = self.work / "logs" / host
            folder.mkdir(parents=True)
            env = self.host_env(h)
            if run.layout == "torchrun":
                cmd = [
                    str(Path(PY).parent / "torchrun"),
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    str(run.per_host),
                    "--node-rank",
                    str(h),
                    "--master-addr",
                    IP[0],
                    "--master-port",
                    str(PORT),
                    "--tee",
                    "3",
                    "--log-dir",
                    str(self.work / "torchrun" / host),
                    *self.job_args(),
                ]
                with open(folder / "train.log", "wb") as out:
                    self.ranks.append(self.spawn(self.in_host(h, env, cmd), stdout=out, stderr=subprocess.STDOUT))
                continue
            shared = None
            if run.layout == "pdsh":  # as pdsh prints a remote host's output: `host: ` before each line
                with open(folder / "train.log", "wb") as out:
                    shared = self.spawn(["sed", "-u", f"s/^/{host}: /"], stdin=subprocess.PIPE, stdout=out)
            console = open(folder / "train.log", "ab") if run.layout == "console" else None
            for local in range(run.per_host):
                rank = h * run.per_host + local
                rank_env = env | {"RANK": str(rank), "LOCAL_RANK": str(local), "GROUP_RANK": str(h)}
                cmd = self.in_host(h, rank_env, [PY, *self.job_args()])
                if shared is not None:
                    self.ranks.append(self.spawn(cmd, stdout=shared.stdin, stderr=subprocess.STDOUT))
                elif console is not None:  # one node's launcher console: its ranks' lines as written, no prefix
                    self.ranks.append(self.spawn(cmd, stdout=console, stderr=subprocess.STDOUT))
                else:
                    with open(folder / f"rank{rank}.log", "wb") as out:
                        self.ranks.append(self.spawn(cmd, stdout=out, stderr=subprocess.STDOUT))
            if shared is not None:
                shared.stdin.close()  # the ranks hold it open; sed ends when they do
            if console is not None:
                console.close()  # the ranks hold their own copies

    def ranks_stepped(self) -> set[int]:
        seen: set[int] = set()
        for log in (self.work / "logs").rglob("*.log"):
            seen |= {int(m.group(1)) for m in STEP.finditer(log.read_text(errors="replace"))}
        return seen

    def wait_first_step(self, timeout: float = 900) -> None:
        until = time.time() + timeout
        while time.time() < until:
            self.prioritise(self.rank_pids().values())
            stepped = self.ranks_stepped()
            if len(stepped) == self.run.world or (self.run.printing == "default" and 0 in stepped):
                self.note("first step")
                return
            if any(p.poll() is not None for p in self.ranks):
                raise RuntimeError("a rank ended before the first step")
            time.sleep(0.5)
        raise RuntimeError(f"not every rank logged a step in {timeout:.0f} s")

    def rank_pids(self) -> dict[int, int]:
        """Global rank -> pid of every live rank (the job's processes, or torchrun's children)."""
        found, todo = {}, [p.pid for p in self.ranks]
        while todo:
            pid = todo.pop()
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            rank = [e[5:] for e in environ if e.startswith(b"RANK=")]
            if rank and b"train" in cmdline and b"torchrun" not in cmdline:
                found[int(rank[0])] = pid
            todo += [int(c) for c in children]
        return found

    # ------------------------------------------------------------ faults

    def hog(self, h: int) -> None:
        for _ in range(self.run.hogs_per_rank * self.run.per_host):
            self.hogs.append(
                self.spawn(["taskset", "-c", str(h), "nice", "-n", "-10", "sh", "-c", "while :; do :; done"])
            )
        self.prioritise(p.pid for p in self.hogs)

    def fault_on(self) -> None:
        kind, run = self.run.kind, self.run
        if kind in ("loss", "clock-skew"):
            pct = run.arg if kind == "loss" else LOSS_SKEW
            sh(f"nft_loss{'_in' if run.detail == 'in' else ''} {NS[1]} {DEV[1]} {pct}")
        elif kind == "bandwidth":
            sh(f"nft_rate {NS[1]} {DEV[1]} '{run.arg} kbytes/second'")
        elif kind == "blackout":
            sh(f"nft_table {NS[1]} {DEV[1]} 'meta l4proto tcp drop'")
        elif kind == "slow-rank":
            (self.flags / "slow").touch()
        elif kind == "host-contention":
            self.hog(run.arg)
        elif kind == "contention-all":
            self.hog(0)
            self.hog(1)
        elif kind == "loader-stall":
            (self.flags / "stall").touch()
        elif kind == "checkpoint":
            (self.flags / "checkpoint").touch()
        elif kind == "hang":
            (self.flags / "desync").touch()

    def fault_off(self) -> None:
        kind = self.run.kind
        if kind in ("loss", "clock-skew", "bandwidth", "blackout"):
            sh(f"nft_clear {NS[1]}")
        elif kind in ("host-contention", "contention-all"):
            for p in self.hogs:
                self.end(p, signal.SIGKILL)
        elif kind == "slow-rank":
            (self.flags / "slow").unlink()
        elif kind == "loader-stall":
            (self.flags / "stall").unlink()
        elif kind == "checkpoint":
            (self.flags / "checkpoint").unlink()

    def dump_stacks(self) -> dict[int, bool]:
        """py-spy dump of every rank into its host's folder; which ranks were still alive."""
        pids, spy = self.rank_pids(), str(Path(PY).parent / "py-spy")
        for rank in range(self.run.world):
            host = self.run.hosts[self.run.host_of(rank)]
            target = self.work / "logs" / host / f"pyspy-rank{rank}.txt"
            if rank in pids:
                with open(target, "wb") as out:
                    subprocess.run([spy, "dump", "--pid", str(pids[rank])], stdout=out, stderr=subprocess.STDOUT)
        return {rank: rank in pids for rank in range(self.run.world)}

    # ------------------------------------------------------------ the whole run

    def go(self) -> dict:
        run = self.run
        sh("net_up")
        tcpdump = self.spawn(
            [
                "ip",
                "netns",
                "exec",
                NS[0],
                "tcpdump",
                "-i",
                DEV[0],
                "-s",
                "96",
                "-U",
                "-w",
                str(self.work / "capture.pcap"),
                "tcp",
            ],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)
        self.note("launch")
        self.start_job()
        self.wait_first_step()
        time.sleep(FAULT_AFTER)
        alive = {}
        if run.kind != "clean":
            self.note("fault on")
            self.fault_on()
            if run.kind == "checkpoint":
                pause = self.work / "out" / "pause.json"
                for _ in range(600):
                    if pause.exists():
                        break
                    time.sleep(0.5)
                self.fault_off()
                span = json.loads(pause.read_text())
                self.events["fault on"], self.events["fault off"] = (
                    datetime.fromtimestamp(span[k], timezone.utc).isoformat(timespec="milliseconds")
                    for k in ("from", "to")
                )
            elif run.kind == "hang":
                time.sleep(HANG_WAIT)
                self.note("stack dumps")
                alive = self.dump_stacks()
                self.note("fault off")
                for p in self.ranks:
                    self.end(p, signal.SIGKILL)
            else:
                time.sleep(BLACKOUT_S if run.kind == "blackout" else FAULT_FOR)
                self.fault_off()
                self.note("fault off")
        deadline = time.time() + RUN_S + 180
        for p in self.ranks:
            left = max(1.0, deadline - time.time())
            code = p.wait(timeout=left)
            if code != 0 and run.kind != "hang":
                raise RuntimeError(f"a rank's process ended with {code}")
        self.note("ranks done")
        time.sleep(1)
        tcpdump.send_signal(signal.SIGINT)
        tcpdump.wait(timeout=30)
        return alive

    def cleanup(self) -> None:
        for p in self.procs:
            self.end(p, signal.SIGKILL)
        sh("net_down")


def make(run: Run, out: Path, keep: bool) -> Path:
    from matrix_fixture import write_fixture

    work = Path(tempfile.mkdtemp(prefix=f"tracelens-matrix-{run.id}."))
    lab = Lab(run, work)
    began = time.time()
    try:
        alive = lab.go()
    finally:
        lab.cleanup()
    if run.kind == "hang" and not all(alive.values()):
        raise RuntimeError(f"not a hang: ranks {sorted(r for r, a in alive.items() if not a)} ended")
    fixture = write_fixture(run, work, out / run.id, lab.events, alive)
    if PROFILE:
        from trace_fixture import add_traces

        add_traces(run, work, fixture, lab.events)
    print(f"{run.id}: fixture {fixture} in {time.time() - began:.0f} s", file=sys.stderr)
    if not keep:
        shutil.rmtree(work)
    return fixture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="run ids of matrix.tsv (default: all, in the table's order)")
    parser.add_argument("--out", type=Path, default=LAB.parent / "fixtures" / "lab-matrix")
    parser.add_argument("--keep-work", action="store_true", help="keep the run's work folder in /tmp")
    parser.add_argument("--tries", type=int, default=2, help="a run that fails (no steps, a crash) is made again")
    parser.add_argument("--table", type=Path, default=TABLE, help="the runs' table (default: matrix.tsv)")
    parser.add_argument("--profile", action="store_true", help="profile every rank: traces in the fixture")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    # started in the background, SIGINT arrives ignored: both signals end the run cleanly (Lab.cleanup)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    table = {r.id: r for r in read_table(args.table)}
    for rid in args.runs or list(table):
        for attempt in range(1, args.tries + 1):
            try:
                make(table[rid], args.out, args.keep_work)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{rid}: attempt {attempt} failed: {e}", file=sys.stderr)
        else:
            print(f"{rid}: FAILED", file=sys.stderr)


if __name__ == "__main__":
    main()
