"""TL420-TL423: a hung job, from PyTorch Flight Recorder dumps and stack dumps (tracelens.derived.hangs).

TL420 names the collective the job hung in, TL421 a desync (ranks that issued different
collectives at one sequence id), TL422 the rank that stopped first and where it was, TL423
what the network and NCCL said at that moment. TL411 (rules.correlate) names the same rank
when dumps are present, through the RunContext's first_stopped. TL424 reads a hang from the
ranks' stack dumps alone, when no Flight Recorder dump says more.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from tracelens.derived import RunContext, hangs
from tracelens.findings import Evidence, Finding, Severity
from tracelens.findings.evidence import row_evidence
from tracelens.inferred import LOG_TABLES
from tracelens.prose import clock, listing, ranks_text, some
from tracelens.rules import Setting, rule

# A job that stopped outranks every slow window and stall (TL410 and TL411 score the sources that
# agree, a handful at most): the hang is the headline.
HANG_SCORE = 10.0


def _entry_text(e: Mapping[str, Any]) -> str:
    when = f", enqueued {e['ts']:%H:%M:%S.%f}"[:-3] + " UTC" if e.get("ts") else ""
    return (
        f"rank {e['rank']}: {e.get('profiling_name') or e.get('op')} #{e.get('collective_seq_id')} of process group "
        f"{e['pg']} {e.get('status')}, sizes {e.get('input_sizes')}{when}, at "
        f"{hangs.frame_text(hangs.call_site(e.get('frames')))}"
    )


def _hosts(rows: Sequence[dict | None]) -> list[str]:
    return sorted({r["host"] for r in rows if r and r.get("host")})


@rule("TL420", "hung-collective", Severity.CRITICAL, needs=("fr_entries",))
def hung_collective(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: from the Flight Recorder dumps of the ranks (or PyTorch's analyzer text),
    the collective the job hung in: per process group, the first sequence id that is not
    completed on all of the group's ranks, with the ranks that wait in it (their entry is
    scheduled or started), the ranks that never started it (their last entry in the group is
    older) and the ranks that left no dump. When several groups are stuck, the one most
    ranks wait in comes first; the others are its consequence.

    Why it slows the run: a collective completes only when every rank of its group joins it.
    One rank that never arrives (stuck in Python, crashed, or busy in another group's
    collective) holds every other rank in the wait until the watchdog kills the job
    (TORCH_NCCL / gloo timeout, 10-30 min by default), and the work since the last checkpoint
    is lost.

    How to fix: look at where the ranks that never started it were (TL422 and their stack
    dumps: `py-spy dump --pid <pid>`); a rank busy in another group's collective means the
    ranks call collectives of different groups in a different order: make every rank issue
    them in the same order. Keep the Flight Recorder on for the next run:
    TORCH_FR_BUFFER_SIZE=2000 (TORCH_NCCL_TRACE_BUFFER_SIZE before 2.5),
    TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_ and TORCH_NCCL_DUMP_ON_TIMEOUT=1.
    """
    found = ctx.stuck_collectives
    if not found:
        return
    root, rest = found[0], found[1:]
    waiting = [m.entry for m in root.members if m.doing in ("waiting", "failed") and m.entry]
    never = [m for m in root.members if m.doing == "never started"]
    gone = root.ranks("no dump")
    failed = root.ranks("failed")
    site = hangs.call_site(waiting[0]["frames"]) if waiting else None
    what = f"{root.op or 'collective'} #{root.seq} of {root.label}"
    parts = [
        f"{what} (sizes {root.sizes}) was enqueued by {ranks_text([e['rank'] for e in waiting])}"
        + (f" from {hangs.frame_text(site)}" if site else "")
        + (f" at {root.since:%H:%M:%S} UTC" if root.since else "")
        + " and never completed on all its ranks"
    ]
    if failed:
        parts.append(f"it raised on {ranks_text(failed)} (the tracebacks in the logs)")
    if never:
        last = [f"rank {m.rank} at #{m.entry['collective_seq_id']}" for m in never if m.entry]
        parts.append(
            f"{ranks_text([m.rank for m in never])} never started it"
            + (f" (last entry in the group: {', '.join(last[:4])})" if last else "")
        )
    if gone:
        parts.append(f"{ranks_text(gone)} left no Flight Recorder dump (dead, or the dump was not collected)")
    also = ""
    if rest:
        also = (
            " Also stuck, as a consequence: "
            + "; ".join(
                (
                    f"#{s.seq} of {s.label}, where {ranks_text(s.ranks('waiting'))} "
                    f"{'waits' if len(s.ranks('waiting')) == 1 else 'wait'}"
                )
                for s in rest[:3]
            )
            + "."
        )
    culprits = root.culprits
    yield Finding(
        severity=Severity.CRITICAL,
        title=f"Hang: {what} never completed" + (f"; {ranks_text(culprits)} never joined it" if culprits else ""),
        summary="; ".join(parts) + "." + also,
        evidence=row_evidence(waiting, 4, _entry_text)
        + row_evidence((m.entry for m in never if m.entry), 4, _entry_text),
        hosts=_hosts([m.entry for m in never]) or _hosts(waiting),
        ranks=culprits or [e["rank"] for e in waiting],
        window=(root.since, root.since) if root.since else None,
        score=3.0,
    )


@rule("TL421", "collective-desync", Severity.CRITICAL, needs=("fr_entries",))
def collective_desync(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: ranks that issued a different collective than the others of the same
    process group at the same sequence id: another op (all_reduce against broadcast),
    another input size, or another dtype, from the Flight Recorder dumps; with both call
    sites from the entries' frames. The first such sequence id per group is reported.

    Why it slows the run: collectives are matched by their order in the group, so a rank
    that skips one, adds one or passes a tensor of another shape pairs with the wrong
    collective of its peers: NCCL hangs (or corrupts data when sizes agree by chance), gloo
    aborts with "Received data size doesn't match expected size" or waits forever.

    How to fix: make every rank issue the same collectives in the same order with the same
    shapes and dtypes: no collective under a rank-dependent `if`, the same model and bucket
    layout on every rank (DDP checks this with TORCH_DISTRIBUTED_DEBUG=DETAIL, which also
    reports mismatched collectives at the call), no data-dependent early exit on one rank.
    """
    for d in ctx.desyncs:
        column = {"op": "op", "input sizes": "input_sizes", "dtypes": "input_dtypes"}[d.what]
        odd_ranks = [o["rank"] for o in d.odd]
        usual_site, odd_site = hangs.call_site(d.usual.get("frames")), hangs.call_site(d.odd[0].get("frames"))
        label = f"process group {d.pg}" + (
            f" ({d.pg_desc})" if d.pg_desc and d.pg_desc not in ("undefined", d.pg) else ""
        )
        yield Finding(
            severity=Severity.CRITICAL,
            title=f"Desync at #{d.seq} of {label}: {ranks_text(odd_ranks)} issued another {d.what}",
            summary=(
                f"At sequence id {d.seq} of {label}, {ranks_text(odd_ranks)} issued {d.odd[0].get('op')} with "
                f"{d.what} {d.odd[0].get(column)} from {hangs.frame_text(odd_site)}, where rank {d.usual['rank']} "
                f"(and the others) issued {d.usual.get('op')} with {d.what} {d.usual.get(column)} from "
                f"{hangs.frame_text(usual_site)}."
            ),
            evidence=row_evidence(d.odd, 4, _entry_text) + row_evidence([d.usual], 1, _entry_text),
            hosts=_hosts(list(d.odd)),
            ranks=odd_ranks,
            score=3.0,
        )


@rule("TL422", "first-rank-stopped", Severity.CRITICAL, needs=("fr_entries",))
def first_rank_stopped(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: in a hang, the rank that stopped first and where it was: the rank the
    hung collective's other ranks wait for (it never started it, or it left no dump), else
    the rank whose last Flight Recorder activity is the oldest; and where it was, from its
    stack dump (py-spy, faulthandler), a traceback or C++ abort in its log, or its own
    pending collective: the data loader, a checkpoint write, an exception, a collective of
    another group, or plain Python code.

    Why it slows the run: the other ranks are only waiting; the time is lost where this rank
    is. A rank stuck in its input pipeline, writing a checkpoint alone, or dead after an
    exception holds the whole job.

    How to fix: follow where it was. The data loader: check the storage it reads and its
    worker processes (`py-spy dump --subprocesses --pid <pid>`), raise
    DataLoader(timeout=...) so a stuck read fails loudly. A checkpoint write: write from
    every rank together or outside the collective schedule, and check the filesystem. An
    exception: read that rank's traceback; with torchrun, `--max-restarts` only helps after
    the cause is fixed. No dump and no stack: look for the OOM killer (`dmesg -T | grep -i
    kill`) or a node failure.
    """
    stop = ctx.first_stopped
    if stop is None:
        return
    site = f": {hangs.frame_text(stop.frame)}" if stop.frame else ""
    when = f" Its last Flight Recorder entry is from {stop.at:%H:%M:%S} UTC." if stop.at else ""
    yield Finding(
        severity=Severity.CRITICAL,
        title=f"Rank {stop.rank} stopped first, in {stop.where.split(' (')[0]}{site}",
        summary=f"Rank {stop.rank} stopped first: {stop.why}. It was in {stop.where}{site}.{when}",
        evidence=row_evidence(stop.evidence),
        ranks=[stop.rank],
        window=(stop.at, stop.at) if stop.at else None,
        score=3.5,
    )


@rule(
    "TL423",
    "hang-network-context",
    Severity.WARNING,
    needs=("fr_entries",),
    settings={
        "before_s": Setting("seconds", "Network events this long before the first rank stopped belong to the hang ..."),
        "after_s": Setting("seconds", "... and those this soon after it (times of different sources are that loose)."),
    },
)
def hang_network_context(ctx: RunContext, *, before_s: float = 60.0, after_s: float = 10.0) -> Iterator[Finding]:
    """
    What it finds: NCCL errors, port counter rises and packet evidence (retransmissions,
    NAKs, CNPs) in the minute before the first rank of a hang stopped (TL422), from every
    source on the aligned timeline: whether the network had a part in it.

    Why it slows the run: a rank whose link failed, or whose transfers are retried for
    seconds, stops in a collective as surely as one stuck in Python; the hang's other
    evidence then names a rank, and this names the link under it.

    How to fix: fix the link first: check the named host's port with `perfquery -x` and
    `ibstat` (`ethtool -S` on RoCE), and NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT; then relaunch
    with the Flight Recorder on (TORCH_FR_BUFFER_SIZE=2000) to confirm.
    """
    stop = ctx.first_stopped
    if stop is None or stop.at is None:
        return
    around = timedelta(seconds=before_s)
    events = ctx.network_events.filter(
        pl.col("cause") != "stall",
        pl.col("lo") <= stop.at + timedelta(seconds=after_s),
        pl.coalesce("hi", "lo") >= stop.at - around,
    )
    if events.height == 0:
        return
    kinds = events.group_by("source", "what", "host").agg(pl.col("count").sum(), pl.col("lo").min())
    # equal counts by name
    kinds = kinds.sort("count", "what", "source", "host", descending=[True, False, False, False], nulls_last=True)
    said = "; ".join(
        f"{r['count']:,} {r['what']} ({r['source']}, {r['host'] or 'host not named'}, from {r['lo']:%H:%M:%S})"
        for r in kinds.head(4).iter_rows(named=True)
    )
    yield Finding(
        severity=Severity.WARNING,
        title=(
            f"Network events in the {'minute' if before_s == 60 else f'{before_s:g} s'} before rank {stop.rank} stopped"
        ),
        summary=f"Rank {stop.rank} stopped first at {stop.at:%H:%M:%S} UTC; in the {before_s:g} s before: {said}.",
        evidence=row_evidence(events.iter_rows(named=True), 6),
        hosts=sorted(set(events["host"].drop_nulls().to_list())),
        ranks=[stop.rank],
        window=(stop.at - around, stop.at),
        score=2.0,
    )


@rule("TL424", "hang-in-stack-dumps", Severity.CRITICAL, needs=("stacks",))
def hang_in_stack_dumps(ctx: RunContext) -> Iterator[Finding]:
    """
    What it finds: a hung job from the stack dumps of its ranks (`py-spy dump`, faulthandler,
    `ray stack`) when no Flight Recorder dump says more: per rank, whether its main thread waits
    in a collective (torch.distributed's or DeepSpeed's deepspeed.comm wrappers, gloo or NCCL;
    under DDP, idle in the autograd engine, where the gradients' all-reduce runs in C++), which
    one, the code that issued it (the innermost frame outside torch.distributed and
    deepspeed.comm) and the phase of the step (forward, backward, optimizer step). The ranks
    waiting are grouped by collective, call site and phase; a rank in another group than the
    largest (a desync: it issued a collective the others never issue), or in no collective at
    all (stuck outside communication), is the cause. When every rank waits at the same call
    site, the hang is in that collective itself. The window runs from the job's last logged
    step to the dumps' time, else to its last log line.

    Why it slows the run: a collective completes only when every rank of its group joins it.
    A rank that issued one the others never issue, or that never arrives, holds every rank in
    its wait until the watchdog kills the job (10-30 min by default), and the work since the
    last checkpoint is lost.

    How to fix: a desync: make every rank issue the same collectives in the same order: no
    collective under a rank-dependent `if`, no extra forward pass on one rank under ZeRO-3
    (each forward all-gathers the parameters), no data-dependent early exit;
    TORCH_DISTRIBUTED_DEBUG=DETAIL reports mismatched collectives at the call. A rank in no
    collective: follow where it is (its data loader, a checkpoint write, a loop of its own).
    Every rank at the same call site: the peer they wait for is outside the dumps or the
    network lost it: dump every rank, check the links, and turn on the Flight Recorder
    (TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) to see each rank's sequence ids.
    """
    hang = ctx.stack_hang
    if hang is None or ctx.stuck_collectives or ctx.desyncs or ctx.first_stopped is not None:
        return  # no hang in the dumps, or the Flight Recorder rules (TL420-TL422) already name it
    culprits = hang.culprits
    blamed = [r for r in hang.ranks if r.rank in culprits]
    title, why, fix = _stack_verdict(hang, blamed)
    if hang.undumped:
        why += f"; {ranks_text(list(hang.undumped))} of the job left no stack dump"
    # the odd ranks first, then the others
    groups = sorted(hang.groups, key=lambda g: g[0].rank not in culprits)
    parts = [_outside_text(r) for r in hang.outside] + [_group_text(g) for g in groups]
    lives = ctx.last_steps
    window, stopped = _stop_window(ctx, hang, lives)
    hosts = sorted({r.host for r in blamed if r.host}) or sorted({r.host for r in hang.ranks if r.host})
    evidence = _stack_evidence(blamed[:4] + [g[0] for g in groups if g[0] not in blamed])
    shown = lives.filter(pl.col("rank").is_in(culprits)) if culprits else lives
    lost = (window[1] - window[0]).total_seconds() if window else 0.0
    yield Finding(
        severity=Severity.CRITICAL,
        title=title,
        summary=f"The stack dumps of {ranks_text([r.rank for r in hang.ranks])}: {'; '.join(parts)}. So {why}. "
        f"{stopped}.",
        fix=fix,
        evidence=evidence[:8] + row_evidence(shown.to_dicts(), 4),
        hosts=hosts,
        ranks=culprits,
        window=window,
        cost_seconds=lost or None,
        score=HANG_SCORE,
    )


def _stack_verdict(hang: hangs.StackHang, blamed: list[hangs.RankStack]) -> tuple[str, str, str]:
    """The title, the reason and the fix: a rank in no collective, a desync, or every rank in one."""
    if hang.outside:
        r = hang.outside[0]
        one = len(hang.outside) == 1
        where = f"{_kind(r)}: {hangs.frame_text(r.site)}"
        return (
            f"Hang: {_who(list(hang.outside))} {'is' if one else 'are'} in no collective ({where}) while the "
            "others wait in one",
            f"{ranks_text([r.rank for r in hang.outside])} {'is' if one else 'are'} stuck outside communication "
            f"and the others wait for {'it' if one else 'them'}",
            f"Follow {ranks_text([r.rank for r in hang.outside])} where {'it is' if one else 'they are'}: {where}. "
            "In a data loader: the storage it reads and its workers (`py-spy dump --subprocesses --pid <pid>`), "
            "and DataLoader(timeout=...) so a stuck read fails loudly; in a checkpoint write: the filesystem; in "
            "code of its own: the loop or wait it sits in.",
        )
    if hang.odd:
        r, usual = blamed[0], hang.groups[0][0]
        one = len(hang.odd) == 1
        return (
            (
                f"Hang: {_who(blamed)} waits in {r.collective} at {hangs.frame_text(r.site)}, a collective the "
                "other ranks never reach"
                if one
                else f"Hang: {_who(blamed)} wait in collectives the other ranks never reach"
            ),
            f"{ranks_text([r.rank for r in hang.odd])} {'waits' if one else 'wait'} in another collective, at "
            "another call site or in another phase than the rest: a desync (a collective issued there only, or "
            "one skipped there), which no rank can complete",
            f"Make every rank issue the same collectives in the same order: {hangs.frame_text(r.site)} issued "
            f"{r.collective} on {ranks_text([x.rank for x in hang.odd])} only, while the others are in "
            f"{usual.collective} at {hangs.frame_text(usual.site)}. Look for a collective under a rank-dependent "
            "`if`, an extra forward pass on one rank under ZeRO-3 (each forward all-gathers the parameters) or a "
            "data-dependent early exit; TORCH_DISTRIBUTED_DEBUG=DETAIL reports mismatched collectives at the call.",
        )
    first = hang.groups[0][0]
    if len(hang.groups) > 1:
        return (
            "Hang: the ranks wait at different call sites in groups of equal size (a desync)",
            "the ranks wait at different call sites in groups of equal size: a desync, but the dumps do not say "
            "which side issued the odd collective",
            "Make every rank issue the same collectives in the same order; TORCH_DISTRIBUTED_DEBUG=DETAIL reports "
            "mismatched collectives at the call.",
        )
    return (
        f"Hang: every dumped rank waits in {first.collective} at {hangs.frame_text(first.site)}",
        "every dumped rank waits in the same collective at the same call site, so no rank in the dumps is the odd "
        "one: the hang is in that collective (the network, or a peer outside the dumps)",
        "Dump every rank of the job (`py-spy dump --pid <pid>`), check the links between the hosts (`ip -s link`, "
        "`ethtool -S <iface>`, `perfquery -x`), and turn on the Flight Recorder (TORCH_FR_BUFFER_SIZE=2000, "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1) to see each rank's sequence ids.",
    )


def _who(ranks: Sequence[hangs.RankStack]) -> str:
    hosts = sorted({r.host for r in ranks if r.host})
    return ranks_text([r.rank for r in ranks]) + (f" ({some(hosts, 8)})" if hosts else "")


def _in_phase(r: hangs.RankStack) -> str:
    return f"in {r.phase}" if r.phase else "outside forward, backward and the optimizer step"


def _kind(r: hangs.RankStack) -> str:
    kind = hangs.where_kind(r.row["frames"])
    return "Python code" if kind == "a collective" else kind  # near a collective's code, but waiting in none


def _group_text(group: tuple[hangs.RankStack, ...]) -> str:
    r = group[0]
    verb = "waits" if len(group) == 1 else "wait"
    return f"{_who(group)} {verb} in {r.collective} issued by {hangs.frame_text(r.site)}, {_in_phase(r)}"


def _outside_text(r: hangs.RankStack) -> str:
    return f"{_who([r])} is in no collective: {_kind(r)} at {hangs.frame_text(r.site)}, {_in_phase(r)}"


def _stack_evidence(ranks: list[hangs.RankStack]) -> list[Evidence]:
    """Each rank's stack row, quoted as its frames, innermost first, down to two frames below where it was."""
    return row_evidence({**r.row, "text": _stack_text(r)} for r in ranks)


def _stack_text(r: hangs.RankStack) -> str:
    frames = [f for f in r.row["frames"] if not f["native"]]
    upto = next((i for i, f in enumerate(frames) if f == r.site), 0) + 3
    thread = f", {r.row['thread_name']}" if r.row.get("thread_name") else ""
    return f"rank {r.rank} ({r.row['tool']}{thread}): " + " <- ".join(hangs.frame_text(f) for f in frames[:upto])


def _stop_window(
    ctx: RunContext, hang: hangs.StackHang, lives: pl.DataFrame
) -> tuple[tuple[datetime, datetime] | None, str]:
    """From the job's last logged step to the dumps' time (else its last log line), and the
    sentence that says when each rank stopped."""
    if lives.height == 0:
        return None, "No step line says when it stopped"
    last = lives["last_ts"].max()
    steps = sorted(set(lives["last_step"].drop_nulls().to_list()))
    if len(steps) == 1:
        said = f"Every logged rank's last step is {steps[0]}, logged from {lives['last_ts'].min():%H:%M:%S.%f}"[:-3]
        said += f" to {last:%H:%M:%S.%f}"[:-3] + " UTC"
    else:
        said = "The ranks' last steps: " + listing(
            [f"rank {r['rank']} step {r['last_step']} at {r['last_ts']:%H:%M:%S}" for r in lives.iter_rows(named=True)]
        )
    if hang.dumped_at is not None:
        end, until = hang.dumped_at, f"the dumps at {clock(hang.dumped_at)}"
    else:
        end = (
            pl.concat([ctx.scan(n).select("ts") for n in LOG_TABLES]).select(pl.col("ts").max()).collect().item()
            or last
        )
        until = f"its last log line at {clock(end)}"
    end = max(end, last)
    if end == last:
        return (last, end), f"{said}: the job made no progress after {clock(last)}, where its logs end"
    return (last, end), f"{said}: the job made no progress after {clock(last)}, up to {until}"
