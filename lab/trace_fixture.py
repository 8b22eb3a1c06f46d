"""The profiler traces of one matrix run made with `matrix.py --profile`: each rank's trace cut to the
steps around the fault and gzipped into its host's folder of the fixture, and the fixture's
expected.json told what was kept.

A trace is Kineto's Chrome-trace JSON, one event per `},` newline, two spaces, `{` (Kineto's own
layout). The events are cut as text, so what is kept is byte for byte what the profiler wrote: the
metadata events (`"ph": "M"`: process and thread names) and every event that starts inside the kept
steps, from the first kept ProfilerStep's start to the last one's end. The kept steps are those that
overlap BEFORE_S seconds before the fault to AFTER_S seconds after it switched on (a clean run: the
slot a fault would have taken); TRACE_BEFORE_S and TRACE_AFTER_S in the environment set them (3, 5).
"""

from __future__ import annotations

import gzip
import json
import re
from datetime import datetime, timedelta
from pathlib import Path

from make_fixture import utc
from matrix import FAULT_AFTER, Run, env_float

BEFORE_S = env_float("TRACE_BEFORE_S", 3.0)
AFTER_S = env_float("TRACE_AFTER_S", 5.0)
SEPARATOR = "},\n  {"
EVENTS = re.compile(r'"traceEvents"\s*:\s*\[\s*')
RANK = re.compile(r"^rank(\d+)\.")
STEP = "ProfilerStep#"


def cut(text: str, begin: datetime, end: datetime) -> tuple[str, list[int]]:
    """The trace `text` with only the events described above; and the step numbers kept."""
    head = EVENTS.search(text)
    if head is None:
        raise ValueError("no traceEvents array")
    close = text.rindex("]")
    before, body, after = text[: head.end()], text[head.end() : close].rstrip(), text[close:]
    meta = json.loads(before[: before.rindex('"traceEvents"')].rstrip().rstrip(",") + "}")
    base_us = meta.get("baseTimeNanoseconds", 0) / 1000
    pieces = body.strip().removeprefix("{").removesuffix("}").split(SEPARATOR)
    events = [json.loads("{" + piece + "}") for piece in pieces]
    lo, hi = (begin.timestamp() * 1e6 - base_us, end.timestamp() * 1e6 - base_us)
    steps = [
        (e["ts"], e["ts"] + e.get("dur", 0), int(e["name"][len(STEP) :]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP)
    ]
    kept_steps = sorted((s, f, n) for s, f, n in steps if f > lo and s < hi)
    if not kept_steps:
        raise ValueError("no profiled step in the window")
    first, last = kept_steps[0][0], max(f for _, f, _ in kept_steps)
    kept = [
        piece
        for piece, e in zip(pieces, events, strict=True)
        if e.get("ph") == "M" or (isinstance(e.get("ts"), (int, float)) and first <= e["ts"] < last)
    ]
    return before + "{" + SEPARATOR.join(kept) + "}\n  " + after, [n for _, _, n in kept_steps]


def add_traces(run: Run, work: Path, fixture: Path, events: dict[str, str]) -> None:
    """Every rank's trace of the run, cut and gzipped as `<host>/rank<N>.pt.trace.json.gz`."""
    if run.kind == "clean":
        onset = utc(events["first step"]) + timedelta(seconds=FAULT_AFTER)
    else:
        onset = utc(events["fault on"])
    begin, end = onset - timedelta(seconds=BEFORE_S), onset + timedelta(seconds=AFTER_S)
    kept: dict[str, list[int]] = {}
    for trace in sorted((work / "traces").glob("rank*.pt.trace.json")):
        rank = int(RANK.match(trace.name).group(1))  # type: ignore[union-attr]
        text, steps = cut(trace.read_text(), begin, end)
        host = run.hosts[run.host_of(rank)]
        with gzip.open(fixture / host / f"rank{rank}.pt.trace.json.gz", "wt", compresslevel=9) as out:
            out.write(text)
        kept[str(rank)] = [steps[0], steps[-1]]
    if len(kept) != run.world:
        raise RuntimeError(f"{len(kept)} profiler traces for {run.world} ranks")
    record(fixture, run, begin, end, kept)


def record(fixture: Path, run: Run, begin: datetime, end: datetime, kept: dict[str, list[int]]) -> None:
    """What was kept, in the fixture's expected.json (`traces`) and README."""
    expected_path = fixture / "expected.json"
    expected = json.loads(expected_path.read_text())
    expected["traces"] = {
        "kept": [begin.isoformat(timespec="milliseconds"), end.isoformat(timespec="milliseconds")],
        "steps": dict(sorted(kept.items())),
    }
    expected_path.write_text(json.dumps(expected, indent=2) + "\n")
    readme = fixture / "README.md"
    first, last = min(s for s, _ in kept.values()), max(e for _, e in kept.values())
    readme.write_text(
        readme.read_text().replace(
            f"`lab/matrix.py {run.id}`", f"`lab/matrix.py --table lab/traces.tsv --profile {run.id}`"
        )
        + f"""
## Profiler traces

Every rank ran under `torch.profiler` (CPU; recording after 5 steps and 1 of warm-up; lab/job.py),
its trace written by `tensorboard_trace_handler`: `<host>/rank<N>.pt.trace.json.gz`, Kineto's own
layout, cut (lab/trace_fixture.py) to the events of ProfilerSteps {first}-{last}, those that overlap
{begin:%H:%M:%S} to {end:%H:%M:%S} UTC ({BEFORE_S:g} s before the fault's start to {AFTER_S:g} s after
it; a clean run: where a fault would have started). The traces name their host `vm`: the
namespaces share the machine's host name.
"""
    )
