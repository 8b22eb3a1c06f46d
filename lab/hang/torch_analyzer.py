"""Run PyTorch's own Flight Recorder analyzer (torchfrtrace) on a lab/hang fixture's pickles.

    lab/hang/.venv/bin/python lab/hang/torch_analyzer.py fixtures/lab-hang-skip

torch 2.13's gloo backend writes `pg_config` as one empty group ({"": {"ranks": "[]"}}), and
the analyzer cannot match entries without the groups' members (KeyError in build_db). So the
pickles given to the analyzer get the members the job really had (worker.py: the default
group and the "metrics" group, both of all ranks); nothing else in them is changed, and the
fixture keeps the dumps exactly as torch wrote them. The analyzer's text is written as it
printed it: torchfrtrace.txt (the default report), torchfrtrace_j.txt (`-j`, the listing of
each rank's entries) and torchfrtrace_j_verbose.txt (`-j` with FR_TRACE_VERBOSE_OUTPUT=1). When a rank
left no dump, torchfrtrace_dumped_ranks.txt is the default report with the members set to the
ranks that dumped: the analyzer then compares their entries and prints their mismatches. These
are our own pickles, so loading them with pickle here is safe.
"""

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path


def main():
    fixture = Path(sys.argv[1])
    pickles = sorted(p for p in fixture.glob("rank*/fr_trace_rank_*") if p.suffix != ".json")
    world = len(list(fixture.glob("rank*")))
    analyze(fixture, pickles, list(range(world)), "")
    dumped = sorted(int(p.name.rsplit("_", 1)[1]) for p in pickles)
    if len(dumped) < world:
        # a rank died without a dump: with the groups' members set to the ranks that dumped, the
        # analyzer compares those ranks' entries with each other and reports their mismatches
        analyze(fixture, pickles, dumped, "_dumped_ranks")


def analyze(fixture: Path, pickles: list[Path], ranks: list[int], suffix: str) -> None:
    members = str(ranks)
    with tempfile.TemporaryDirectory() as tmp:
        for path in pickles:
            dump = pickle.loads(path.read_bytes())
            descs = {str(e["pg_id"]): e["process_group"][1] for e in dump["entries"]}
            dump["pg_config"] = {pg: {"name": pg, "desc": desc, "ranks": members} for pg, desc in descs.items()}
            (Path(tmp) / path.name).write_bytes(pickle.dumps(dump))
        runs = [("torchfrtrace", [], "0")]
        if not suffix:
            runs += [("torchfrtrace_j", ["-j"], "0"), ("torchfrtrace_j_verbose", ["-j"], "1")]
        for name, extra, verbose in runs:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.flight_recorder.fr_trace",
                tmp,
                "-p",
                "fr_trace_rank_",
                "--allow-incomplete-ranks",
                *extra,
            ]
            env = dict(os.environ, FR_TRACE_VERBOSE_OUTPUT=verbose)
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.stdout + done.stderr or not suffix:
                (fixture / f"{name}{suffix}.txt").write_text(done.stdout + done.stderr)


if __name__ == "__main__":
    main()
