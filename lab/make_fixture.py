"""Turn one finished lab run (run.sh's work folder) into a fixture: fixtures/lab-<scenario>/.

Copies each rank's own log under a folder named after its host's address (so the logs and the
capture name the same hosts), DeepSpeed's config, the capture gzipped, and writes
expected.json (marked real: the injected cause, its exact UTC window, hosts and ranks) and a
README saying what was injected, when, with which commands, and what tshark counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

HOSTS = ["10.99.0.1", "10.99.0.2"]
STEP_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[INFO\] .*\bstep=(\d+),")
TIMERS = re.compile(
    r"\| fwd: ([\d.]+) \| bwd: [\d.]+ \| bwd_inner: ([\d.]+) \| bwd_allreduce: ([\d.]+) \| step: ([\d.]+)"
)


def scenarios(args: argparse.Namespace) -> dict[str, dict]:
    """What each scenario injects: the cause a correct diagnosis names, where, and how it was done."""
    nft = (
        "nft add table inet tl_lab; chains `in` (hook input, iifname "
        "tl-veth-b) and `out` (hook output, oifname tl-veth-b)"
    )
    hogs = "taskset -c {cpu} nice -n -10 sh -c 'while :; do :; done'"
    both = {"hosts": HOSTS, "ranks": [0, 1]}
    return {
        "clean": {
            "cause": None,
            **both,
            "what": "nothing: a clean run, the baseline for the others",
            "how": "no impairment; the same job, link and capture as every other scenario",
        },
        "loss": {
            "cause": "link",
            **both,
            "what": f"random packet loss of {args.loss_pct}% in both directions on 10.99.0.2's end of the link",
            "how": (
                f"{nft}, each with the rule `numgen random mod 100 < {args.loss_pct} drop`; then "
                "`nft delete table inet tl_lab`"
            ),
        },
        "bandwidth": {
            "cause": "congestion",
            **both,
            "what": (
                f"a bandwidth cap of {args.rate} each way on 10.99.0.2's "
                "end of the link (packets over the rate dropped)"
            ),
            "how": (
                f"{nft}, each with the rule `meta l4proto tcp limit rate over {args.rate} burst 128 kbytes "
                "drop`; then `nft delete table inet tl_lab`"
            ),
        },
        "straggler": {
            "cause": "straggler",
            "hosts": ["10.99.0.2"],
            "ranks": [1],
            "what": (
                "CPU contention on rank 1 (host 10.99.0.2) only: "
                f"{args.hogs} busy loops on its CPU 1, at its own priority"
            ),
            "how": f"{args.hogs} x `{hogs.format(cpu=1)}`, killed by pid at the end",
            "note": "The busy loops at nice -10 also push the machine's other users' processes off CPU 1 onto CPU 0, "
            "so rank 0's own compute timers rose in the window too, less than rank 1's (see the timers below); "
            "rank 0's communication time (waiting for rank 1) rose most.",
        },
        "straggler-rank0": {
            "cause": "straggler",
            "hosts": ["10.99.0.1"],
            "ranks": [0],
            "what": f"CPU contention on rank 0 (host 10.99.0.1, also the rendezvous host and the capture point) only: "
            f"{args.hogs} busy loops on its CPU 0, at its own priority",
            "how": f"{args.hogs} x `{hogs.format(cpu=0)}`, killed by pid at the end",
            "note": "The busy loops at nice -10 also push the machine's other users' processes off CPU 0 onto "
            "CPU 1, so rank 1's own compute timers may rise in the window too (see the timers below).",
        },
        "contention-all": {
            "cause": "contention",
            **both,
            "what": (
                f"CPU contention on every rank: {args.hogs} busy loops "
                "on each rank's CPU (0 and 1), at the ranks' priority"
            ),
            "how": (
                f"{args.hogs} x `{hogs.format(cpu=0)}` and {args.hogs} "
                f"x `{hogs.format(cpu=1)}`, killed by pid at the end"
            ),
        },
        "loader-stall": {
            "cause": "input",
            **both,
            "what": (
                "a stall in the data loader of every rank: each batch "
                "waits 400 ms before it is produced (the network untouched)"
            ),
            "how": (
                "run.sh creates the flag file `stall`; train.py's "
                "dataset sleeps --stall-ms=400 per batch while it exists"
            ),
        },
        "checkpoint": {
            "cause": "checkpoint",
            **both,
            "what": (
                "a checkpoint-style pause: every rank saves a DeepSpeed "
                "checkpoint, then holds 25 s (a slow storage write), once"
            ),
            "how": (
                "run.sh creates the flag file `checkpoint`; rank 0 tells the others in "
                "the step's control all-reduce; each rank calls engine.save_checkpoint() "
                "then sleeps --pause-s=25 and meets the others at a barrier"
            ),
        },
        "clock-skew": {
            "cause": "link",
            **both,
            "clock_offset_s": {"10.99.0.2": float(args.skew.rstrip("s"))},
            "what": (
                f"rank 1 (host 10.99.0.2) runs under libfaketime FAKETIME={args.skew}, "
                f"so every time it prints is {args.skew} off; the slow window is "
                f"random packet loss of {args.loss_pct}% on 10.99.0.2's end of the link"
            ),
            "how": (
                "rank 1 started with LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 "
                f"FAKETIME={args.skew}; {nft}, each with `numgen random mod 100 < {args.loss_pct} drop`"
            ),
        },
    }


def gzip_copy(source: Path, target: Path) -> None:
    with open(source, "rb") as raw, gzip.open(target, "wb", compresslevel=9) as packed:
        shutil.copyfileobj(raw, packed)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def step_span(log: Path) -> tuple[int, str, str]:
    """Steps logged, and the first and last step line's time, as the rank printed them."""
    times = [m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := STEP_LINE.match(line))]
    return len(times), times[0] if times else "", times[-1] if times else ""


def timer_medians(log: Path, window: tuple[datetime, datetime], skew_s: float) -> dict[str, list[float]]:
    """Median fwd, bwd_inner, bwd_allreduce and step timers (ms) before, inside and after the window;
    each timer line belongs to the step line before it, whose time (less the rank's known skew) places it."""
    rows, when = [], None
    for line in log.read_text(errors="replace").splitlines():
        if m := STEP_LINE.match(line):
            when = (
                datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp() - skew_s
            )
        elif (m := TIMERS.search(line)) and when is not None and "_microstep" not in line:
            rows.append((when, *map(float, m.groups())))
    lo, hi = (t.timestamp() for t in window)
    parts = {"before": lambda t: t < lo, "window": lambda t: lo <= t < hi, "after": lambda t: t >= hi}
    return {
        name: [
            round(statistics.median(r[i] for r in rows if inside(r[0])), 1)
            if any(inside(r[0]) for r in rows)
            else float("nan")
            for i in range(1, 5)
        ]
        for name, inside in parts.items()
    }


def retransmissions(capture: Path, start: datetime, stop: datetime) -> dict:
    """tshark's count of TCP retransmissions and data segments before, inside and after the window."""
    out = subprocess.run(
        [
            "tshark",
            "-n",
            "-r",
            str(capture),
            "-Y",
            "tcp.len > 0",
            "-T",
            "fields",
            "-e",
            "frame.time_epoch",
            "-e",
            "tcp.analysis.retransmission",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    rows = [line.split("\t") for line in out if line]
    first, last = float(rows[0][0]), float(rows[-1][0])
    bounds = {
        "before": (first, start.timestamp()),
        "window": (start.timestamp(), stop.timestamp()),
        "after": (stop.timestamp(), last),
    }
    counts = {}
    for name, (lo, hi) in bounds.items():
        inside = [r for r in rows if lo <= float(r[0]) < hi]
        retx = sum(1 for r in inside if len(r) > 1 and r[1])
        counts[name] = {
            "seconds": round(hi - lo, 1),
            "data_segments": len(inside),
            "retransmissions": retx,
            "retransmissions_per_s": round(retx / (hi - lo), 2) if hi > lo else None,
        }
    return counts


def readme(
    name: str,
    case: dict,
    window: tuple[datetime, datetime],
    steps: dict,
    counts: dict,
    timers: dict,
    args: argparse.Namespace,
) -> str:
    start, stop = (t.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC" for t in window)
    lines = [
        f"# lab-{name}: a real run (not synthetic)",
        "",
        f"Made on {window[0]:%Y-%m-%d} by `lab/run.sh {name}` (see lab/README.md): two ranks, each in its own network",
        "namespace (10.99.0.1 and 10.99.0.2, joined by a veth pair), each pinned to one CPU with taskset at nice -10,",
        "train a small MLP with DeepSpeed 0.19 ZeRO-2 on CPU (torch 2.13, gloo, DS_ACCELERATOR=cpu), with",
        (
            "wall_clock_breakdown on and a step line per step on every "
            "rank. tcpdump -s 96 recorded the link from 10.99.0.1."
        ),
        "",
        f"**Injected:** {case['what']}.",
        "",
        f"**When:** from {start} to {stop} ({(window[1] - window[0]).total_seconds():.1f} s), "
        f"{args.impair_after} s after the first logged step."
        if case["cause"]
        else "**When:** nothing was injected.",
        "",
        f"**How:** {case['how']}.",
        "",
        *([case["note"], ""] if "note" in case else []),
        "The machine (2 CPUs) was shared with other people's test runs while this ran, so step times carry",
        "their noise; each veth's receive processing was steered to its rank's CPU (rps_cpus) so the kernel",
        "does not reorder the gloo connection across CPUs.",
        "",
        "## What is here",
        "",
        "| file | what |",
        "|---|---|",
        *(
            (
                f"| `{host}/rank{r}.log.gz` | rank {r}'s own stdout and stderr, unedited (gzipped): {steps[r][0]} "
                f"step lines, {steps[r][1]} to {steps[r][2]} (as that rank's clock printed them) |"
            )
            for r, host in enumerate(HOSTS)
        ),
        "| `ds_config.json` | the DeepSpeed config both ranks used |",
        "| `capture.pcap.gz` | the link seen from 10.99.0.1 (`tcpdump -i tl-veth-a -s 96 tcp`), gzipped |",
        "| `expected.json` | the injected cause, window, hosts and ranks, for tests/test_lab_runs.py |",
        "",
        "## tshark's count of TCP retransmissions (`tcp.analysis.retransmission` among segments with data)",
        "",
        "| part of the run | seconds | data segments | retransmissions | per second |",
        "|---|---|---|---|---|",
        *(
            (
                f"| {part} | {c['seconds']} | {c['data_segments']} | {c['retransmissions']} | "
                f"{c['retransmissions_per_s']} |"
            )
            for part, c in counts.items()
        ),
        "",
        "## Each rank's DeepSpeed timers, median ms per step (from its logs; the window's times as above)",
        "",
        "| rank | part of the run | fwd | bwd_inner (compute) | bwd_allreduce (communication, waits) | step |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r} | {part} | " + " | ".join(f"{v:g}" for v in values) + " |"
            for r, parts in timers.items()
            for part, values in parts.items()
        ),
        "",
    ]
    if "clock_offset_s" in case:
        lines += ["Rank 1's log is stamped by its shifted clock; the capture and rank 0's log by the true one.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("scenario", "work", "fixture", "start", "stop", "loss-pct", "rate", "hogs", "skew", "impair-after"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    work, fixture = Path(args.work), Path(args.fixture)
    case = scenarios(args)[args.scenario]
    window = utc(args.start), utc(args.stop)
    pause = work / "out0" / "pause.json"
    if args.scenario == "checkpoint" and pause.is_file():
        span = json.loads(pause.read_text())
        window = tuple(datetime.fromtimestamp(span[k], timezone.utc) for k in ("from", "to"))
    if fixture.exists():
        shutil.rmtree(fixture)
    steps = {}
    for r, host in enumerate(HOSTS):
        (fixture / host).mkdir(parents=True)
        gzip_copy(work / "logs" / host / f"rank{r}.log", fixture / host / f"rank{r}.log.gz")
        steps[r] = step_span(work / "logs" / host / f"rank{r}.log")
    shutil.copy(work / "out0" / "ds_config.json", fixture / "ds_config.json")
    gzip_copy(work / "capture.pcap", fixture / "capture.pcap.gz")
    counts = retransmissions(work / "capture.pcap", *window)
    skews = case.get("clock_offset_s", {})
    timers = {
        r: timer_medians(work / "logs" / host / f"rank{r}.log", window, skews.get(host, 0.0))
        for r, host in enumerate(HOSTS)
    }
    expected = {
        "real": True,
        "synthetic": False,
        "scenario": args.scenario,
        "description": case["what"],
        "cause": case["cause"],
        "window": [t.isoformat(timespec="milliseconds") for t in window] if case["cause"] else None,
        "hosts": case["hosts"] if case["cause"] else [],
        "ranks": case["ranks"] if case["cause"] else [],
        "tolerance": 0.10,
        "tshark": counts,
        "made": f"{window[0]:%Y-%m-%d}",
    }
    if "clock_offset_s" in case:
        expected["clock_offset_s"] = case["clock_offset_s"]
    (fixture / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    (fixture / "README.md").write_text(readme(args.scenario, case, window, steps, counts, timers, args))


if __name__ == "__main__":
    main()
