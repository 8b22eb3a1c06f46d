"""PyTorch Flight Recorder dumps: pickle, JSON, or the dump printed as a Python dict.

Each rank writes one dump (`TORCH_FR_DUMP_TEMP_FILE<rank>`, or what
`torch._C._distributed_c10d._dump_fr_trace` / `_dump_fr_trace_json` return): a dict with
`version`, `pg_config`, `pg_status`, `comm_lib_version` and `entries`, one per collective
or point-to-point op the rank enqueued (its last TORCH_FR_BUFFER_SIZE ones). Rows go to
`fr_entries` (one per entry) and `fr_groups` (one per rank and process group).

Versions. Since 2.0 an entry has `collective_seq_id` and `p2p_seq_id` (1.x: one `seq_id`);
`is_p2p`, `input_dtypes`/`output_dtypes`, `timeout_ms`, `thread_id`/`thread_name`,
`pg_status` came later in 2.x; `process_group` is a (name, desc) pair; `pg_config` maps a
group name to `{name, desc, ranks}` with `ranks` printed as a string ("[0, 1]") or, in
older dumps, the ranks alone. Missing keys become nulls. The JSON dump has no `frames` and
writes 0 for an unknown time.

Facts of torch 2.13 with gloo (lab/hang): `state` stays "scheduled" for every entry (gloo does
not report start and completion to the recorder) and `pg_config` holds one empty group, so an
entry's progress comes from `retired` and `pg_status` (last enqueued / started / completed
sequence id per group), and a group's members from the ranks whose dumps name it.

Rank: the dump does not say whose it is; like PyTorch's own analyzer, the rank is the number
that ends the file name (`..._rank3.pkl`, `nccl_trace_rank_3`), else a `rank3` folder.

Pickles are loaded with tracelens.ingest.hangs.safe_pickle, which never imports or calls anything:
a pickle that asks to is refused with a one-line error and the rest of the run is analysed.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from tracelens.ingest import IngestResult, InputFile, input_format
from tracelens.ingest.hangs import safe_pickle
from tracelens.small_read import read_small

_PICKLE_HEAD = re.compile(rb"^\x80[\x02-\x05]")
_JSON_HEAD = re.compile(rb'^\s*\{\s*"(?:version|entries|pg_config|pg_status|comm_lib_version|nccl_comm_state)"')
_DICT_HEAD = re.compile(rb"\{\s*'(?:version|entries|pg_config|pg_status|comm_lib_version)'\s*:")
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.\w+)*$")
_RANK_IN_PATH = re.compile(r"rank[_-]?(\d+)", re.I)
_MAX_TEXT = 64 << 20
# A pickle's memo lets a small file share one list a million times; the reader never walks more
# than this of one entry's fields, keeps at most this many entries and frames.
_MAX_ITEMS = 10_000
_COMPACT = json.JSONEncoder(separators=(",", ":"), default=str).encode  # one encoder, not one per value
MAX_ENTRIES = 1_000_000
MAX_FRAMES = 256

COMPLETED, STARTED, SCHEDULED = "completed", "started", "scheduled"
P2P_OPS = ("send", "recv")


def sniff(head: bytes) -> bool:
    """Any pickle (so that a hostile one is refused by name, not read as binary), or a dump as JSON or dict text."""
    return bool(_PICKLE_HEAD.match(head) or _JSON_HEAD.match(head) or _DICT_HEAD.search(head[:4096]))


# before the text formats: a JSON or dict-text dump is text too
@input_format("flight_recorder", priority=5, sniff=sniff, reads_lines=False)
def ingest(source: InputFile) -> IngestResult:
    result = IngestResult()
    try:
        dump, encoding = _decode(source.path)
    except (safe_pickle.UnsafePickle, ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        result.account.errors.append(f"{source.name}: {_first_line(exc)}")
        return result
    if not isinstance(dump, dict) or "entries" not in dump:
        result.account.errors.append(f"{source.name}: a {encoding} but not a Flight Recorder dump (no 'entries')")
        return result
    rank = rank_from_name(source.name)
    entries = dump.get("entries")
    listed = entries if isinstance(entries, (list, tuple)) else []
    rows, bad = entry_rows(listed[:MAX_ENTRIES], dump, rank, source.name, encoding)
    result.account.lines = len(listed)
    result.account.parsed = len(rows)
    result.account.unrecognized = result.account.lines - len(rows)
    result.account.add_samples(bad)
    if len(listed) > MAX_ENTRIES:
        result.account.errors.append(f"{source.name}: {len(listed):,} entries, only the first {MAX_ENTRIES:,} are read")
    if rank is None:
        result.account.errors.append(
            f"{source.name}: no rank in the file name (like "
            "fr_trace_rank_3); its entries are read but belong to no rank"
        )
    frame = entry_frame(rows)
    result.add("fr_entries", frame)
    result.add("fr_groups", group_frame(dump, frame, rank, source.name))
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    reason = text[0] if text else type(exc).__name__
    return reason if isinstance(exc, safe_pickle.UnsafePickle) else f"not a readable Flight Recorder dump: {reason}"


def _decode(path: Path) -> tuple[Any, str]:
    """The dump object and what it was written as (pickle, json, dict text). Its size is checked
    before it is read: a sparse file of gigabytes with a dump's head is never loaded."""
    with path.open("rb") as fh:
        pickled = _PICKLE_HEAD.match(fh.read(2))
    data = read_small(path, *((safe_pickle.MAX_BYTES, "pickle") if pickled else (_MAX_TEXT, "text dump")))
    if _PICKLE_HEAD.match(data):
        return safe_pickle.loads(data), "pickle"
    text = data.decode("utf-8", errors="replace")
    if _JSON_HEAD.match(data):
        try:
            return json.loads(text), "json"
        except json.JSONDecodeError:
            pass  # a cut or hand-edited JSON paste: read it like a printed dict
    return literal_dump(text), "dict text"


def literal_dump(text: str) -> Any:
    """A dump printed as a Python dict (`print(pickle.load(f))`, pprint, a paste), read with
    ast.literal_eval, never eval: `...` elisions are dropped, JSON's true/false/null accepted,
    and a paste cut short is closed at its last complete element."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no '{' opens a dump")
    body = _drop_ellipses(text[start:])
    for attempt in (body, _close_cut(body)):
        try:
            return ast.literal_eval(attempt)
        except (ValueError, SyntaxError):
            continue
    raise ValueError("the printed dump is not a Python literal even after repair")


_TOKENS = re.compile(r"""('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")|(\.\.\.|…)\s*,?|\b(true|false|null)\b""")
_JSON_WORDS = {"true": "True", "false": "False", "null": "None"}


def _drop_ellipses(text: str) -> str:
    """Remove `...` elisions (outside strings) and turn JSON words into Python ones."""

    def fix(m: re.Match) -> str:
        if m.group(1):
            return m.group(1)
        if m.group(2):
            return ""
        return _JSON_WORDS[m.group(3)]

    return _TOKENS.sub(fix, text)


def _close_cut(text: str) -> str:
    """A paste cut in the middle: keep up to the last element that ended at a comma and close
    the brackets still open."""
    stack: list[str] = []
    last_cut, stack_at_cut = 0, []
    pairs = {"{": "}", "[": "]", "(": ")"}
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            end = text.find(c, i + 1)
            while end > 0 and text[end - 1] == "\\":
                end = text.find(c, end + 1)
            if end < 0:
                break
            i = end + 1
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in "}])" and stack:
            stack.pop()
        elif c == "," and stack:
            last_cut, stack_at_cut = i, list(stack)
        i += 1
    if not stack:
        return text
    return text[:last_cut] + "".join(reversed(stack_at_cut))


def rank_from_name(name: str) -> int | None:
    """The rank a dump belongs to, from its file name (trailing number) or a rank folder."""
    base = name.rsplit("!", 1)[-1]
    leaf = base.rsplit("/", 1)[-1]
    found = _RANK_IN_NAME.search(leaf)
    if found:
        return int(found.group(1))
    in_path = _RANK_IN_PATH.findall(base)
    return int(in_path[-1]) if in_path else None


class BadValue(ValueError):
    """A value no column can hold: an infinite number, an integer past 64 bits, a list where a name goes."""


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int(value: Any) -> int | None:
    """An integer, or None for what is none (missing, a word, NaN, past 64 bits)."""
    try:
        return _strict_int(value)
    except BadValue:
        return None


def _strict_int(value: Any) -> int | None:
    """An entry's integer: None for missing or not a number; BadValue for infinity or past 64 bits."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    except OverflowError:
        raise BadValue(f"{value} is not a finite number") from None
    if not _INT64[0] <= number <= _INT64[1]:
        raise BadValue(f"{number} does not fit 64 bits")
    return number


def _nonzero(value: Any) -> int | None:
    number = _strict_int(value) if isinstance(value, (int, float)) else None
    return number if number and number > 0 else None  # JSON writes 0 for "not known"


def _float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise BadValue(f"{value!r} is not a finite number of milliseconds")
    return float(value)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise BadValue(f"{_COMPACT(value)[:80]} where a name goes")


def _flag(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise BadValue(f"{_COMPACT(value)[:80]} where true or false goes")


def _bounded(value: Any, budget: list[int]) -> bool:
    """Whether `value` has at most the budget's number of items, shared references counted each time."""
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if isinstance(value, (list, tuple)):
        return all(_bounded(v, budget) for v in value)
    return True


def _sizes(value: Any) -> str | None:
    if value is None:
        return None
    if (
        type(value) is list
        and len(value) <= 64
        and all(type(v) is list and len(v) <= 16 and all(type(x) is int for x in v) for v in value)
    ):
        return _COMPACT(value)  # the usual shape, [[4096, 8]]: small by construction
    if not _bounded(value, [_MAX_ITEMS]):
        return "(too large to show)"
    return _COMPACT(value)


def op_name(profiling_name: str | None) -> tuple[str | None, str | None]:
    """(backend, op) of a profiling name: `nccl:all_reduce` -> (nccl, all_reduce); `gloo:send 1->2` -> (gloo, send)."""
    if not profiling_name:
        return None, None
    backend, _, rest = profiling_name.partition(":")
    if not rest:
        return None, backend.split(" ")[0]
    return backend, rest.split(" ")[0]


def _frames(value: Any) -> list[dict]:
    frames = []
    for f in (value if isinstance(value, (list, tuple)) else [])[:MAX_FRAMES]:
        if isinstance(f, dict):
            frames.append(
                {"name": str(f.get("name", "")), "filename": str(f.get("filename", "")), "line": _int(f.get("line"))}
            )
    return frames


def _pg(entry: dict) -> tuple[str | None, str | None]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else None
    if isinstance(pg, str):
        return pg, None
    return (str(entry["pg_id"]) if entry.get("pg_id") is not None else None), None


def _status(entry: dict, seq: int | None, progress: dict | None) -> str:
    """completed / started / scheduled: the entry's own state, else what `retired` and the
    group's pg_status say (gloo leaves every state at scheduled)."""
    state = _text(entry.get("state")) or SCHEDULED
    if state == COMPLETED or entry.get("retired") is True:
        return COMPLETED
    if progress and seq is not None and not entry.get("is_p2p"):
        if seq <= (_int(progress.get("last_completed_collective")) or -1):
            return COMPLETED
        if seq <= (_int(progress.get("last_started_collective")) or -1):
            return STARTED
    return state


def _dict_at(dump: dict, key: str) -> dict:
    """dump[key] when it is a dict, else an empty one (a version's dump may lack it or hold another type)."""
    value = dump.get(key)
    return value if isinstance(value, dict) else {}


def entry_rows(
    entries: Sequence, dump: dict, rank: int | None, file: str, encoding: str
) -> tuple[list[dict], list[tuple[int, str]]]:
    """One row per entry, every version's keys mapped onto fr_entries; and (number, reason) of each
    entry that is not one or holds a value no column can hold (counted unrecognised, the rest read)."""
    status_of = _dict_at(dump, "pg_status")
    rows, bad = [], []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            bad.append((i + 1, f"entry {i + 1}: not a dict but {type(e).__name__}"))
            continue
        try:
            rows.append(_entry_row(i, e, status_of, dump, rank, file, encoding))
        except BadValue as exc:
            bad.append((i + 1, f"entry {i + 1}: {exc}"))
    return rows, bad


def _entry_row(i: int, e: dict, status_of: dict, dump: dict, rank: int | None, file: str, encoding: str) -> dict:
    pg_name, pg_desc = _pg(e)
    pg_id = _strict_int(e.get("pg_id"))
    if pg_id is None:
        pg_id = _int(pg_name)
    seq = _strict_int(e.get("collective_seq_id", e.get("seq_id")))
    profiling_name = _text(e.get("profiling_name"))
    backend, op = op_name(profiling_name)
    is_p2p = op in P2P_OPS if e.get("is_p2p") is None else bool(e.get("is_p2p"))
    progress = status_of.get(str(pg_id)) or status_of.get(pg_name or "")
    return {
        "file": file, "line": None, "host": None,
        "rank": rank, "record_id": _strict_int(e.get("record_id", i)),
        "pg_id": pg_id, "pg_name": pg_name, "pg_desc": pg_desc,
        "collective_seq_id": seq, "p2p_seq_id": _strict_int(e.get("p2p_seq_id")), "op_id": _strict_int(e.get("op_id")),
        "profiling_name": profiling_name, "backend": backend, "op": op, "is_p2p": is_p2p,
        "state": _text(e.get("state")), "status": _status(e, seq, progress if isinstance(progress, dict) else None),
        "retired": _flag(e.get("retired")),
        "input_sizes": _sizes(e.get("input_sizes")), "output_sizes": _sizes(e.get("output_sizes")),
        "input_dtypes": _sizes(e.get("input_dtypes")), "output_dtypes": _sizes(e.get("output_dtypes")),
        "time_created_ns": _nonzero(e.get("time_created_ns")),
        "time_discovered_started_ns": _nonzero(e.get("time_discovered_started_ns")),
        "time_discovered_completed_ns": _nonzero(e.get("time_discovered_completed_ns")),
        "duration_ms": _float(e.get("duration_ms")), "timeout_ms": _strict_int(e.get("timeout_ms")),
        "thread_name": _text(e.get("thread_name")),
        "thread_id": None if e.get("thread_id") is None else str(e.get("thread_id")),
        "frames": _frames(e.get("frames")), "version": str(dump.get("version", "")) or None, "encoding": encoding,
    }  # fmt: skip


def entry_frame(rows: list[dict]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame()  # a dump with no entries (or none readable) still names its groups
    frame_type = pl.List(pl.Struct({"name": pl.String, "filename": pl.String, "line": pl.Int64}))
    frame = pl.DataFrame(
        rows,
        schema_overrides={"frames": frame_type, "duration_ms": pl.Float64, "time_created_ns": pl.Int64},
        infer_schema_length=None,
    )
    created = pl.from_epoch(pl.col("time_created_ns"), time_unit="ns").dt.replace_time_zone("UTC")
    return frame.with_columns(
        ts=created, ts_quality=pl.when(created.is_not_null()).then(pl.lit("exact")).otherwise(pl.lit("none"))
    )


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, dict):
        value = value.get("ranks")
    if isinstance(value, str):
        value = re.findall(r"-?\d+", value)
    if isinstance(value, (list, tuple)):
        ranks = [r for r in (_int(v) for v in value) if r is not None]
        return ranks or None
    return None


def group_frame(dump: dict, entries: pl.DataFrame, rank: int | None, file: str) -> pl.DataFrame:
    """One row per process group the dump knows (pg_config, pg_status or its entries)."""
    config, status = _dict_at(dump, "pg_config"), _dict_at(dump, "pg_status")
    # runs alike
    seen = (
        entries.select("pg_id", "pg_name", "pg_desc").unique(maintain_order=True).to_dicts() if entries.height else []
    )
    groups: dict[str, dict] = {}
    for row in seen:
        key = row["pg_name"] or str(row["pg_id"])
        groups[key] = {"pg_id": row["pg_id"], "pg_name": row["pg_name"], "pg_desc": row["pg_desc"]}
    for name, cfg in config.items():
        ranks = _ranks(cfg)
        if not name and not ranks:
            continue  # torch 2.13 gloo writes one empty group
        g = groups.setdefault(str(name), {"pg_id": _int(name), "pg_name": str(name), "pg_desc": None})
        g["ranks"] = ranks
        if isinstance(cfg, dict) and cfg.get("desc"):
            g["pg_desc"] = str(cfg["desc"])
    for pg_id, st in status.items():
        g = groups.setdefault(str(pg_id), {"pg_id": _int(pg_id), "pg_name": str(pg_id), "pg_desc": None})
        if isinstance(st, dict):
            g["last_enqueued"] = _int(st.get("last_enqueued_collective"))
            g["last_started"] = _int(st.get("last_started_collective"))
            g["last_completed"] = _int(st.get("last_completed_collective"))
    rows = [{"file": file, "line": None, "host": None, "ts": None, "ts_quality": "none", "rank": rank, "ranks": None,
             "last_enqueued": None, "last_started": None, "last_completed": None, **g,
             "version": str(dump.get("version", "")) or None,
             "comm_lib_version": str(dump.get("comm_lib_version") or "") or None}
            for g in groups.values()]  # fmt: skip
    return pl.DataFrame(rows, schema_overrides={"ranks": pl.List(pl.Int64)}, infer_schema_length=None)
