"""The competing causes of one slow window, each with its evidence for and against, and the verdict.

The causes follow the timing model of a synchronous data-parallel step (docs/timing-model.md):
every rank enters each collective, which completes when the last rank arrives, so a rank's step
is its own work plus its wait for the last rank (plus the transfer). Inputs are the window's
signals (derived.window_signals), each measured against the same run outside the window; per
rank they are its own work (forward and optimizer step), its wait (the phases that hold a
collective: backward with its overlapped all-reduce, all-gathers), and the time between steps.

- straggler: some ranks' own work rose while the others' stayed flat; the others' wait rose
  (they waited for it) and the slow ranks waited least. A network problem cannot raise a rank's
  own work, so network signals in the same window are then a possible effect at most.
- contention: every rank's own work rose (every host busy, not one).
- input pipeline or checkpoint: the wall time between steps that the timers do not cover rose
  on most ranks, more than their wait did, with their own work flat.
- a bad link, congestion, a slow receiver, NCCL failures: their packet, counter or NCCL
  signals rose above the baseline; each independent source counts once, and every rank
  waiting longer while no rank's own work rose counts as one more. A ceiling on the path's
  peak rate (every burst capped) makes the retransmissions a ceiling's tail drops: congestion
  or a bandwidth limit, not a lossy link.
- slower collectives on every rank: every rank waited longer and no rank's own work rose,
  with no network source that rose to say more (captures and counters name the rest).

The best score wins; a cause with no risen signal is never named, and the verdict is
"undetermined" with what to collect. The confidence is high only where the named cause beats
the runner-up by MARGIN, and the verdict names the runner-up.
"""

from __future__ import annotations

from collections.abc import Collection, Set
from dataclasses import dataclass, replace

from tracelens.derived.events import CAUSES
from tracelens.derived.window_signals import Signal
from tracelens.findings import Verdict
from tracelens.prose import listing

NAMES = {
    **CAUSES,
    "congestion": "congestion or a bandwidth limit (the path carried less than the job sent)",
    "contention": "CPU or GPU contention on every rank",
    "input": "an input pipeline or checkpoint stall (the time between steps: data loader, checkpoint or evaluation)",
    "comm": "slower collectives on every rank (every rank waited longer while no rank's own work rose)",
}
SHORT = {
    "link": "a bad link",
    "congestion": "congestion",
    "receiver": "a slow receiver",
    "failure": "NCCL failures",
    "straggler": "a straggler",
    "contention": "contention",
    "input": "an input stall",
    "comm": "slower collectives",
    "socket": "NCCL on sockets",
}
NETWORK = ("link", "congestion", "receiver", "failure")
MARGIN = 1.0  # a verdict is sure (confidence high) when its score beats the runner-up's by this much
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
    "comm": "Every rank waited longer in its collectives while none computed longer: the network or the "
    "collective's path. Capture the link (`tcpdump -s 96`) and read the port counters (`perfquery -x`, "
    "`ethtool -S <iface>`) over the next slow stretch to tell loss from a bandwidth limit.",
}
COLLECT_TIMERS = (
    "per-rank step timers on every rank (DeepSpeed `wall_clock_breakdown: true` and `steps_per_print: 1`, "
    "logged by every rank, not rank 0 only) or a PyTorch profiler trace of every rank"
)


@dataclass
class Candidate:
    cause: str
    score: float
    because: list[str]
    hosts: list[str]
    ranks: list[int]
    ports: list[str]


def candidates(signals: list[Signal], world: int = 0) -> list[Candidate]:
    """Every cause some risen signal supports, best first; `world`: the job's ranks as its inputs tell
    (window_signals.world_size), of which the signals may time only some."""
    network = _network_causes(signals)
    # a network source that rose names what slowed the collectives
    found = [c for c in _rank_causes(signals, world) if not (network and c.cause == "comm")] + network
    if any(s.rose for s in _by(signals, "own")):
        for c in found:
            if c.cause in NETWORK:  # a rank's own work rose: the network is at most an effect
                c.score = min(c.score, 0.9)
                c.because.append(
                    "the own work of some rank rose in the same window, which no network problem "
                    "causes: these network signals may be an effect of the slow rank"
                )
    return sorted(found, key=lambda c: -c.score)


def _by(signals: list[Signal], cause: str) -> list[Signal]:
    """The ranks' step signals of `cause`: the timers', and the profiler traces' for ranks the timers miss."""
    timed = [s for s in signals if s.source == "steps" and s.cause == cause and s.comparable]
    traced = [s for s in signals if s.source == "traces" and s.cause == cause and s.comparable]
    return timed + [s for s in traced if s.where not in {t.where for t in timed}]


def _change(signal: Signal | None) -> float:
    return signal.change or 0.0 if signal is not None else 0.0


def arrival(signals: list[Signal]) -> dict[str, float]:
    """Per rank, how much longer it waited in the window than outside it (ms per step): the change of
    its collective timers where they hold the wait (the all-reduce after backward), of its time inside
    collectives by the comms logger, less how much later than the others it returned from its
    asynchronous calls (ZeRO-3's prefetch: issued late, they return late), or of all its waiting phases
    (with overlapped communication backward holds the wait; under ZeRO-3 forward too). Whichever the ranks differ
    in most: a cause that slows every rank alike moves both alike, a late rank shows in the one that
    holds the wait. The rank that waited least arrived last. Profiler traces of every rank measure
    the arrivals themselves: their wait for the last rank wins."""
    if len(traced := {s.where: _change(s) for s in _by(signals, "arrival")}) >= 2:
        return traced
    by = {cause: {s.where: _change(s) for s in _by(signals, cause)} for cause in ("comm", "coll", "wait")}
    by["late"] = {s.where: -_change(s) for s in _by(signals, "late")}  # who returned later waited less
    spread = {cause: max(v.values()) - min(v.values()) if len(v) >= 2 else 0.0 for cause, v in by.items()}
    full = [cause for cause, v in by.items() if v.keys() >= by["wait"].keys()]  # every rank that waited has it
    return by[max(full, key=lambda cause: spread[cause])]


def late_ranks(waited: dict[str, float]) -> list[str]:
    """The ranks that arrived last: those below the widest gap in how much longer each waited."""
    if len(waited) < 2:
        return []
    order = sorted(waited, key=lambda w: waited[w])
    cut = max(range(len(order) - 1), key=lambda i: waited[order[i + 1]] - waited[order[i]]) + 1
    return order[:cut]


# The share of the other ranks' lost time spent waiting for the late ones at which a straggler and
# contention on every rank tie: the late ranks then slowed half as much again as the others did.
LATE_SHARE = 1 / 3
# What a cause read only from where the time sat (who arrived last, whether a rise was inside the
# timed calls or between the steps) scores where a source besides the steps shows the network lost
# packets: below any network cause, since a lossy hop moves those readings too.
BESIDE_LOST_PACKETS = 0.9


@dataclass(frozen=True)
class _Ranks:
    """The ranks' step signals in one window, by rank (`where`)."""

    own: dict[str, Signal]
    wait: dict[str, Signal]
    between: dict[str, Signal]
    coll: dict[str, Signal]  # the comms logger's time inside the collective calls, where it ran
    waited: dict[str, float]  # arrival()

    @classmethod
    def of(cls, signals: list[Signal]) -> _Ranks:
        own = {s.where: s for s in _by(signals, "own")}
        # a forward that rose against the job's pace is the rank's own work rising, even under ZeRO-3 (the
        # all-gathers every rank shares are divided out) or when the job's pace moved with it
        ahead = {s.where: s for s in _by(signals, "ahead") if s.rose}
        own |= {w: s for w, s in ahead.items() if w in own and not own[w].rose}
        waited = {w: v for w, v in arrival(signals).items() if w in own}
        wait, between, coll = ({s.where: s for s in _by(signals, c)} for c in ("wait", "between", "coll"))
        return cls(own, wait, between, coll, waited)

    def lost(self, ranks: list[str]) -> float:
        """What the ranks lost per step in the window (their middle): own work, waiting and stalls."""
        return _middle([sum(_change(d.get(w)) for d in (self.own, self.wait, self.between)) for w in ranks])

    def waited_for(self, late: list[str], others: list[str]) -> float:
        """How much longer `others` waited per step than `late` (their middles)."""
        return _middle([self.waited[w] for w in others if w in self.waited]) - _middle(
            [self.waited[w] for w in late if w in self.waited]
        )


def unseen_ranks(timed: Collection[str], world: int) -> int:
    """How many of the job's `world` ranks log no step timers, given the ranks that do (`timed`); a
    distributed job has two ranks at least, and with no rank timed there is no view to be partial."""
    return max(world, 2) - len(timed) if timed else 0


def _rank_causes(signals: list[Signal], world: int) -> list[Candidate]:
    ranks = _Ranks.of(signals)
    slow = [s for s in ranks.own.values() if s.rose]
    network = any(s.rose and s.source != "steps" and s.cause in NETWORK for s in signals)
    # packets lost (not a silence: every rank paused for a checkpoint sends nothing either)
    lost = any(s.rose and s.source != "steps" and s.cause == "link" and s.what != "silence" for s in signals)
    unseen = unseen_ranks(ranks.own, world)
    found = _slow_ranks(ranks, slow, unseen) if slow else _late_ranks(ranks, network, unseen)
    stalled = [s for s in ranks.between.values() if s.rose]
    # a stall between steps, not a slower collective: the time outside the timers grew more than the
    # waiting did, or the waiting rose nowhere (ranks stalled out of step wait for each other a little)
    # with no network source risen to say the collectives themselves slowed
    outgrew = all(_change(s) > _change(ranks.wait.get(s.where)) for s in stalled) or not (
        network or any(s.rose for s in ranks.wait.values())
    )
    if stalled and not slow and outgrew and len(stalled) * 2 > len(ranks.between):
        every = len(stalled) == len(ranks.between) and len(stalled) >= 2
        # a collective outside the timers (the loop's own all-reduce of its loss, a barrier) stalls on
        # lost packets too: beside them, the time between steps is no sign of the input
        found.append(
            Candidate(
                "input",
                BESIDE_LOST_PACKETS if lost else 1.0 + (1.0 if every else 0.5),
                [s.text for s in stalled][:4] + [s.text for s in [*ranks.own.values(), *ranks.wait.values()]][:4],
                sorted({h for s in stalled for h in s.hosts}),
                [],
                [],
            )
        )
    waited = [s for s in ranks.wait.values() if s.rose]
    if ranks.own and not slow and waited and len(waited) == len(ranks.wait) and not found:
        found.append(_every_rank_waited(ranks, waited, network, unseen))
    return found


def _every_rank_waited(ranks: _Ranks, waited: list[Signal], network: bool, unseen: int) -> Candidate:
    """Every rank's waiting phases rose, no rank's own work did and none arrived last: the collectives
    slowed, unless the comms logger timed the calls and most of the rise sat outside them. Under ZeRO-3
    forward and backward are both "waiting" phases and hold the compute too: every rank computing
    slower between its calls is contention on every rank. But an asynchronous call's wait sits outside
    it too, so where a source besides the steps shows the network lost packets (`network`), that
    split alone scores below the network cause. Where `unseen` ranks log no step timers (DeepSpeed
    prints them on rank 0 only by default), one of those arriving last looks the same from here: the
    collectives are then no more than a guess."""
    lead = [s.text for s in sorted(waited, key=lambda s: -_change(s))][:4]
    if unseen > 0:
        seen = listing(sorted(ranks.wait))
        mine = "their" if len(ranks.wait) > 1 else "its"
        return _unseen_came_later(
            f"{seen} waited longer at the collectives while {mine} own work did not rise", unseen, lead
        )
    calls = ranks.coll
    if calls.keys() >= ranks.wait.keys():
        inside = _middle([_change(calls[w]) for w in ranks.wait])
        rise = _middle([_change(s) for s in waited])
        if inside < rise / 2:
            because = [
                f"every rank's waiting phases rose by {rise:.0f} ms per step, {inside:.0f} ms of it inside its "
                "collective calls: the work between the calls slowed"
            ]
            because += lead[:3] + [calls[w].text for w in list(ranks.wait)[:2]]
            score = BESIDE_LOST_PACKETS if network else 1.5
            return Candidate("contention", score, because, sorted({h for s in waited for h in s.hosts}), [], [])
    return Candidate("comm", 1.0, lead + [s.text for s in ranks.own.values()][:2], [], [], [])


def _unseen_came_later(seen: str, unseen: int, lead: list[str]) -> Candidate:
    """What the ranks with timers show (`seen`) is a wait for someone, and `unseen` ranks log no step
    timers: one of them arriving last cannot be told from slower collectives, so no cause is more than a
    guess (it scores below any cause)."""
    unknown = (
        f"{seen}; {unseen} other rank{'s' if unseen > 1 else ''} of the job log no step timers, so one of them "
        "arriving last cannot be told from slower collectives"
    )
    return Candidate("comm", 0.5, [unknown, *lead], [], [], [])


# A rank's waiting phases rose by this factor more than its own work did: beyond its own compute
# slowing (the rolling baseline's sustained ratio), it waited for someone
WAITED_MORE = 1.25


def _waited_more(own: Signal, wait: Signal | None) -> bool:
    return bool(wait and wait.ratio and own.ratio and wait.ratio > WAITED_MORE * own.ratio)


def _slow_ranks(ranks: _Ranks, slow: list[Signal], unseen: int) -> list[Candidate]:
    """Some rank's own work rose: a straggler (the late ranks, the others waiting for them), contention
    on every rank (every rank slower by itself), or both weighed by the share of the others' lost time
    they spent waiting. A straggler waits least: where `unseen` ranks log no step timers and every slow
    rank seen had its waiting phases rise by a larger factor than its own work (a busy rank's backward
    compute rises by the same factor as its forward, a straggler's wait falls), someone came later than
    they did."""
    waiting = [s for s in slow if _waited_more(s, ranks.wait.get(s.where))]
    if unseen > 0 and slow and len(waiting) == len(slow):
        rises = "; ".join(
            f"{s.where}: waiting phases {ranks.wait[s.where].ratio:.1f}x, own work {s.ratio:.1f}x" for s in slow
        )
        seen = f"{rises}, so {'they' if len(slow) > 1 else 'it'} waited for someone"
        shown = [ranks.wait[s.where].text for s in slow][:2] + [s.text for s in slow][:2]
        return [_unseen_came_later(seen, unseen, shown)]
    every = len(slow) == len(ranks.own) >= 2
    late = late_ranks(ranks.waited)
    if not late or _middle([_change(ranks.own[w]) for w in late]) <= max(
        _change(ranks.own[w]) for w in ranks.own if w not in late
    ):
        late = [] if every else [s.where for s in slow]  # no rank arrived last: those whose own work rose
    others = [w for w in ranks.own if w not in late]
    waited = max(ranks.waited_for(late, others), 0.0) if late and others else 0.0
    lost = ranks.lost(others) if others else 0.0
    share = min(waited / lost, 1.0) if lost > 0 else 0.0
    found = []
    if late and (not every or share > 0):
        lead = sorted((ranks.own[w] for w in late), key=lambda s: -_change(s))
        because = [s.text for s in lead]
        if others:
            because.append(
                f"the other ranks waited {waited:.0f} ms per step longer than {listing([s.where for s in lead])}, "
                f"which arrived last at the collectives: {share:.0%} of the {lost:.0f} ms per step they lost"
            )
        because += [f"{ranks.wait[w].text} (it waited)" for w in others if w in ranks.wait][:2]
        score = (2.0 + _unit(share / LATE_SHARE - 1.0) if every else 3.0) if len(ranks.own) >= 2 else 1.0
        hosts = sorted({h for s in lead for h in s.hosts})
        found.append(
            Candidate("straggler", score, because, hosts, sorted({s.rank for s in lead if s.rank is not None}), [])
        )
    if every:
        because = [s.text for s in sorted(slow, key=lambda s: -_change(s))][:4]
        because.append(f"every rank's own work rose; they spent {share:.0%} of the time they lost waiting for the last")
        hosts = sorted({h for s in slow for h in s.hosts})
        found.append(Candidate("contention", 2.0 + _unit(1.0 - share / LATE_SHARE), because, hosts, [], []))
    return found


def _late_ranks(ranks: _Ranks, network: bool, unseen: int) -> list[Candidate]:
    """No timer shows a rank's own work rise (ZeRO-3's forward waits, or the work ran between the
    timers), but every other rank waited longer, and the late ones arrived so much later that the
    others spent at least LATE_SHARE of what they lost waiting for them. Arrival alone is weak where
    a source besides the steps shows the network lost packets (`network`): both ends of a lossy hop
    reach their next collective late, so the late ranks then score below any network cause; and
    where `unseen` ranks log no step timers, one of them may have come later still."""
    late = late_ranks(ranks.waited)
    others = [w for w in ranks.waited if w not in late]
    if not late or len(late) > len(others) or not all(w in ranks.wait for w in ranks.waited):
        return []  # most ranks late is a few early: no one held the others up
    if any(ranks.own[w].source == "traces" for w in late if w in ranks.own):
        return []  # a profiler trace measures all of a rank's own work: flat, it came late from the network
    waited, lost = ranks.waited_for(late, others), ranks.lost(others)
    if not all(ranks.wait[w].rose for w in others) or lost <= 0 or waited < LATE_SHARE * lost:
        return []
    stalled = [ranks.between[w] for w in late if w in ranks.between and ranks.between[w].rose]
    lead = [ranks.wait[w] for w in late]
    because = [
        f"the other ranks waited {waited:.0f} ms per step longer than {listing(late)}, "
        f"{waited / lost:.0%} of the {lost:.0f} ms per step they lost: "
        f"{'they' if len(late) > 1 else 'it'} arrived last at the collectives"
    ]
    because += [s.text for s in stalled] + [s.text for s in lead][:2]
    hosts = sorted({h for s in lead for h in s.hosts})
    ranks_ = sorted({s.rank for s in lead if s.rank is not None})
    score = BESIDE_LOST_PACKETS if network else 1.5 + (0.5 if stalled else 0.0)
    if unseen > 0:
        because.append(f"{unseen} other ranks of the job log no step timers: one of them may have come later still")
        score = min(score, 0.9)
    return [Candidate("straggler", score, because, hosts, ranks_, [])]


def _unit(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def _middle(values: list[float]) -> float:
    """The median of `values` (0 for none)."""
    if not values:
        return 0.0
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _network_causes(signals: list[Signal]) -> list[Candidate]:
    own = _by(signals, "own")
    wait = _by(signals, "wait")
    # the model agrees with a network cause: every rank waited longer while no rank's own work rose
    model = bool(own) and not any(s.rose for s in own) and bool(wait) and all(s.rose for s in wait)
    pace = _by(signals, "pace")
    paced = bool(pace) and all(s.rose for s in pace) and not any(s.rose for s in own)
    dead = any(s.what == "silence" and s.rose for s in signals)  # a silent direction: nothing got through
    ceilings = [] if dead else [s for s in signals if s.cause == "ceiling" and s.rose] + (pace if paced else [])
    rose_by = {cause: [s for s in signals if s.source != "steps" and s.cause == cause and s.rose] for cause in NETWORK}
    if ceilings and not any(s.locating for s in rose_by["link"]):
        # every transfer slowed to a ceiling and no port's own errors rose: the drops are a ceiling's
        # (a rate limiter's or a full queue's tail drops), not a lossy link's
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
        steady = cause == "congestion" and bool(ceilings)
        score = len({s.source for s in rose}) + (0.5 if model else 0.0) + (1.0 if steady else 0.0)
        located = [s for s in rose if s.locating]
        hosts = sorted({h for s in (located or rose) for h in s.hosts})
        because = (
            ([s.text for s in ceilings] if steady else [])
            + [s.text for s in rose][:6]
            + ([s.text for s in wait][:2] if model else [])
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


def verdict(
    signals: list[Signal], label: str, missing: list[str], forward_waits: bool = False, world: int = 0
) -> tuple[Verdict, Candidate | None]:
    """The verdict for one window (`label`: `steps 294-371 (02:10:05 to 02:10:50 UTC)`); `forward_waits`:
    ZeRO-3, whose forward holds collectives, so no timer measures a rank's own work alone; `world`: the
    job's ranks as its inputs tell."""
    found = candidates(signals, world)
    not_available = list(missing)
    own = _by(signals, "own")
    partial = False
    if not own:
        not_available.append(
            f"no per-rank step timers: a slow rank cannot be told from a network problem; collect {COLLECT_TIMERS}"
        )
    elif forward_waits:
        not_available.append(
            "under ZeRO-3 forward all-gathers the parameters, so no timer measures a rank's own work alone: a slow "
            "rank and a slow network raise every rank's timers alike; a PyTorch profiler trace of every rank shows "
            "which rank entered each collective last"
        )
    elif partial := unseen_ranks(timed := sorted({s.where for s in own}), world) > 0:
        of = f" of the job's {world} ranks" if world > len(timed) else ""
        not_available.append(
            f"step timers from {listing(timed)} only{of}: whether the other ranks were slow too (contention on "
            f"every rank), waited for a slow one, or were the slow one cannot be told apart; collect {COLLECT_TIMERS}"
        )
    best = found[0] if found and found[0].score >= 1.0 else None
    if best is None:
        # what would split a rank's own work from its waiting first, where no timer of any rank does
        collect = "; ".join(([] if own and not partial else [COLLECT_TIMERS]) + missing)
        why = found[0].because[0] if found else "no signal rose above its level outside the window"
        head = f"Slow {label}: cause undetermined, {why}; collect {collect}"
        return Verdict(None, "undetermined", head, [], against(signals, None), not_available, ""), None
    runner_up = found[1] if len(found) > 1 else None
    sure = best.score >= 2.0 and (runner_up is None or best.score - runner_up.score >= MARGIN)
    confidence = "high" if sure else "medium"
    head = f"Slow {label}: {NAMES[best.cause]} on {_where(best)}, confidence {confidence}"
    if runner_up is not None:
        head += f" (runner-up: {SHORT[runner_up.cause]})"
    others = [
        f"runner-up: {NAMES[c.cause]} (score {c.score:.1f} against {best.score:.1f}): {c.because[0]}"
        for c in found[1:3]
    ]
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


def _where(best: Candidate) -> str:
    """`rank 3 on node-b`, `ranks 2, 3 on node-b`, `node01 and node02 (mlx5_1 port 1)` or `the run`."""
    where = " and ".join(best.hosts) if best.hosts else "the run"
    if best.ranks:
        ranks = f"rank{'s' if len(best.ranks) > 1 else ''} {', '.join(map(str, best.ranks))}"
        where = f"{ranks} on {where}" if best.hosts else ranks
    if best.ports:
        where += " (" + ", ".join(f"{p.rpartition(':')[0]} port {p.rpartition(':')[2]}" for p in best.ports) + ")"
    return where
