#!/usr/bin/env bash
# Issue 65: does `make test` cover what `make test-slow` adds? Runs `make test` and then
# `make test-slow`, each under coverage (the pytest-xdist workers, torchrun's ranks and forked
# ranks too), combines each, and prints the comparison (tools/coverage_split.py): the lines of
# harness/ and moe_ckpt_fix/ covered by both suites together, by `make test` alone, the ratio,
# and per module the lines only `make test-slow` reaches. docs/coverage-split.md describes it
# and has its last figure.
#   bash tools/coverage-split.sh               both suites, then the comparison
#   COVERAGE_REUSE=1 bash tools/coverage-split.sh   the comparison of the data already there
# Data and each suite's results under $COVERAGE_OUT (default results/coverage); each suite is
# bounded by SUITE_TIMEOUT_S (default 3000 s). A suite's failures are reported, not fatal: the
# comparison is still printed (its lines were still run). Known: the `PY=` given to make reaches
# the makes the tests start (MAKEFLAGS), so tests/test_exit_codes.py's make_target_stops_without_python
# and tests/test_entry_point.py's HARNESS_PYTHON=system test fail under this script only.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=$(bash tools/python.sh)
[ -n "$PY" ] || exit 2
want=$(grep -E '^coverage==' requirements/coverage.txt)
if ! timeout 60 "$PY" -c "import coverage, sys; sys.exit(coverage.__version__ != '${want#coverage==}')" 2>/dev/null; then
  timeout 600 "$PY" -m pip install --quiet "$want"
fi
out=$root/${COVERAGE_OUT:-results/coverage}
mkdir -p "$out"
for suite in test test-slow; do
  data=$out/$suite.data
  [ "${COVERAGE_REUSE:-}" = 1 ] && continue
  rm -f "$data" "$data".*
  cat > "$out/$suite.rc" <<RC
[run]
source = harness, moe_ckpt_fix
parallel = true
patch = subprocess, fork, _exit
data_file = $data
RC
  start=$(date +%s)
  code=0
  # HARNESS_COVERAGE_CONTEXTS=1: each test's lines under its node id (conftest.py), which
  # tools/coverage_split.py --plan reads
  HARNESS_COVERAGE_CONTEXTS=1 timeout "${SUITE_TIMEOUT_S:-3000}" make "$suite" PY="$PY -m coverage run --rcfile=$out/$suite.rc" \
    RESULTS="$out/$suite-results" > "$out/$suite.log" 2>&1 || code=$?
  echo "make $suite under coverage: exit $code, $(( $(date +%s) - start )) s ($(tail -1 "$out/$suite.log"))" >&2
  timeout 600 "$PY" -m coverage combine --quiet --rcfile="$out/$suite.rc"
done
timeout 600 "$PY" tools/coverage_split.py "$root" "$out/test.data" "$out/test-slow.data"
