#!/usr/bin/env bash
# Run several lab scenarios one after the other (each cleans up after itself): lab/run_all.sh clean loss ...
set -uo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
for scenario in "$@"; do
    echo "=== $scenario $(date -u +%FT%TZ)"
    "$LAB/run.sh" "$scenario" || echo "=== $scenario FAILED"
done
