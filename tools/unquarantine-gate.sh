#!/usr/bin/env bash
# The un-quarantine gate for every job of scenarios/quarantine.toml, on the results at hand
# ($RESULTS, default results/: every */results.json, e.g. the nightly GPU jobs' artifacts).
# Per job, `python -m harness verdict --job ID --gate` (tools/verdict.sh) prints its verdict and
# gate line; a job whose gate passes is printed with the step that takes it out of quarantine.
# Exit codes: README "The verdict". This script exits 0 only when every job's gate passes, else
# with the first job's non-zero code (`make gate` exits 2 for any of them: GNU make's status for
# a failed recipe; make's "Error N" line names the code). GATE_PATCHED=1 (a yes/no switch,
# harness/switches.py; any other word stops here, exit 2): the jobs' pipelines apply the fix (the
# moe-ckpt-fix wheel installed, MOE_CKPT_FIX=1; docs/fix.md), so SAFE WITH PATCH passes. PY: the
# interpreter (`make gate` passes the Makefile's).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PY:-$(bash tools/python.sh)} || exit 2
patched=$("$py" -m harness.switches GATE_PATCHED off) || exit 2
args=()
[ "$patched" = 1 ] && args+=(--patched)
ids=$("$py" -c 'from harness.report.jobs import ProfileError, load_quarantine
try:
    print(" ".join(j.id for j in load_quarantine().jobs))
except ProfileError as exc:  # one line naming the file and key, not a traceback
    raise SystemExit(f"error: {exc}")') || exit 2
rc=0
for id in $ids; do
  echo "== un-quarantine gate: $id"
  PY="$py" bash tools/verdict.sh --job "$id" --gate "${args[@]}"
  code=$?
  [ "$rc" = 0 ] && rc=$code
done
exit "$rc"
