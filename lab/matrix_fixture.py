"""Turn one finished matrix run (matrix.py's work folder) into a fixture: lab-matrix/<run id>/.

Each host's logs gzipped in a folder named as the run names its hosts (and the py-spy dumps of a
hang beside them), DeepSpeed's config, the capture trimmed and gzipped, expected.json (marked
real: the job, the injected cause, its UTC window, hosts and ranks, tshark's retransmission
counts) and a README with each rank's step times before, in and after the window.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

from make_fixture import gzip_copy, retransmissions, utc
from matrix import BLACKOUT_S, FAULT_AFTER, FAULT_FOR, LOSS_SKEW, SKEW, Run

NETWORK = {"loss", "bandwidth", "blackout", "clock-skew"}
CAUSE = {
    "clean": None,
    "loss": "link",
    "blackout": "link",
    "clock-skew": "link",
    "bandwidth": "congestion",
    "slow-rank": "straggler",
    "host-contention": "straggler",
    "contention-all": "contention",
    "loader-stall": "input",
    "checkpoint": "checkpoint",
    "hang": "hang",
}
LINE = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[INFO\] \[[^\]]+\] \[Rank (\d+)\] "
    r"(?:step=(\d+),|iteration +(\d+)/.*elapsed time per iteration \(ms\): ([\d.]+))"
    r"|\[Rank (\d+)\] time \(ms\) \| fwd: ([\d.]+) \| bwd: ([\d.]+)"  # no time of its own: its step line's
)
CAPTURE_MARGIN = 5  # seconds of capture kept either side of a window that is not on the network
NETWORK_MARGIN = 10  # seconds of capture kept either side of a network fault's window
CLEAN_KEPT = 10  # seconds of a clean run's capture kept, from where a fault's window would start


def describe(run: Run) -> tuple[str, str]:
    """What was injected, and how."""
    a, b = run.hosts
    nft = f"nftables table `inet tl_lab` in {b}'s namespace, chains on input (iifname) and output (oifname) of its veth"
    ranks_of = lambda h: ", ".join(str(r) for r in range(h * run.per_host, (h + 1) * run.per_host))  # noqa: E731
    hogs = lambda h: (  # noqa: E731
        f"{run.hogs_per_rank * run.per_host} x `taskset -c {h} nice -n -10 sh -c 'while :; do :; done'` "
        f"(CPU {h}, {run.hosts[h]}'s)"
    )
    return {
        "clean": lambda: ("nothing: the clean control of this job shape", "no fault"),
        "loss": lambda: (
            f"random packet loss of {run.arg}% "
            + (f"of what {b} receives" if run.detail == "in" else f"both ways on {b}'s end of the link"),
            (nft.replace(" and output (oifname)", "") if run.detail == "in" else nft)
            + f": `numgen random mod 100 < {run.arg} drop`",
        ),
        "bandwidth": lambda: (
            f"a bandwidth cap of {run.arg} kbytes/second each way on {b}'s end of the link",
            f"{nft}: `meta l4proto tcp limit rate over {run.arg} kbytes/second burst 128 kbytes drop`",
        ),
        "blackout": lambda: (
            f"a link blackout: every TCP packet in and out of {b} dropped for {BLACKOUT_S:g} s",
            f"{nft}: `meta l4proto tcp drop`",
        ),
        "slow-rank": lambda: (
            f"one slow rank: rank {run.arg} (on {run.hosts[run.host_of(run.arg)]}) runs its forward pass "
            f"{run.extra_forwards} more times per micro-step (on a private copy of the model, no collective)",
            "the flag file `slow`; job.py's Model.forward on the rank given by --slow-rank",
        ),
        "host-contention": lambda: (
            f"a contended host: busy loops on {run.hosts[run.arg]}'s CPU slow all its ranks ({ranks_of(run.arg)})",
            hogs(run.arg) + ", killed by pid at the end",
        ),
        "contention-all": lambda: (
            "contention on every host: busy loops on both CPUs",
            f"{hogs(0)} and {hogs(1)}, killed by pid at the end",
        ),
        "loader-stall": lambda: (
            "a data-loader stall on every rank: each batch waits 400 ms before it is produced",
            "the flag file `stall`; job.py's RandomBatches sleeps --stall-ms=400 per batch while it exists",
        ),
        "checkpoint": lambda: (
            "a checkpoint pause: every rank saves a checkpoint, then holds 15 s (a slow storage write), once",
            "the flag file `checkpoint`; rank 0 tells the others in the step's control all-reduce",
        ),
        "clock-skew": lambda: (
            f"{b}'s ranks run under libfaketime FAKETIME=+{SKEW:g}s (every time they print is {SKEW:g} s ahead); "
            f"the slow window is random packet loss of {LOSS_SKEW}% on {b}'s end of the link",
            f"LD_PRELOAD=libfaketimeMT.so.1 FAKETIME=+{SKEW:g}s FAKETIME_DONT_RESET=1 on {b}'s ranks; "
            f"{nft}: `numgen random mod 100 < {LOSS_SKEW} drop`",
        ),
        "hang": lambda: (
            f"a desync hang: rank {run.arg} (on {run.hosts[run.host_of(run.arg)]}) issues, once, collectives the "
            "others never issue"
            + " (an all_reduce of 1,000 floats on a second process group)"
            + "; the logs stop; py-spy dumps of every rank are taken later, then the job is killed",
            "the flag file `desync`; `py-spy dump --pid` of every rank into `<host>/pyspy-rank<N>.txt`",
        ),
    }[run.kind]()


def where(run: Run) -> tuple[list[str], list[int]]:
    """The hosts and ranks a correct verdict names."""
    if run.kind == "clean":
        return [], []
    if run.kind in ("slow-rank", "hang"):  # a hang's cause is the rank that issued what the others never did
        return [run.hosts[run.host_of(run.arg)]], [run.arg]
    if run.kind == "host-contention":
        return [run.hosts[run.arg]], list(range(run.arg * run.per_host, (run.arg + 1) * run.per_host))
    return list(run.hosts), list(range(run.world))


def step_rows(log: Path, skew: float) -> list[tuple[int, float, str, float]]:
    """(rank, true UTC seconds, what, value): step lines, DDP iteration times and DeepSpeed fwd/bwd timers."""
    rows, last = [], {}
    for m in LINE.finditer(log.read_text(errors="replace")):
        if m.group(1):
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp() - skew
            rank = int(m.group(2))
            last[rank] = t
            rows.append((rank, t, "step", 0.0))
            if m.group(5):
                rows.append((rank, t, "iter_ms", float(m.group(5))))
        elif int(m.group(6)) in last:
            rank = int(m.group(6))
            rows += [(rank, last[rank], "fwd_ms", float(m.group(7))), (rank, last[rank], "bwd_ms", float(m.group(8)))]
    return rows


def step_table(run: Run, work: Path, window: tuple[float, float]) -> list[str]:
    """README rows: each rank's median step interval (and fwd/bwd or iteration time) per part of the run."""
    rows = []
    for h, host in enumerate(run.hosts):
        skew = SKEW if run.kind == "clock-skew" and h == 1 else 0.0
        for log in sorted((work / "logs" / host).glob("*.log")):
            rows += step_rows(log, skew)
    lo, hi = window
    parts = {"before": lambda t: t < lo, "window": lambda t: lo <= t < hi, "after": lambda t: t >= hi}
    kinds = ["iter_ms"] if run.engine == "ddp" else ["fwd_ms", "bwd_ms"]
    out = []
    for rank in range(run.world):
        steps = sorted(t for r, t, k, _ in rows if r == rank and k == "step")
        gaps = [(b, (b - a) * 1000) for a, b in zip(steps, steps[1:])]
        for name, inside in parts.items():
            cells = [statistics.median([g for t, g in gaps if inside(t)] or [float("nan")])]
            cells += [
                statistics.median([v for r, t, k, v in rows if r == rank and k == kind and inside(t)] or [0.0])
                for kind in kinds
            ]
            n = sum(1 for t in steps if inside(t))
            out.append(f"| {rank} | {name} | {n} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    header = "| rank | part | steps | step interval | " + " | ".join(kinds) + " |"
    return [header, "|" + "---|" * (4 + len(kinds)), *out]


def trim_capture(run: Run, work: Path, target: Path, window: tuple[datetime, datetime]) -> None:
    """The window and NETWORK_MARGIN s either side where the fault is on the network, CAPTURE_MARGIN s
    where it is not; a clean run's first CLEAN_KEPT s of its slot for a fault (`window`)."""
    if run.kind in NETWORK:
        lo, hi = window[0] - timedelta(seconds=NETWORK_MARGIN), window[1] + timedelta(seconds=NETWORK_MARGIN)
    elif run.kind == "clean":
        lo, hi = window[0], window[0] + timedelta(seconds=CLEAN_KEPT)
    else:
        lo, hi = window[0] - timedelta(seconds=CAPTURE_MARGIN), window[1] + timedelta(seconds=CAPTURE_MARGIN)
    cut = work / "capture-cut.pcap"
    cmd = ["editcap", "-F", "pcap", "-A", f"{lo.timestamp():.6f}", "-B", f"{hi.timestamp():.6f}"]
    subprocess.run([*cmd, str(work / "capture.pcap"), str(cut)], check=True, capture_output=True)
    gzip_copy(cut, target)


def write_fixture(run: Run, work: Path, fixture: Path, events: dict[str, str], alive: dict[int, bool]) -> Path:
    if fixture.exists():
        shutil.rmtree(fixture)
    fixture.mkdir(parents=True)
    first = utc(events["first step"])
    if run.kind == "clean":  # no window: the slot a fault would have taken, for the capture and the table
        window = (first + timedelta(seconds=FAULT_AFTER), first + timedelta(seconds=FAULT_AFTER + FAULT_FOR))
    else:
        window = (utc(events["fault on"]), utc(events["fault off"]))
    for host in run.hosts:
        (fixture / host).mkdir()
        for f in sorted((work / "logs" / host).iterdir()):
            if f.suffix == ".log":
                gzip_copy(f, fixture / host / (f.name + ".gz"))
            else:
                shutil.copy(f, fixture / host / f.name)
    if run.engine == "deepspeed":
        shutil.copy(work / "out" / "ds_config.json", fixture / "ds_config.json")
    trim_capture(run, work, fixture / "capture.pcap.gz", window)
    kept = (window[0], window[0] + timedelta(seconds=CLEAN_KEPT)) if run.kind == "clean" else window
    counts = retransmissions(work / "capture-cut.pcap", *kept)
    what, how = describe(run)
    hosts, ranks = where(run)
    expected = {
        "real": True,
        "synthetic": False,
        "scenario": run.kind,
        "run": run.id,
        "description": what,
        "cause": CAUSE[run.kind],
        "window": [t.isoformat(timespec="milliseconds") for t in window] if run.kind != "clean" else None,
        "hosts": hosts,
        "ranks": ranks,
        "tolerance": 0.10,
        "tshark": counts,
        "job": {
            "engine": run.engine,
            "world": run.world,
            "ranks_per_host": run.per_host,
            "zero": run.zero or None,
            "overlap_comm": {"on": True, "off": False}.get(run.overlap),
            "bucket": run.bucket,
            "grad_accum": run.grad_accum,
            "hosts": list(run.hosts),
            "host_addresses": dict(zip(run.hosts, ("10.99.0.1", "10.99.0.2"), strict=True)),
            "rank_hosts": {str(r): run.hosts[run.host_of(r)] for r in range(run.world)},
            "log_layout": run.layout,
            "printing": run.printing,
        },
        "held_out": run.held_out,
        "made": f"{first:%Y-%m-%d}",
        "first_step": events["first step"],
    }
    if run.kind == "clock-skew":
        expected["clock_offsets"] = {run.hosts[1]: SKEW}
    if run.kind == "hang":
        expected["stack_dumps"] = events["stack dumps"]
        expected["alive_at_dump"] = [r for r, a in sorted(alive.items()) if a]
    (fixture / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    (fixture / "README.md").write_text(
        readme(run, expected, how, counts, step_table(run, work, tuple(t.timestamp() for t in window)))
    )
    return fixture


def kept(run: Run) -> str:
    """What part of the capture trim_capture keeps."""
    if run.kind in NETWORK:
        return f"the window +-{NETWORK_MARGIN} s"
    if run.kind == "clean":
        return f"the first {CLEAN_KEPT} s of the slot a fault takes in the other runs"
    return f"the window +-{CAPTURE_MARGIN} s"


PRINTING = {
    "every": "every rank prints its timers, progress line and comms logger lines at every step",
    "default": "DeepSpeed prints as it does by default: timers and progress on rank 0 only, a progress line every "
    "10 steps, no comms logger",
}
LAYOUT = {
    "rank": "each rank's own log, `<host>/rank<N>.log.gz`",
    "pdsh": "one log per host, `<host>/train.log.gz`, its ranks' lines interleaved with pdsh's `<host>: ` before each",
    "console": "one log per host, `<host>/train.log.gz`, its ranks' lines interleaved as they wrote them, no prefix",
    "torchrun": "one log per host, `<host>/train.log.gz`: torchrun's console with `--tee 3` (`[default<local rank>]:`)",
}


def readme(run: Run, expected: dict, how: str, counts: dict, table: list[str]) -> str:
    job = expected["job"]
    shape = (
        f"DeepSpeed 0.19 ZeRO-{run.zero}, overlap_comm {run.overlap}, "
        f"{run.bucket if run.bucket in ('default', 'small') else f'{run.bucket_elements:,}-element'} buckets, "
        "gradient accumulation "
        f"{run.grad_accum}"
        if run.engine == "deepspeed"
        else f"PyTorch DDP (gloo), {'0.2 MB' if run.bucket == 'small' else 'default 25 MB'} buckets"
    )
    window = expected["window"]
    lines = [
        f"# {run.id}: a real run (not synthetic)",
        "",
        f"Made on {expected['made']} by `lab/matrix.py {run.id}` (lab/README.md): {run.world} ranks, "
        f"{run.per_host} per host on two hosts `{job['hosts'][0]}` (10.99.0.1) and `{job['hosts'][1]}` (10.99.0.2), "
        f"network namespaces joined by a veth pair, a host's ranks pinned to its CPU at nice -10; {shape}; "
        f"torch 2.13 CPU. Logs: {LAYOUT[run.layout]}; {PRINTING[run.printing]}. tcpdump -s 96 on the first host's veth"
        f" ({kept(run)} kept).",
        "",
        f"**Injected:** {expected['description']}.",
        "",
        f"**When (UTC):** {window[0]} to {window[1]}, about {FAULT_AFTER:g} s after every rank's first logged step "
        f"({expected['first_step']})."
        if window
        else f"**When:** nothing was injected; every rank's first logged step at {expected['first_step']} (UTC).",
        "",
        f"**How:** {how}.",
        "",
        f"**Held out:** {'yes: not to be looked at while the verdicts are developed' if run.held_out else 'no'}.",
        "",
        "## tshark: TCP retransmissions among data segments (the kept capture)",
        "",
        "| part | seconds | data segments | retransmissions | per second |",
        "|---|---|---|---|---|",
        *(
            f"| {p} | {c['seconds']} | {c['data_segments']} | {c['retransmissions']} | {c['retransmissions_per_s']} |"
            for p, c in counts.items()
        ),
        "",
    ]
    if not run.held_out:
        lines += ["## Each rank's median ms per step (from its log; true UTC)", "", *table, ""]
    return "\n".join(lines)
