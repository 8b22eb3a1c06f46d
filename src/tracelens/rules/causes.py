"""The competing causes of one slow window, each with its evidence for and against, and the verdict.

Inputs are the window's signals (derived.window_signals), each measured against the same run
outside the window. Only a signal that rose counts for a cause; one that was checked and stayed
at its baseline counts against the causes it would have shown. The candidates:

- straggler: the compute time of some ranks rose while the others' stayed flat (and their
  communication or step time rose: they waited for it). Compute time is the rank's own work,
  so a network problem cannot raise it: when compute rose on some ranks only, that outranks
  network signals in the same window, which are then listed as a possible effect (a stalled
  peer makes the other side's TCP stack probe and retransmit).
- contention: the compute time of every rank that logs timers rose (every host busy, not one).
- input pipeline or checkpoint: the wall time between step lines that the timers do not cover
  rose on the ranks, with compute and communication flat.
- bad link, congestion, receiver, NCCL failures: their packet, counter or NCCL signals rose
  above the baseline; each independent source (packets, counters, NCCL) counts once, and the
  communication time rising while compute stayed flat counts as one more.
- a throughput ceiling (congestion or a bandwidth limit) against a lossy link: when every rank's
  communication time rose on its fast steps too (the pace signal: every transfer slowed) with
  compute flat, and no port's own errors rose, the retransmissions are the ceiling's tail drops
  and count for congestion; random loss slows only the transfers that lost a segment.

The best score wins; a cause with no risen signal is never named, and the verdict is
"undetermined" with what to collect.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace

from tracelens.derived.events import CAUSES
from tracelens.derived.window_signals import Signal
from tracelens.findings import Verdict

NAMES = {
    **CAUSES,
    "congestion": "congestion or a bandwidth limit (the path carried less than the job sent)",
    "contention": "CPU or GPU contention on every rank",
    "input": "an input pipeline or checkpoint stall (the time between steps: data loader, checkpoint or evaluation)",
}
NETWORK = ("link", "congestion", "receiver", "failure")
FIXES = {
    "link": (
        "Find the loss on the named path: `ethtool -S <iface>` drops and errors, `ip -s link`, "
        "`nstat -az | grep -i retrans` on both hosts; on InfiniBand/RoCE `perfquery -x` and `mlxlink -d <dev> -m` on "
        "the named port. Reseat or replace the cable or transceiver, and drain the node until it is fixed."
    ),
    "congestion": (
        "Find what caps the path: rate limits and shaping on both hosts and between them (`tc -s qdisc show`, "
        "`nft list ruleset`, a cloud instance's or VPC's bandwidth cap, `ethtool <iface>` for a link that came up at "
        "a lower speed); on a fabric compare PortXmitWait per second across switch ports to find the hot link, check "
        "PFC/ECN on the RoCE priority end to end, spread the traffic (adaptive routing, NCCL_IB_QPS_PER_CONNECTION)."
    ),
    "receiver": "Check the receiving host's CPU load and its rank's step times; raise the receive queue depth.",
    "failure": "Read the NCCL warnings of the window on the named host (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET).",
    "straggler": "Look at the named rank's host in that window: CPU load and other processes (`top`, `pidstat 1`), "
    "CPU affinity and NUMA binding of the rank (`taskset -p <pid>`), GPU clocks and temperature (`nvidia-smi -q -d "
    "PERFORMANCE`), its data-loader workers. Move the rank to another node and see whether the slowness follows it.",
    "contention": (
        "Something took CPU or GPU time from every rank at once: look for other jobs or system services on all hosts "
        "in that window (`sar -u`, `pidstat`, cron jobs, a co-scheduled job), and for thermal or power capping "
        "(`nvidia-smi -q -d PERFORMANCE`)."
    ),
    "input": "Time the data loader and checkpoints separately: more DataLoader workers (`num_workers`, `pin_memory`, "
    "`prefetch_factor`), data on local disk, asynchronous checkpointing or a longer checkpoint interval.",
    "socket": "See TL101/TL412: make the HCAs visible to NCCL again.",
}
COLLECT_TIMERS = (
    "per-rank step timers on every rank (DeepSpeed `wall_clock_breakdown: true` and `steps_per_print: 1`, "
    "logged by every rank, not rank 0 only)"
)


@dataclass
class Candidate:
    cause: str
    score: float
    because: list[str]
    hosts: list[str]
    ranks: list[int]
    ports: list[str]


def candidates(signals: list[Signal]) -> list[Candidate]:
    """Every cause some risen signal supports, best first."""
    found = [*_rank_causes(signals), *_network_causes(signals)]
    if any(c.cause in ("straggler", "contention") for c in found):
        for c in found:
            if c.cause in NETWORK:  # compute rose: the network is at most an effect
                c.score = min(c.score, 0.9)
                c.because.append(
                    "the compute time of some rank rose in the same window, which no network problem "
                    "causes: these network signals may be an effect of the slow rank"
                )
    return sorted(found, key=lambda c: -c.score)


def _by(signals: list[Signal], cause: str) -> list[Signal]:
    return [s for s in signals if s.source == "steps" and s.cause == cause and s.comparable]


def _rank_causes(signals: list[Signal]) -> list[Candidate]:
    compute, comm, between, step = (_by(signals, c) for c in ("compute", "comm", "between", "step"))
    rose = [s for s in compute if s.rose]
    flat = [s for s in compute if not s.rose]
    # in a collective the last rank to arrive waits least: ranks whose communication rose waited for the others
    waiters = {s.where for s in comm if s.rose}
    leaders = [s for s in rose if s.where not in waiters]
    waiting = [s for s in rose if s.where in waiters]
    found = []
    if leaders and waiting and max(s.ratio or 0 for s in leaders) >= max(s.ratio or 0 for s in waiting):
        # every rank computed slower (the busy host takes CPU from its neighbours too), but some waited for the others
        waited = [s for s in comm if s.rose]
        found.append(
            Candidate(
                "straggler",
                3.0,
                [s.text for s in leaders]
                + [f"{s.text} (it waited)" for s in waited][:3]
                + [f"{s.text}, less than the straggler's" for s in waiting][:3],
                sorted({h for s in leaders for h in s.hosts}),
                sorted({s.rank for s in leaders if s.rank is not None}),
                [],
            )
        )
    elif rose and flat:
        waited = [s for s in comm + step if s.rose and s.where in {f.where for f in flat}]
        found.append(
            Candidate(
                "straggler",
                2.0 + (1.0 if waited else 0.0),
                [s.text for s in rose] + [s.text for s in flat][:3] + [f"{s.text} (it waited)" for s in waited][:3],
                sorted({h for s in rose for h in s.hosts}),
                sorted({s.rank for s in rose if s.rank is not None}),
                [],
            )
        )
    elif rose and len(rose) >= 2:
        found.append(
            Candidate("contention", 2.0, [s.text for s in rose][:6], sorted({h for s in rose for h in s.hosts}), [], [])
        )
    elif rose:  # one rank logs compute timers: straggler or everyone, cannot tell; named as the rank's own slowdown
        found.append(
            Candidate(
                "straggler",
                1.0,
                [s.text for s in rose],
                sorted({h for s in rose for h in s.hosts}),
                sorted({s.rank for s in rose if s.rank is not None}),
                [],
            )
        )
    stalled = [s for s in between if s.rose]
    # a lossy or congested network stalls the collectives outside the timers too: the input side
    # only when it stayed flat
    network_rose = any(s.rose and s.source != "steps" and s.cause in NETWORK for s in signals)
    work_flat = not rose and not any(s.rose for s in comm) and not network_rose
    if stalled and work_flat and len(stalled) * 2 > len(between):
        found.append(
            Candidate(
                "input",
                1.0 + (1.0 if len(stalled) == len(between) and len(between) >= 2 else 0.5),
                [s.text for s in stalled][:4] + [s.text for s in compute + comm][:4],
                sorted({h for s in stalled for h in s.hosts}),
                [],
                [],
            )
        )
    return found


def _network_causes(signals: list[Signal]) -> list[Candidate]:
    compute_flat = all(not s.rose for s in _by(signals, "compute"))
    comm_rose = [s for s in _by(signals, "comm") if s.rose]
    pace = _by(signals, "pace")
    paced = bool(pace) and all(s.rose for s in pace) and compute_flat
    rose_by = {cause: [s for s in signals if s.source != "steps" and s.cause == cause and s.rose] for cause in NETWORK}
    if paced and not any(s.locating for s in rose_by["link"]):
        # every rank's every transfer slowed to a steady pace, and no port's own errors rose: the
        # drops are a ceiling's (a rate limiter's or a full queue's tail drops), not a lossy link's
        rose_by["congestion"] += [
            replace(s, text=f"{s.text} (tail drops at the ceiling: every transfer slowed with them)")
            for s in rose_by["link"]
        ]
        rose_by["link"] = []
    found = []
    for cause in NETWORK:
        rose = rose_by[cause]
        if not rose:
            continue
        steady = cause == "congestion" and paced
        score = len({s.source for s in rose}) + (0.5 if comm_rose and compute_flat else 0.0) + (1.0 if steady else 0.0)
        located = [s for s in rose if s.locating]
        hosts = sorted({h for s in (located or rose) for h in s.hosts})
        because = (
            ([s.text for s in pace] if steady else [])
            + [s.text for s in rose][:6]
            + ([s.text for s in comm_rose][:2] if compute_flat else [])
        )
        found.append(Candidate(cause, score, because, hosts, [], sorted({s.port for s in located if s.port})))
    return found


def against(signals: list[Signal], named: str | None, where: Set[str] = frozenset()) -> list[str]:
    """The checked signals that stayed at their baseline, as what rules each other cause out, and
    the named cause's own signals elsewhere (not at `where`, the places that rose) that stayed at
    theirs: they rule those places out (a port's usual few errors all run long)."""
    out = []
    for s in signals:
        if (
            s.rose
            or not s.comparable
            or (s.cause == named and s.where in where)
            or (s.source == "steps" and s.cause == "step")
        ):
            continue
        if s.cause == named and not s.locating:
            continue
        out.append(s.text)
    return out


def verdict(signals: list[Signal], label: str, missing: list[str]) -> tuple[Verdict, Candidate | None]:
    """The verdict for one window (`label`: `steps 294-371 (02:10:05 to 02:10:50 UTC)`)."""
    found = candidates(signals)
    not_available = list(missing)
    if not _by(signals, "compute"):
        not_available.append(
            f"no per-rank compute timers: a straggler cannot be told from a network problem; collect {COLLECT_TIMERS}"
        )
    elif (
        len({s.where for s in _by(signals, "compute")}) == 1
        and len({s.where for s in signals if s.source == "steps"}) >= 1
    ):
        only = _by(signals, "compute")[0].where
        not_available.append(
            f"compute timers from {only} only: whether the other ranks were slow too (contention on every "
            f"rank) or waited for it (a straggler) cannot be told apart; collect {COLLECT_TIMERS}"
        )
    best = found[0] if found and found[0].score >= 1.0 else None
    if best is None:
        collect = "; ".join(missing) if missing else COLLECT_TIMERS
        head = f"Slow {label}: cause undetermined, no signal rose above its level outside the window; collect {collect}"
        return Verdict(None, "undetermined", head, [], against(signals, None), not_available, ""), None
    confidence = "high" if best.score >= 2.0 and (len(found) < 2 or found[1].score < best.score) else "medium"
    where = " and ".join(best.hosts) if best.hosts else "the run"
    if best.ranks:
        where = (
            f"rank {', '.join(map(str, best.ranks))} on {where}"
            if best.hosts
            else f"rank {', '.join(map(str, best.ranks))}"
        )
    if best.ports:
        where += " (" + ", ".join(f"{p.rpartition(':')[0]} port {p.rpartition(':')[2]}" for p in best.ports) + ")"
    head = f"Slow {label}: {NAMES[best.cause]} on {where}, confidence {confidence}"
    others = [f"also considered: {NAMES[c.cause]} (score {c.score:.1f}): {c.because[0]}" for c in found[1:3]]
    rose_at = {s.where for s in signals if s.rose and s.cause == best.cause}
    return Verdict(
        best.cause,
        confidence,
        head,
        best.because,
        others + against(signals, best.cause, rose_at),
        not_available,
        FIXES.get(best.cause, ""),
    ), best
