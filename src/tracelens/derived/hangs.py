"""Where a hung job stopped, from Flight Recorder entries and stack dumps: what the hang rules
(TL420-TL423), TL411 and the report's hang section share.

- `entries`: fr_entries with one row per (rank, group, record): a rank's pickle and JSON dumps
  of the same buffer are one record (the pickle's, which has the frames).
- `stuck`: per process group, the first collective sequence id not completed on all of its
  ranks, and what each member was doing there: completed, waiting (its entry is started or
  scheduled), failed, never started (its last entry in the group is older), or no dump.
  A group whose every dumped rank completed everything it enqueued is not stuck. A group with
  no stuck collective but a send or recv that never completed (pipeline stages) is stuck there,
  with its peer: waiting in the matching op, never started it, or no dump.
- `desyncs`: ranks that issued another op, size or dtype than the others at the same sequence
  id of a group.
- `first_stopped`: the rank that stopped first and where: a rank the stuck collective's
  other ranks wait for (it never started it, or left no dump), else the rank whose last
  Flight Recorder activity is the oldest; where it was from its stack dump, its traceback,
  or its own pending entry.

Group members: pg_config's ranks when the dump has them (torch 2.13 gloo writes none), else
the ranks whose dumps name the group, plus the ranks of the job without a dump.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from tracelens.derived.stream_groups import StreamGroups
from tracelens.prose import ranks_text
from tracelens.tables import RunTables

_ENCODING_RANK = {"pickle": 0, "json": 1, "dict text": 2, "analyzer text": 3, "analyzer listing": 4}
# Frames of the runtime, not of the user's code: skipped when naming a call site.
_LIBRARY = re.compile(
    r"(?:^|/)(?:torch|deepspeed|threading|runpy|multiprocessing|concurrent|asyncio|selectors|subprocess|queue|site-packages|dist-packages)/"
    r"|^<frozen|\.so(?:\.\d+)*$|^\?\?$|^$"
)
WHERE = {  # (kind, pattern over "function file") in order of precedence; the first that matches names it
    "a checkpoint write": r"checkpoint|ckpt|torch/serialization|save_state|(?:^|\W)save(?:_\w+)?\s",
    "the data loader": r"dataloader|data_loader|_next_data|__next__ |next_batch|[Ll]oader\.|fetch|_get_batch|collate",
    "a collective": (
        r"distributed_c10d|c10d::|ProcessGroup|gloo::|nccl|all_reduce"
        r"|allreduce|broadcast|barrier|all_gather|reduce_scatter"
    ),
}
_SKIP_OPS = re.compile(r"all_to_all|_v$|coalesced|^scatter$|^gather$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)
_P2P = re.compile(r"(?P<op>send|recv)\s+\d+\s*(?:->|<-)\s*(?P<peer>\d+)")


@dataclass(frozen=True)
class Member:
    """One rank of a stuck collective: what it was doing at the group's stuck sequence id."""

    rank: int
    doing: str  # completed, waiting, failed (its collective raised), never started, no dump
    entry: dict | None = None  # its entry at the stuck sequence id (waiting), or its last one in the group


@dataclass(frozen=True)
class Stuck:
    """A process group's first collective not completed on all its ranks."""

    pg: str  # pg_name (the group's id in the dumps)
    pg_desc: str | None
    seq: int
    op: str | None
    sizes: str | None
    members: tuple[Member, ...]
    since: datetime | None  # when the first waiting rank enqueued it

    def ranks(self, doing: str) -> list[int]:
        return [m.rank for m in self.members if m.doing == doing]

    @property
    def label(self) -> str:
        desc = f" ({self.pg_desc})" if self.pg_desc and self.pg_desc not in ("undefined", self.pg) else ""
        return f"process group {self.pg}{desc}"

    @property
    def culprits(self) -> list[int]:
        """The ranks the others wait for: never started it, or left no dump."""
        return self.ranks("never started") + self.ranks("no dump")


@dataclass(frozen=True)
class Desync:
    """Ranks that issued something else than the others at one sequence id of a group."""

    pg: str
    pg_desc: str | None
    seq: int
    what: str  # op, input sizes, dtypes
    usual: dict  # the majority's entry
    odd: tuple[dict, ...]  # the odd ranks' entries


@dataclass(frozen=True)
class Stop:
    """The rank that stopped first, and where."""

    rank: int
    why: str  # how we know it stopped first
    where: str  # a data loader, a checkpoint write, a Python exception, a collective, ...
    frame: dict | None  # the call site that says where (name, filename, line)
    evidence: tuple[dict, ...] = field(default_factory=tuple)  # rows (file, line, text) that show it
    at: datetime | None = None  # its last sign of progress


def entries(tables: RunTables) -> pl.DataFrame:
    """fr_entries with one row per (rank, group, record, sequence ids): the pickle's row before the JSON's."""
    pg = pl.coalesce(pl.col("pg_name"), pl.col("pg_id").cast(pl.String))
    fr = tables["fr_entries"]
    if fr.height == 0:
        return fr.with_columns(pg=pg)
    key = ["rank", "pg", "record_id", "collective_seq_id", "p2p_seq_id", "is_p2p"]
    order = pl.col("encoding").replace_strict(_ENCODING_RANK, default=9, return_dtype=pl.Int8)
    dumps = fr.filter(~pl.col("encoding").str.starts_with("analyzer"))["rank"].drop_nulls().unique()
    # the analyzer's text restates dumps: read it only for ranks whose dumps are not here
    fr = fr.filter(~pl.col("encoding").str.starts_with("analyzer") | ~pl.col("rank").is_in(dumps.implode()))
    unique = (
        fr.with_columns(pg=pg, _order=order, _frames=pl.col("frames").list.len().fill_null(0))
        .sort(["_order", "_frames"], descending=[False, True])
        .unique(subset=key, keep="first", maintain_order=True)
        .drop("_order", "_frames")
        .sort("rank", "pg", "record_id", nulls_last=True)
    )
    return _mark_failed(unique.filter(pl.col("status").ne_missing("no dump")), failed_ranks(tables))


def analyzer_missing(tables: RunTables) -> list[int]:
    """Ranks PyTorch's analyzer says left no dump, when the run has no dump of them either."""
    fr = tables["fr_entries"]
    said = fr.filter(pl.col("status") == "no dump")["rank"].drop_nulls()
    dumped = set(
        fr.filter(pl.col("status").ne_missing("no dump"), ~pl.col("encoding").str.starts_with("analyzer"))["rank"]
        .drop_nulls()
        .to_list()
    )
    return sorted(set(said.to_list()) - dumped)


def stacks(tables: RunTables) -> pl.DataFrame:
    """The stacks table with the rank of a py-spy dump that names none taken from its pid: NCCL's
    communicator lines give each process's pid and rank (the job's widest communicator), on the
    same host when both name one."""
    table = tables["stacks"]
    if table.height == 0 or table["rank"].null_count() == 0:
        return table
    comms = (
        tables.scan("nccl_comms")
        .filter(pl.col("pid").is_not_null(), pl.col("rank").is_not_null())
        .select("pid", "host", "rank", "nranks")
        .collect()
    )
    if comms.height == 0:
        return table
    world = (
        comms.filter(pl.col("nranks") == comms["nranks"].max())
        .select("pid", pl.col("host").alias("_host"), pl.col("rank").alias("_rank"))
        .unique(["pid", "_host"])
    )
    joined = table.with_row_index("_row").join(world, on="pid", how="left")
    same_host = pl.col("_host").is_null() | pl.col("host").is_null() | (pl.col("_host") == pl.col("host"))
    picked = joined.filter(same_host).unique("_row", keep="first")
    return (
        table.with_row_index("_row")
        .join(picked.select("_row", "_rank"), on="_row", how="left")
        .with_columns(rank=pl.coalesce("rank", "_rank"))
        .drop("_row", "_rank")
    )


def failed_ranks(tables: RunTables) -> list[int]:
    """Ranks whose log has a Python traceback through a collective: the collective raised."""
    tracebacks = stacks(tables).filter(
        pl.col("tool") == "traceback", pl.col("exception").is_not_null(), pl.col("rank").is_not_null()
    )
    through = tracebacks.filter(
        pl.col("frames").list.eval(pl.element().struct.field("filename").str.contains(WHERE["a collective"])).list.any()
    )
    return sorted(set(through["rank"].to_list()))


def _mark_failed(fr: pl.DataFrame, ranks: list[int]) -> pl.DataFrame:
    """A failed collective is `completed` in gloo's pg_status; a rank whose collective raised has
    its newest entry marked `failed` instead."""
    if not ranks or fr.height == 0:
        return fr
    newest = pl.col("ts") == pl.col("ts").max().over("rank")
    return fr.with_columns(
        status=pl.when(pl.col("rank").is_in(ranks) & newest & ~pl.col("is_p2p").fill_null(False))
        .then(pl.lit("failed"))
        .otherwise("status")
    )


def job_ranks(tables: RunTables, fr: pl.DataFrame) -> set[int]:
    """Every rank some source names: dumps, stack dumps, per-rank file names (`rank3/train.log`),
    NCCL communicators of the job's size. A killed rank leaves no dump, but its log names it."""
    ranks = set(fr["rank"].drop_nulls().to_list()) | set(stacks(tables)["rank"].drop_nulls().to_list())
    for name in tables["inputs"]["file"].to_list() if "file" in tables["inputs"].columns else []:
        found = _RANK_IN_NAME.findall(name)
        if found:
            ranks.add(int(found[-1]))
    world = tables.scan("nccl_comms").select(pl.col("nranks").max()).collect().item()
    if world:
        ranks |= set(range(int(world)))
    return ranks


def _members(tables: RunTables, fr: pl.DataFrame) -> dict[str, set[int]]:
    """Members per group: pg_config's ranks, else the ranks whose dumps name it; a world group
    (default_pg) without pg_config has every rank of the job."""
    groups = tables["fr_groups"].with_columns(pg=pl.coalesce(pl.col("pg_name"), pl.col("pg_id").cast(pl.String)))
    dump_files = fr.filter(~pl.col("encoding").str.starts_with("analyzer"))["file"].unique()
    if dump_files.len():  # the analyzer's text restates the dumps' groups, maybe for a subset of ranks
        groups = groups.filter(pl.col("file").is_in(dump_files.implode()))
    configured: dict[str, set[int]] = {}
    for row in groups.filter(pl.col("ranks").is_not_null()).iter_rows(named=True):
        configured.setdefault(row["pg"], set()).update(row["ranks"])
    members = {pg: set(ranks) for pg, ranks in configured.items()}
    for row in fr.filter(pl.col("rank").is_not_null()).select("pg", "rank").unique().iter_rows(named=True):
        members.setdefault(row["pg"], set()).add(row["rank"])
    job = job_ranks(tables, fr) | set().union(*members.values()) if members else job_ranks(tables, fr)
    for pg in members:
        if pg not in configured and _is_world(fr, pg):
            members[pg] |= job
    return members


def _is_world(fr: pl.DataFrame, pg: str) -> bool:
    desc = fr.filter(pl.col("pg").eq_missing(pg))["pg_desc"].drop_nulls()
    return pg == "0" or (desc.len() > 0 and desc[0] == "default_pg")


def stuck(tables: RunTables) -> list[Stuck]:
    """Every stuck group's first unfinished collective, the one most ranks wait in first."""
    fr = entries(tables)
    if fr.height == 0:
        return []
    colls = fr.filter(
        ~pl.col("is_p2p").fill_null(False), pl.col("collective_seq_id").is_not_null(), pl.col("rank").is_not_null()
    )
    members = _members(tables, fr)
    dumped = set(fr["rank"].drop_nulls().to_list())
    found = []
    for (pg,), group in colls.group_by("pg"):
        per_rank = group.group_by("rank").agg(
            first=pl.col("collective_seq_id").min(),
            done=pl.col("collective_seq_id").filter(pl.col("status") == "completed").max(),
        )
        # the first sequence id some rank of the group has not completed (its first entry, if none completed)
        first_open = per_rank.select(pl.coalesce(pl.col("done") + 1, pl.col("first")).min()).item()
        pending = group.filter(pl.col("collective_seq_id") == first_open)
        if pending.height == 0 or pending["status"].eq("completed").all():
            continue  # every rank finished all it enqueued in this group
        found.append(_stuck(pg, first_open, group, pending, members.get(pg, set()), dumped))
    found += _p2p_stuck(fr, members, dumped, {s.pg for s in found})
    # pg may be None
    return sorted(
        found, key=lambda s: (-len(s.ranks("waiting")), s.since.timestamp() if s.since else float("inf"), str(s.pg))
    )


def _p2p_stuck(fr: pl.DataFrame, members: dict[str, set[int]], dumped: set[int], done: set[str]) -> list[Stuck]:
    """Per group without a stuck collective, its oldest send or recv that did not complete, and
    whether the peer posted the matching recv or send (`nccl:send 0->1`, `nccl:recv 1<-0`: the
    numbers are ranks within the group)."""
    pending = fr.filter(
        pl.col("is_p2p").fill_null(False),
        pl.col("rank").is_not_null(),
        ~pl.col("status").is_in(["completed", "failed"]),
        ~pl.col("pg").is_in(list(done)),
    )
    found = []
    for (pg,), group in pending.group_by("pg", maintain_order=True):
        first = group.sort("ts", "record_id", nulls_last=True).row(0, named=True)
        m = _P2P.search(first["profiling_name"] or "")
        if not m:
            continue
        ordered = sorted(members.get(pg, set()))
        local = int(m.group("peer"))
        peer = ordered[local] if local < len(ordered) else local
        other = "recv" if m.group("op") == "send" else "send"
        match = group.filter(pl.col("rank") == peer, pl.col("op") == other)
        if match.height:
            member = Member(peer, "waiting", match.row(0, named=True))
        else:
            member = Member(peer, "never started" if peer in dumped else "no dump")
        site = Member(first["rank"], "waiting", first)
        found.append(
            Stuck(
                pg,
                first.get("pg_desc"),
                first["p2p_seq_id"] or 0,
                first["op"],
                first.get("input_sizes"),
                tuple(sorted((site, member), key=lambda x: x.rank)),
                first["ts"],
            )
        )
    return found


def _stuck(pg: str, seq: int, group: pl.DataFrame, pending: pl.DataFrame, ranks: set[int], dumped: set[int]) -> Stuck:
    by_rank = {r["rank"]: r for r in pending.iter_rows(named=True)}
    members = []
    for rank in sorted(ranks):
        if rank not in dumped:
            members.append(Member(rank, "no dump"))
        elif rank in by_rank:
            row = by_rank[rank]
            doing = {"completed": "completed", "failed": "failed"}.get(row["status"], "waiting")
            members.append(Member(rank, doing, row))
        else:
            mine = group.filter(pl.col("rank") == rank).sort("collective_seq_id")
            members.append(Member(rank, "never started", mine.row(-1, named=True) if mine.height else None))
    waiting = [m.entry for m in members if m.doing == "waiting" and m.entry]
    sample = (waiting or list(by_rank.values()))[0]
    since = min((e["ts"] for e in waiting if e["ts"] is not None), default=None)
    return Stuck(pg, sample.get("pg_desc"), seq, sample.get("op"), sample.get("input_sizes"), tuple(members), since)


def desyncs(tables: RunTables) -> list[Desync]:
    """Per group, the first sequence id where ranks issued different collectives (op, sizes, dtypes)."""
    fr = entries(tables).filter(
        ~pl.col("is_p2p").fill_null(False), pl.col("collective_seq_id").is_not_null(), pl.col("rank").is_not_null()
    )
    # only the sequence ids where something differs are looked at one by one (a job has thousands)
    differ = (
        fr.group_by("pg", "collective_seq_id", maintain_order=True)
        .agg(
            ranks=pl.col("rank").n_unique(),
            ops=pl.col("op").drop_nulls().n_unique(),
            sizes=pl.col("input_sizes").drop_nulls().n_unique(),
            dtypes=pl.col("input_dtypes").drop_nulls().n_unique(),
        )
        .filter(pl.col("ranks") >= 2, (pl.col("ops") > 1) | (pl.col("sizes") > 1) | (pl.col("dtypes") > 1))
        .sort("collective_seq_id", maintain_order=True)
    )
    found: dict[str, Desync] = {}
    for pg, seq in differ.select("pg", "collective_seq_id").iter_rows():
        if pg in found:
            continue  # the first per group
        at = fr.filter(pl.col("pg") == pg, pl.col("collective_seq_id") == seq)
        for what, column in (("op", "op"), ("input sizes", "input_sizes"), ("dtypes", "input_dtypes")):
            values = at[column].drop_nulls()
            if values.n_unique() < 2 or (column != "op" and at["op"].n_unique() > 1):
                continue
            if column != "op" and _SKIP_OPS.search(at["op"][0] or ""):
                continue
            usual = values.value_counts(sort=True)[column][0]
            rows = at.sort("rank").to_dicts()
            odd = tuple(r for r in rows if r[column] is not None and r[column] != usual)
            norm = next(r for r in rows if r[column] == usual)
            found[pg] = Desync(pg, norm.get("pg_desc"), seq, what, norm, odd)
            break
    return sorted(found.values(), key=lambda d: (d.seq, d.pg))


def call_site(frames: list[dict] | None) -> dict | None:
    """The innermost frame of the user's own code (not torch, not the interpreter), else the innermost."""
    frames = [f for f in frames or [] if f]
    for f in frames:
        if not _LIBRARY.search(f.get("filename") or ""):
            return f
    return frames[0] if frames else None


def frame_text(frame: dict | None) -> str:
    if not frame:
        return "no frame recorded"
    where = f"{frame.get('filename')}:{frame['line']}" if frame.get("line") is not None else frame.get("filename")
    return f"{frame.get('name')} ({where})"


def where_kind(frames: list[dict] | None, exception: str | None = None) -> str:
    """What a rank was doing, from its frames (innermost first): a checkpoint write, the data
    loader, a collective, a Python exception, or plain Python code."""
    if exception:
        return f"an exception ({exception[:300]})"
    text = " ".join(f"{f.get('name')} {f.get('filename')} " for f in frames or [])
    for kind, pattern in WHERE.items():
        if re.search(pattern, text):
            return kind
    return "Python code" if frames else "an unknown place"


def _stack_of(tables: RunTables, rank: int) -> dict | None:
    """The rank's main-thread stack (py-spy, faulthandler), else its traceback; the richest one."""
    rows = stacks(tables).filter(pl.col("rank") == rank)
    if rows.height == 0:
        return None
    ranked = rows.with_columns(
        main=pl.col("thread_name").fill_null("").str.contains("MainThread") | pl.col("thread_id").is_null(),
        py=pl.col("frames").list.eval(~pl.element().struct.field("native").fill_null(False)).list.sum(),
        exc=pl.col("exception").is_not_null(),
    )
    return ranked.sort(["exc", "main", "py"], descending=True).row(0, named=True)


def _last_activity(fr: pl.DataFrame) -> pl.DataFrame:
    """Per rank: the time of its newest Flight Recorder entry."""
    return (
        fr.filter(pl.col("ts").is_not_null(), pl.col("rank").is_not_null())
        .group_by("rank")
        .agg(last=pl.col("ts").max())
        .sort("last")
    )


def first_stopped(tables: RunTables) -> Stop | None:
    """The rank that stopped first and where it was (None without Flight Recorder entries)."""
    fr = entries(tables)
    missing = analyzer_missing(tables)
    if fr.height == 0 and missing:
        unmatched = "PyTorch's analyzer could not match the other ranks' collectives"
        why = f"{unmatched} because {ranks_text(missing)} left no dump"
        return _locate(tables, fr, [], missing[0], why, None)
    if fr.height == 0:
        return None
    hung = stuck(tables)
    lives = _last_activity(fr)
    last = dict(lives.iter_rows())
    if hung and hung[0].culprits:
        root = hung[0]
        culprits = root.culprits
        rank = min(culprits, key=lambda r: (last[r].timestamp() if r in last else float("-inf"), r))
        doing = next(m for m in root.members if m.rank == rank).doing
        others = ranks_text(sorted(root.ranks("waiting") + root.ranks("failed")))
        why = (
            f"rank {rank} never started collective #{root.seq} of {root.label} that {others} waited in"
            if doing == "never started"
            else f"rank {rank} left no Flight Recorder dump while {others} waited for it "
            f"in collective #{root.seq} of {root.label}"
        )
    elif hung and lives.height >= 2 and lives["last"][0] < lives["last"][1]:
        rank, why = lives["rank"][0], f"rank {lives['rank'][0]}'s last Flight Recorder entry is the oldest"
    else:
        return None
    return _locate(tables, fr, hung, rank, why, last.get(rank))


def _locate(tables: RunTables, fr: pl.DataFrame, hung: list[Stuck], rank: int, why: str, at: datetime | None) -> Stop:
    """Where `rank` was: its stack dump or traceback first, else its own pending entry."""
    stack = _stack_of(tables, rank)
    if stack is not None:
        frame = call_site(stack["frames"])
        where = where_kind(stack["frames"], stack["exception"])
        pending = [m.entry for s in hung for m in s.members if m.rank == rank and m.doing == "waiting" and m.entry]
        if where == "a collective" and pending:
            where = (
                f"a collective: {pending[0]['profiling_name']} "
                f"#{pending[0]['collective_seq_id']} of process group {pending[0]['pg']}"
            )
        text = (
            f"{stack['tool']} of rank {rank}"
            + (f" ({stack['thread_name']})" if stack["thread_name"] else "")
            + f": {frame_text(frame)}"
        )
        return Stop(rank, why, where, frame, ({"file": stack["file"], "line": stack["line"], "text": text},), at)
    mine = [m.entry for s in hung for m in s.members if m.rank == rank and m.doing == "waiting" and m.entry]
    if mine:
        entry = mine[0]
        frame = call_site(entry["frames"])
        text = (
            f"rank {rank} waits in {entry['profiling_name']} #{entry['collective_seq_id']} of process group "
            f"{entry['pg']} at {frame_text(frame)}"
        )
        return Stop(
            rank, why, "a collective", frame, ({"file": entry["file"], "line": entry["line"], "text": text},), at
        )
    return Stop(
        rank,
        why,
        "an unknown place: no dump, stack or traceback of it (killed, e.g. by the OOM killer, or crashed)",
        None,
        (),
        at,
    )


# -- a hang from stack dumps alone ----------------------------------------------------------------

# What a rank waits in, by the name of the function: torch.distributed's collectives (gloo or
# NCCL) and DeepSpeed's deepspeed.comm wrappers, some of which it names otherwise.
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "_all_gather_base",
        "all_gather_coalesced",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "send",
        "recv",
        "send_object_list",
        "recv_object_list",
        "reduce",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_all_single",
        "wait_tensor",
    }
)
_DS_NAMES = {"allgather_fn": "all_gather_into_tensor", "reduce_scatter_fn": "reduce_scatter_tensor"}
_COMM_FILE = re.compile(r"(?:^|/)(?:torch/distributed|deepspeed/comm)/")
# Between a collective and the code that issued it: the collective libraries and the decorators
# and timers DeepSpeed and torch wrap calls in.
_PLUMBING = re.compile(
    r"(?:^|/)(?:torch/distributed/|deepspeed/comm/|deepspeed/utils/nvtx\.py$|torch/utils/_contextlib\.py$"
    r"|functools\.py$|contextlib\.py$)"
)
# ZeRO-3 waits for the parameters' all-gather in the handle the async all-gather returned (every
# `wait` of these modules is an all-gather handle's; py-spy names it `AllGatherHandle.wait` from
# Python 3.11, plain `wait` before).
_ZERO3_WAIT = re.compile(r"(?:^|/)deepspeed/runtime/zero/(?:partition_parameters|mics)\.py$")
# A native frame (py-spy --native) of a collective's work: the op where its name says it.
_NATIVE_COMM = re.compile(r"(?:c10d|gloo)::")
_NATIVE_OPS = (
    ("all_reduce", re.compile(r"allreduce", re.I)),
    ("all_gather", re.compile(r"allgather", re.I)),
    ("reduce_scatter", re.compile(r"reducescatter", re.I)),
    ("all_to_all", re.compile(r"alltoall", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("recv", re.compile(r"recv", re.I)),
    ("send", re.compile(r"send", re.I)),
)
# The phase of a step a frame belongs to, by its function's name (the last part of a qualified
# name); the innermost frame that names one says where the rank was.
PHASES = (
    (
        "backward",
        re.compile(
            r"^(?:backward|_engine_run_backward|run_backward|grad_handling_hook|reduce_ready_partitions_and_remove_grads"
            r"|reduce_partition_and_remove_grads|pre_sub_module_backward_function|post_sub_module_backward_function"
            r"|_run_before_backward_function|_post_backward_module_hook|_pre_backward_module_hook)$"
        ),
    ),
    (
        "forward",
        re.compile(
            r"^(?:forward|_call_impl|_wrapped_call_impl|pre_sub_module_forward_function|post_sub_module_forward_function"
            r"|_pre_forward_module_hook|_post_forward_module_hook)$"
        ),
    ),
    ("optimizer step", re.compile(r"^(?:step|_take_model_step|_optimizer_step)$")),
)
# Under DDP the gradients' all-reduce runs in C++ inside the autograd engine: a main thread idle
# (py-spy: off the CPU) whose innermost Python frame is the engine's waits there, not computing.
DDP_GRADIENTS = "the gradients' all_reduce (DDP, in backward's C++)"
_AUTOGRAD = re.compile(r"(?:^|/)torch/autograd/")
DUMP_TOOLS = ("py-spy", "ray stack", "faulthandler")  # dumps of a live process (not a dying one's traceback)


@dataclass(frozen=True)
class RankStack:
    """Where one rank's main thread was when its stack was dumped."""

    rank: int
    host: str | None
    collective: str | None  # the collective it waits in; None: in no collective
    site: dict | None  # waiting: the innermost frame outside the collective's plumbing; else call_site
    phase: str | None  # backward, forward or optimizer step; None: no frame names one
    row: dict  # its stacks row (file, line, tool, thread_name, frames)

    @property
    def key(self) -> tuple:
        site = self.site or {}  # ZeRO-3 waits for its all-gathers at one place in forward and in backward
        return (self.collective, site.get("name"), site.get("filename"), site.get("line"), self.phase)


@dataclass(frozen=True)
class StackHang:
    """A job whose ranks' stack dumps show them waiting in collectives."""

    ranks: tuple[RankStack, ...]  # every dumped rank, by rank
    groups: tuple[tuple[RankStack, ...], ...]  # the waiting ranks by (collective, call site, phase), largest first
    outside: tuple[RankStack, ...]  # ranks in no collective
    odd: tuple[RankStack, ...]  # waiting ranks outside the one largest group (none when the largest tie)
    undumped: tuple[int, ...]  # ranks of the job without a stack dump
    dumped_at: datetime | None  # the dumps' time, when they carry one

    @property
    def culprits(self) -> list[int]:
        return sorted(r.rank for r in self.outside + self.odd)


def collective(frames: list[dict] | None) -> str | None:
    """The collective a stack waits in (its innermost collective frame), or None."""
    native = None
    for f in frames or []:
        name = (f.get("name") or "").rsplit(".", 1)[-1]
        filename = f.get("filename") or ""
        if _COMM_FILE.search(filename) and name in COLLECTIVES | _DS_NAMES.keys():
            return _DS_NAMES.get(name, name)
        if name == "wait" and _ZERO3_WAIT.search(filename):
            return "all_gather"
        if native is None and f.get("native") and _NATIVE_COMM.search(f.get("name") or ""):
            native = next((op for op, pattern in _NATIVE_OPS if pattern.search(f["name"])), "collective")
    return native  # only native frames say it (py-spy --native under DDP's C++ reducer)


def collective_site(frames: list[dict] | None) -> dict | None:
    """The innermost Python frame outside torch.distributed, deepspeed.comm and their wrappers:
    the code that issued the collective (DeepSpeed's ZeRO code counts)."""
    for f in frames or []:
        if not f.get("native") and not _PLUMBING.search(f.get("filename") or ""):
            return f
    return None


def phase(frames: list[dict] | None) -> str | None:
    """backward, forward or optimizer step: the innermost frame that names a phase of the step."""
    for f in frames or []:
        name = (f.get("name") or "").rsplit(".", 1)[-1]
        for label, pattern in PHASES:
            if pattern.match(name):
                return label
    return None


def _main_threads(rows: pl.DataFrame) -> pl.DataFrame:
    """The threads that run the rank's training loop: py-spy's MainThread, else (faulthandler, ray
    stack) a thread not started by `threading`."""
    outermost = pl.col("frames").list.last().struct.field("filename").fill_null("")
    named = pl.col("thread_name").fill_null("").str.contains("MainThread")
    unnamed = pl.col("thread_name").is_null() & ~outermost.str.contains(r"(?:^|/)threading\.py$")
    return rows.filter(named | unnamed)


def rank_stacks(tables: RunTables) -> list[RankStack]:
    """Per rank with a stack dump of its main thread: where it was (the one waiting in a collective
    when a rank has several dumps, then the one with the most Python frames)."""
    rows = _main_threads(stacks(tables).filter(pl.col("tool").is_in(DUMP_TOOLS), pl.col("rank").is_not_null()))
    found = []
    for (rank,), mine in rows.sort("file", "line").group_by("rank", maintain_order=True):
        candidates = []
        for row in mine.iter_rows(named=True):
            python = [f for f in row["frames"] or [] if not f["native"]]
            op = collective(row["frames"])
            if (
                op is None
                and row["thread_state"] == "idle"
                and python
                and _AUTOGRAD.search(python[0]["filename"] or "")
            ):
                op = DDP_GRADIENTS
            candidates.append((op is not None, len(python), op, row))
        waiting, _, op, row = max(candidates, key=lambda c: c[:2])
        frames = row["frames"]
        site = collective_site(frames) if waiting and op != DDP_GRADIENTS else call_site(frames)
        found.append(RankStack(int(rank), row["host"], op, site, phase(frames), row))
    return sorted(found, key=lambda r: r.rank)


def last_steps(series: StreamGroups) -> pl.DataFrame:
    """Per rank that logged steps: host, rank, its last step, the time of its last step
    (last_ts) and its line (file, line, text): where each rank's progress ends. Taken from the step
    series (step_times), whose steps after the last printed time are placed at the pace of their
    timers: a log that prints a time every ten steps would otherwise date a hang up to ten steps early."""
    rows = series.scan().filter(pl.col("ts").is_not_null(), pl.col("rank") >= 0)
    last = rows.select("host", "rank", "step", "ts", "file", "line", "message").sort("ts", "line")
    return (
        last.group_by("host", "rank")
        .agg(pl.all().last(), last_step=pl.col("step").max())
        .select("host", "rank", "last_step", last_ts="ts", file="file", line="line", text="message")
        .sort("last_ts", "rank", "host")
        .collect(engine="streaming")
    )


def stack_hang(tables: RunTables) -> StackHang | None:
    """What the ranks' stack dumps say about a hang: at least two ranks dumped, at least half of
    them waiting in a collective, and no step logged after the dumps (when they carry a time).
    The ranks waiting in a collective are grouped by (collective, call site, phase); the ranks in no
    collective, and those outside the one largest group, are the odd ones."""
    ranks = rank_stacks(tables)
    waiting = [r for r in ranks if r.collective]
    if len(ranks) < 2 or not waiting or 2 * len(waiting) < len(ranks):
        return None
    times = [r.row["ts"] for r in ranks if r.row.get("ts") is not None]
    dumped_at = max(times) if times else None
    if dumped_at is not None:
        later = tables.scan("steps").filter(pl.col("ts") > dumped_at).select(pl.len()).collect().item()
        if later:
            return None  # the job still made progress after the dumps: they caught it running
    by_key: dict[tuple, list[RankStack]] = {}
    for r in waiting:
        by_key.setdefault(r.key, []).append(r)
    groups = sorted(by_key.values(), key=lambda g: (-len(g), g[0].rank))
    sole = len(groups) == 1 or len(groups[0]) > len(groups[1])
    odd = [r for g in groups[1:] for r in g] if sole else []
    dumped = {r.rank for r in ranks}
    undumped = sorted(job_ranks(tables, entries(tables)) - dumped)
    return StackHang(
        tuple(ranks),
        tuple(tuple(g) for g in groups),
        tuple(r for r in ranks if not r.collective),
        tuple(sorted(odd, key=lambda r: r.rank)),
        tuple(undumped),
        dumped_at,
    )
