"""`python -m synth fixtures/ [NAME ...]`: (re)write the fixture run folders (and, without names,
the run pairs for diff)."""

from __future__ import annotations

import argparse
from pathlib import Path

from synth.pairs import write_pairs
from synth.runs import write
from synth.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m synth", description=__doc__)
    parser.add_argument("out", type=Path, help="folder to write the run folders into (e.g. fixtures/)")
    parser.add_argument("names", nargs="*", help="only these scenarios (default: all)")
    args = parser.parse_args(argv)
    known = {s.name for s in SCENARIOS}
    unknown = sorted(set(args.names) - known)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for scenario in SCENARIOS:
        if not args.names or scenario.name in args.names:
            print(write(scenario, args.out))
    if not args.names:
        print(write_pairs(args.out))


if __name__ == "__main__":
    main()
