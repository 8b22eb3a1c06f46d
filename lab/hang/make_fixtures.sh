#!/usr/bin/env bash
# Make the real hang fixtures: run each scenario of lab/hang/run.py on this machine (torch 2.13
# CPU, gloo, 4 ranks), copy what it left into fixtures/lab-hang-<scenario>/, then run PyTorch's
# own analyzer (torchfrtrace, lab/hang/torch_analyzer.py) on the pickles. Usage (from the repository root):
#   python3 -m venv lab/hang/.venv && lab/hang/.venv/bin/pip install torch==2.13.0 py-spy tabulate
#   bash lab/hang/make_fixtures.sh [scenario ...]        # PY=/path/to/python to use another interpreter
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/lab/hang/.venv/bin/python}
for name in "${@:-healthy skip size sleep kill}"; do
  for scenario in $name; do
    out=$(mktemp -d -t "lab-hang-$scenario.XXXX")
    "$PY" "$ROOT/lab/hang/run.py" "$scenario" "$out" > /dev/null
    dest="$ROOT/fixtures/lab-hang-$scenario"
    rm -rf "$dest" && mkdir -p "$dest"
    cp -r "$out"/. "$dest"/
    rm -rf "$out"
    "$PY" "$ROOT/lab/hang/torch_analyzer.py" "$dest"  # PyTorch's analyzer on the pickles, as people paste it
    echo "fixtures/lab-hang-$scenario"
  done
done
