"""Score the lab matrix as issue 34 checks a verdict: python lab/score.py [--held-out | --runs DIR]
[--view rank0] (from the repository root).

For every run of fixtures/lab-matrix (the development part, or with --held-out the held-out part), the
top finding's headline and each check of tests/helpers/lab.py (cause, window, where, offset): a
Markdown table for lab/README.md and the count of runs that pass every check that applies. With
--view rank0, the DeepSpeed runs as DeepSpeed prints by default (tests/helpers/lab.py rank0_view).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.lab import MATRIX_CHECKS, expected_of, matrix_check, matrix_runs, rank0_view, runs_in  # noqa: E402
from tracelens.analyze import analyze  # noqa: E402

MARK = {"": "yes", None: "–"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--held-out", action="store_true", help="score the held-out part instead")
    parser.add_argument("--view", choices=("rank0",), help="the DeepSpeed runs as DeepSpeed prints by default")
    parser.add_argument(
        "--runs", type=Path, help="score the runs in this folder instead (matrix.py --out, made outside the fixtures)"
    )
    args = parser.parse_args()
    runs = runs_in(args.runs) if args.runs else matrix_runs(held_out=args.held_out)
    if args.view:
        views = Path(tempfile.mkdtemp(prefix="tracelens-views-"))
        jobs = {r: expected_of(r)["job"] for r in runs}
        runs = [
            rank0_view(r, views)
            for r, job in jobs.items()
            if job["engine"] == "deepspeed" and job.get("printing") != "default"  # those print as rank 0 does
        ]
    print("| run | injected | verdict (top finding) | " + " | ".join(MATRIX_CHECKS) + " |")
    print("|---" * (3 + len(MATRIX_CHECKS)) + "|")
    passed = 0
    sureness: Counter[tuple[str, str]] = Counter()  # (confidence, cause right?) of the verdicts
    for folder in runs:
        analysis = analyze(folder)
        results = [matrix_check(folder, analysis, check) for check in MATRIX_CHECKS]
        passed += all(r in ("", None) for r in results)
        top = analysis.findings[0] if analysis.findings else None
        headline = f"{top.rule_id} {top.severity.label}: {top.title}" if top else "no finding"
        if top is not None and top.verdict is not None and top.verdict.cause is not None:
            sureness[top.verdict.confidence, "right" if results[0] == "" else "wrong"] += 1
        cells = [MARK.get(r, "**no**") for r in results]
        cause = expected_of(folder)["scenario"]
        print(f"| {folder.name} | {cause} | {headline.replace('|', '/')} | " + " | ".join(cells) + " |")
    print(f"\n{passed} of {len(runs)} runs pass every check that applies.")
    print(
        "Verdicts naming a cause, by confidence: "
        + "; ".join(f"{c}: {sureness[c, 'right']} right, {sureness[c, 'wrong']} wrong" for c in ("high", "medium"))
        + "."
    )


if __name__ == "__main__":
    main()
