"""Stack dumps in any text file: py-spy dump, `ray stack`, faulthandler, Python tracebacks.

People attach the stacks of a hung job's ranks as they got them: `py-spy dump --pid P`
(with `--native`, native frames show as `name (libfoo.so)`), the 2018 `ray stack` form (a
`Stack dump for <ps line>` header, hex thread ids, frames indented by a tab), Python's
faulthandler (`Thread 0x... (most recent call first):` then `  File "f.py", line N in g`,
e.g. from `faulthandler.dump_traceback_later` or SIGABRT) and the `Traceback (most recent
call last):` of an exception, often inside a training log behind a launcher tag
(`[rank3]:`), and a C++ exception that ends the process (`terminate called after throwing an
instance of 'gloo::EnforceNotMet'` / `  what():  ...`, tool "abort", no frames). One `stacks`
row per thread (or traceback), frames innermost first.

This is a line parser of tracelens.ingest.textlog, so it reads every text input next to
the NCCL and DeepSpeed parsers: a vectorized filter finds the few lines that can belong to
a stack, and a small state machine groups only those (their number follows the stacks, not
the log). A frame line counts only right below its header or the frame before it (in a traceback,
after the source line and the `^^^^` marker line Python 3.11+ prints under it).

Rank: a `[rankN]:` launcher tag, else `rank N` in the file name (`pyspy_rank2.txt`). A batch of small
files is read by one parser, what it carries from line to line (the open thread, the process header)
kept to each file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from tracelens.ingest import IngestResult, InputFile, line_format
from tracelens.ingest.text.lines import FILE_SHIFT, NOT_MINE, PARSED

_TAG = r"^(?:[\w.-]+: )?(?:\[(?:rank|default)?\s*(?P<tag>\d+)\]:\s?)?"
CANDIDATE = (
    r"^(?:[\w.-]+: )?(?:\[[^\]]*\]:\s?)?(?:"
    r"Process \d+: |Python v\d|Thread (?:0x[0-9A-Fa-f]+|\d+) \(|Current thread 0x|Stack \(most recent|Stack dump for |"
    r"Traceback \(most recent call last\)|terminate called after|\s*what\(\):|\s+File \"|"
    r"(?:\t ?| {4}).+\)\s*$|[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\w*(?::|$))"
)
_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_PYTHON = re.compile(r"^Python v\d")
_SPY_THREAD = re.compile(r"^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[a-z+]+)\)(?::\s*\"(?P<name>.*)\")?\s*$")
_SPY_FRAME = re.compile(r"^(?:\t ?| {4})(?P<name>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
_RAY = re.compile(r"^Stack dump for (?P<ps>\S+\s+(?P<pid>\d+).*)$")
_FAULT_THREAD = re.compile(
    r"^(?:(?:Current thread|Thread) (?P<tid>0x[0-9A-Fa-f]+)|Stack) \(most recent call first\):\s*$"
)
_FAULT_FRAME = re.compile(r"^\s+File \"(?P<file>[^\"]*)\", line (?P<line>\d+) in (?P<name>.*\S)\s*$")
_TB_HEAD = re.compile(r"^Traceback \(most recent call last\):\s*$")
_TB_FRAME = re.compile(r"^\s+File \"(?P<file>[^\"]*)\", line (?P<line>\d+), in (?P<name>.*\S)\s*$")
_EXCEPTION = re.compile(r"^(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\w*)(?::\s*(?P<msg>.*))?$")
_ABORT = re.compile(r"^terminate called after throwing an instance of '(?P<type>[^']+)'\s*$")
_WHAT = re.compile(r"^\s*what\(\):\s+(?P<msg>.*)$")
_NATIVE_FILE = re.compile(r"\.so(?:\.\d+)*$|^\?\?$|\.dylib$|\.dll$")
_RANK_NAME = re.compile(r"rank[_-]?(\d+)", re.I)
_TAG_RE = re.compile(_TAG)

FRAME_TYPE = pl.List(pl.Struct({"name": pl.String, "filename": pl.String, "line": pl.Int64, "native": pl.Boolean}))


@dataclass
class _Block:
    """A thread (or traceback) being read."""

    tool: str
    first: int
    last: int
    rank: int | None
    pid: int | None = None
    process: str | None = None
    thread_id: str | None = None
    thread_name: str | None = None
    thread_state: str | None = None
    frames: list[dict] = field(default_factory=list)
    exception: str | None = None


INT64_MAX = 2**63 - 1


def _int(text: str | None) -> int | None:
    """A number of the dump, or None past what a table holds (a mangled paste): the field is lost, not
    the file."""
    value = int(text) if text else None
    return value if value is not None and value <= INT64_MAX else None


def _file_rank(name: str) -> int | None:
    found = _RANK_NAME.findall(name)
    return _int(found[-1]) if found else None


@line_format("stacks", candidates=(CANDIDATE,), reads_names=True)
class StackParser:
    """One per file, or per batch of small files (`files`, their lines keyed by file, lines.FILE_SHIFT):
    `feed` each chunk in order, then `finish` adds the `stacks` rows."""

    def __init__(self, source: InputFile, files: list[InputFile] | None = None) -> None:
        self.source = source
        self.file_ranks = [_file_rank(f.name) for f in files or [source]]
        self.blocks: list[_Block] = []
        self.open: _Block | None = None
        self.file = 0  # of the batch: the file of the last line read
        self.process: tuple[int | None, str | None] = (None, None)  # the file's last py-spy/ray process header

    def feed(self, chunk: pl.DataFrame) -> pl.Series:
        status = pl.Series(chunk.height * [NOT_MINE], dtype=pl.UInt8)
        candidates = chunk["text"].str.contains(CANDIDATE)
        rows = candidates.arg_true()
        if rows.len() == 0:
            self.open = None
            return status
        picked = chunk[rows]
        claimed = [i for i, (line, text) in zip(rows.to_list(), picked.iter_rows()) if self._line(line, text)]
        return status.scatter(claimed, PARSED) if claimed else status

    def _line(self, line: int, raw: str) -> bool:
        """Read one candidate line; True when it belongs to a stack."""
        if (of_file := line >> FILE_SHIFT) != self.file:
            self.file, self.process = of_file, (None, None)
        tag = _TAG_RE.match(raw)
        text = raw[tag.end() :] if tag else raw
        rank = _int(tag.group("tag")) if tag and tag.group("tag") else self.file_ranks[of_file]
        block = (
            self.open if self.open and line <= self.open.last + (3 if self.open.tool == "traceback" else 1) else None
        )
        if block is None:
            self.open = None
        if m := _PROCESS.match(text):
            self.process = (_int(m.group("pid")), m.group("cmd"))
            return True
        if _PYTHON.match(text):
            return True
        if m := _RAY.match(text):
            self.process = (_int(m.group("pid")), m.group("ps").strip())
            return True
        if m := _SPY_THREAD.match(text):
            tool = (
                "ray stack"
                if self.process[1]
                and not self.process[1].startswith("/")
                and m.group("tid").startswith("0x")
                and m.group("name") is None
                else "py-spy"
            )
            self._open(_Block(tool, line, line, rank, *self.process, m.group("tid"), m.group("name"), m.group("state")))
            return True
        if m := _FAULT_THREAD.match(text):
            self._open(_Block("faulthandler", line, line, rank, thread_id=m.group("tid")))
            return True
        if m := _ABORT.match(text):
            self._open(_Block("abort", line, line, rank, exception=m.group("type")))
            return True
        if _TB_HEAD.match(text):
            self._open(_Block("traceback", line, line, rank))
            return True
        if block is None:
            return False
        if block.tool in ("py-spy", "ray stack") and (m := _SPY_FRAME.match(text)):
            file, number = m.group("file"), m.group("line")
            native = number is None and bool(_NATIVE_FILE.search(file))
            block.frames.append({"name": m.group("name"), "filename": file, "line": _int(number), "native": native})
        elif block.tool == "faulthandler" and (m := _FAULT_FRAME.match(text)):
            block.frames.append(
                {"name": m.group("name"), "filename": m.group("file"), "line": _int(m.group("line")), "native": False}
            )
        elif block.tool == "traceback" and (m := _TB_FRAME.match(text)):
            block.frames.append(
                {"name": m.group("name"), "filename": m.group("file"), "line": _int(m.group("line")), "native": False}
            )
        elif block.tool == "abort" and (m := _WHAT.match(text)):
            block.exception = f"{block.exception}: {m.group('msg').strip()}"
            self.open = None
            return True
        elif block.tool == "traceback" and block.frames and (m := _EXCEPTION.match(text) or _EXCEPTION.match(raw)):
            block.exception = m.group(0).strip()  # `RuntimeError: ...` is not a `host: ` tag
            self.open = None
            return True
        else:
            return False
        block.last = line
        return True

    def _open(self, block: _Block) -> None:
        self.blocks.append(block)
        self.open = block

    def finish(self, result: IngestResult) -> None:
        rows = []
        for b in self.blocks:
            if not b.frames and b.tool == "traceback":
                continue
            frames = list(reversed(b.frames)) if b.tool == "traceback" else b.frames  # innermost first
            rows.append({
                "file": self.source.name, "line": b.first, "host": None, "ts": None, "ts_quality": "none",
                "rank": b.rank, "pid": b.pid, "process": b.process,
                "thread_id": b.thread_id, "thread_name": b.thread_name, "thread_state": b.thread_state,
                "tool": b.tool, "frames": frames, "exception": b.exception,
            })  # fmt: skip
        if rows:
            result.add("stacks", pl.DataFrame(rows, schema_overrides={"frames": FRAME_TYPE}, infer_schema_length=None))
