#!/usr/bin/env bash
# Mutation testing of one module of harness/: do the tests that exercise it notice when its code
# is changed? mutmut (requirements/mutation.txt, not in the runtime) is installed on demand into
# .mutation/site (ignored) and run over MODULE with the pytest arguments given as the test
# selection; docs/mutation.md has the figures and each surviving mutant explained.
#   bash tools/mutation.sh harness/check/decision.py tests/test_kinds.py tests/test_versions.py
# Runs in a scratch copy of the working tree (tracked and untracked, not ignored files) under
# $MUTATION_OUT/<module> (default results/mutation/), so the checkout gets no mutants/ folder.
# Low priority and bounded: nice 19, one mutant at a time (MUTATION_CHILDREN, default 1), the
# whole run within MUTATION_TIMEOUT_S (default 3000 s). Prints the count of each outcome and
# writes the survivors' diffs to survivors.txt next to mutmut's own state. Pick tests that start
# no torchrun rank: a mutant is judged by the tests that reached its function in this process.
#   bash tools/mutation.sh --recheck harness/check/decision.py tests/test_decision.py
# After tests were written for the survivors: runs the given tests (copied afresh from tests/)
# against each mutant the last run of MODULE did not kill, one forked pytest per mutant (mutmut's
# own switch, MUTANT_UNDER_TEST), and writes recheck.txt: each mutant, killed or survived.
#   bash tools/mutation.sh --resume harness/check/decision.py
# Goes on with a run that was stopped (its bound): mutmut keeps each mutant's result, so only
# those not yet run are run, with the selection that run was given.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
recheck=0 resume=0
[ "${1:-}" = --recheck ] && { recheck=1; shift; }
[ "${1:-}" = --resume ] && { resume=1; shift; set -- "$1" -; }
[ $# -ge 2 ] || { echo "usage: bash tools/mutation.sh [--recheck | --resume] harness/PATH/MODULE.py TEST-ARGS..." >&2; exit 2; }
module=$1; shift
[ -f "$module" ] && [[ "$module" == harness/*.py ]] || { echo "mutation: $module is not a module of harness/" >&2; exit 2; }
PY=${PY:-$(bash tools/python.sh)}
[ -n "$PY" ] || exit 2
pin=$(grep -E '^mutmut==' requirements/mutation.txt)
site=$root/.mutation/site
if ! timeout 60 "$PY" -c "import sys; sys.path.append('$site'); from importlib.metadata import version; sys.exit(version('mutmut') != '${pin#mutmut==}')" 2>/dev/null; then
  rm -rf "$site"
  timeout 600 nice -n 19 "$PY" -m pip --disable-pip-version-check -q install --target "$site" "$pin"
fi
slug=${module#harness/}; slug=${slug%.py}; slug=${slug//\//.}
work=$root/${MUTATION_OUT:-results/mutation}/$slug
if [ "$recheck" = 1 ]; then
  [ -s "$work/not-killed.txt" ] || { echo "mutation: no earlier run of $module to recheck ($work)" >&2; exit 2; }
  rm -rf "$work/mutants/tests" && cp -r tests "$work/mutants/tests"
  cd "$work/mutants"
  timeout "${MUTATION_TIMEOUT_S:-3000}" nice -n 19 "$PY" - "$site" "$@" > ../recheck.txt <<'PY'
import os, signal, sys
site, tests = sys.argv[1], sys.argv[2:]
sys.path.append(site)  # the trampolines import mutmut
os.environ["PYTHONPATH"] = site  # and so do the processes a test starts
sys.path.insert(0, os.getcwd())  # the mutated copy, not the checkout
import pytest
args = ["-x", "-q", "-p", "no:cacheprovider", "--rootdir=.", "--tb=no", "--no-header", *tests]
for name in open("../not-killed.txt").read().split():
    pid = os.fork()
    if pid == 0:
        os.environ["MUTANT_UNDER_TEST"] = name
        signal.alarm(600)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        os._exit(int(pytest.main(args)))
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(f"{name}: {'killed' if code in (1, 3) else 'survived' if code == 0 else f'exit {code}'}", flush=True)
PY
  echo "recheck $module with $*: $(awk -F': ' '{n[$2]++} END {for (s in n) printf "%s %d, ", s, n[s]}' ../recheck.txt)in ${work#"$root"/}/recheck.txt"
  exit 0
fi
if [ "$resume" = 1 ]; then
  [ -f "$work/setup.cfg" ] || { echo "mutation: no earlier run of $module to resume ($work)" >&2; exit 2; }
  cd "$work"
  mv run.log "run.$(date +%s).log"
else
rm -rf "$work"
mkdir -p "$work"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work"
cd "$work"
# mutmut reads [mutmut] from setup.cfg where pyproject.toml has no [tool.mutmut]. It imports the
# mutated copy from mutants/, so everything else the tests read is copied next to it.
{
  echo "[mutmut]"
  echo "source_paths = harness"
  echo "only_mutate = $module"
  echo "also_copy ="
  for entry in *; do [ "$entry" = harness ] || echo "    $entry"; done
  echo "pytest_add_cli_args = -p no:cacheprovider"
  echo "pytest_add_cli_args_test_selection ="
  for arg in "$@"; do echo "    $arg"; done
} > setup.cfg
fi
# mutmut's own dependencies go after the venv's packages on sys.path: the tests keep the pinned
# pytest (requirements/test.txt) rather than the one pip put beside mutmut. A process a test
# starts (python -m harness) imports the mutated copy too, so it gets mutmut on PYTHONPATH.
mutmut=(nice -n 19 "$PY" -c "import os, sys; sys.path.append('$site'); sys.argv[0] = 'mutmut'
os.environ['PYTHONPATH'] = '$site'
from mutmut.__main__ import cli; cli()")
code=0
timeout "${MUTATION_TIMEOUT_S:-3000}" "${mutmut[@]}" run --max-children "${MUTATION_CHILDREN:-1}" > run.log 2>&1 || code=$?
timeout 300 "${mutmut[@]}" results --all true > results.txt 2>&1 || true
# every mutant not killed, its diff (one process: mutmut's show, once per name)
awk -F': ' '$2 != "killed" && NF == 2 {print $1}' results.txt > not-killed.txt
timeout 900 nice -n 19 "$PY" -c "import sys; sys.path.append('$site'); sys.argv[0] = 'mutmut'
from mutmut.__main__ import cli
for name in open('not-killed.txt').read().split():
    cli.main(['show', name], standalone_mode=False)" > survivors.txt 2>&1 || true
echo "mutation $module: mutmut exit $code; $(awk -F': ' 'NF == 2 {n[$2]++} END {for (s in n) printf "%s %d, ", s, n[s]}' results.txt)the mutants not killed in ${work#"$root"/}/survivors.txt"
