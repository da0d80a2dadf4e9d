#!/usr/bin/env bash
# `python -m harness verdict [ARGS]` on the results at hand ($RESULTS, default results/: every
# */results.json, e.g. the CI jobs' artifacts; none: the verdict runs the jobs' cells here), exiting
# with the verdict's own code (`python -m harness verdict --help` lists them). `make verdict` runs
# it, but exits 2 for any non-zero code (GNU make's status for a failed recipe; make's
# "Error N" line names the code): call this script where the code matters (CI, tools/unquarantine-gate.sh).
# PY: the interpreter (the Makefile passes its own).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PY:-$(bash tools/python.sh)} || exit 2
results=${RESULTS:-results}
args=()
for f in "$results"/*/results.json; do
  [ -e "$f" ] && args+=(--results "$f")
done
exec "$py" -W ignore -m harness --results-root "$results" verdict "${args[@]}" "$@"
