"""The hang section: per process group, a lane per rank of its last collectives from the Flight
Recorder dumps (completed, waiting, failed, never started), the column where they diverge, and
where each rank was by its stack dump (the collective it waits in, who issued it, the phase)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracelens.derived import RunContext, hangs

if TYPE_CHECKING:
    from tracelens.analyze import Analysis

ORDER = 15
TITLE = "Hang: where each rank waits"
TEMPLATE = "sections/hang.html.j2"

BEFORE = 5  # sequence ids shown before the one where the ranks diverge
AFTER = 1
MAX_RANKS = 64


def _cell(row: dict | None, stuck_seq: int | None) -> dict:
    if row is None:
        missing = stuck_seq is not None
        return {
            "status": "never" if missing else "none",
            "text": "—",
            "title": "no entry: the rank never enqueued it" if missing else "no entry",
        }
    status = row["status"] or "scheduled"
    css = {"completed": "completed", "failed": "failed"}.get(status, "waiting")
    site = hangs.frame_text(hangs.call_site(row["frames"]))
    return {
        "status": css,
        "text": f"{row['op'] or '?'} {status}",
        "title": f"{row['profiling_name']} sizes {row['input_sizes']} at {site}",
    }


def _lane_rows(
    group: pl.DataFrame, ranks: list[int], seqs: list[int], stuck: hangs.Stuck | None, no_dump: set[int]
) -> list[dict]:
    by_key = {(r["rank"], r["collective_seq_id"]): r for r in group.iter_rows(named=True)}
    doing = {m.rank: m.doing for m in stuck.members} if stuck else {}
    rows = []
    for rank in ranks[:MAX_RANKS]:
        if rank in no_dump:
            cells = [
                {"status": "nodump", "text": "no dump", "title": "this rank left no Flight Recorder dump"} for _ in seqs
            ]
        else:
            cells = []
            for seq in seqs:
                row = by_key.get((rank, seq))
                cells.append(
                    _cell(row, stuck.seq if stuck and seq == stuck.seq else None)
                    if row or (stuck and seq <= stuck.seq)
                    else {"status": "none", "text": "", "title": ""}
                )
        rows.append({"rank": rank, "doing": doing.get(rank, ""), "cells": cells})
    return rows


def _lanes(ctx: RunContext, fr: pl.DataFrame) -> list[dict]:
    colls = fr.filter(
        ~pl.col("is_p2p").fill_null(False), pl.col("collective_seq_id").is_not_null(), pl.col("rank").is_not_null()
    )
    stuck = {
        s.pg: s for s in ctx.stuck_collectives if s.op not in ("send", "recv")
    }  # p2p hangs are TL420's text, not lanes
    groups = set(colls["pg"].drop_nulls().to_list())
    order = [pg for pg in stuck if pg in groups] + sorted(groups - set(stuck))
    lanes = []
    for pg in order:
        group = colls.filter(pl.col("pg").eq_missing(pg))  # a dump may name no process group
        if group.height == 0:
            continue  # no collective of this group survived in the dumps: nothing to draw
        s = stuck.get(pg)
        top = group["collective_seq_id"].max()
        pivot = s.seq if s else top
        seqs = list(range(max(group["collective_seq_id"].min(), pivot - BEFORE), min(top, pivot + AFTER) + 1))
        ranks = sorted({m.rank for m in s.members} if s else set(group["rank"].to_list()))
        no_dump = set(s.ranks("no dump")) if s else set()
        desc = group["pg_desc"].drop_nulls()
        lanes.append(
            {
                "pg": pg,
                "desc": desc[0] if desc.len() else "",
                "seqs": seqs,
                "diverge": s.seq if s else None,
                "rows": _lane_rows(group, ranks, seqs, s, no_dump),
                "stuck": s is not None,
            }
        )
    return lanes


def _where(ctx: RunContext) -> list[dict]:
    """Per rank, where its stack dump shows it: the collective it waits in, the code that issued it
    and the phase of the step; else (a traceback, a thread not the main one) its innermost frame of
    user code and what that is."""
    dumped = {r.rank: r for r in hangs.rank_stacks(ctx.tables)}
    stacks = hangs.stacks(ctx.tables).filter(pl.col("rank").is_not_null())
    rows = []
    for rank in sorted(set(stacks["rank"].to_list())):
        if rank in dumped:
            r = dumped[rank]
            top = r.row
            where = f"waits in {r.collective}" if r.collective else hangs.where_kind(top["frames"])
            frame, phase = r.site, r.phase or ""
        else:
            mine = stacks.filter(pl.col("rank") == rank).sort(
                pl.col("exception").is_not_null(), pl.col("frames").list.len(), descending=True
            )
            top = mine.row(0, named=True)
            where = hangs.where_kind(top["frames"], top["exception"])
            frame, phase = hangs.call_site(top["frames"]), ""
        rows.append(
            {
                "rank": rank,
                "tool": top["tool"],
                "where": where,
                "frame": hangs.frame_text(frame),
                "phase": phase,
                "file": top["file"],
                "line": top["line"],
            }
        )
    return rows


def context(ctx: RunContext, analysis: Analysis) -> dict | None:
    """The lanes of every process group in the Flight Recorder dumps and where each rank's stack dump
    shows it; None when the run has neither Flight Recorder entries nor stack dumps of a hang."""
    fr = ctx.fr_entries
    if fr.height == 0 and ctx.stack_hang is None:
        return None
    stop = ctx.first_stopped
    return {
        "lanes": _lanes(ctx, fr) if fr.height else [],
        "where": _where(ctx),
        "stop": None
        if stop is None
        else {"rank": stop.rank, "why": stop.why, "where": stop.where, "frame": hangs.frame_text(stop.frame)},
        "dumps": fr.select("file").unique().height,
        "encodings": sorted(set(fr["encoding"].drop_nulls().to_list())),
    }
