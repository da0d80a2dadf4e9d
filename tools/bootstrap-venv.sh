#!/usr/bin/env bash
# Create .venv from the lock files (cpu tier + controller): requirements/installer.lock (uv),
# cpu.lock (everything but megatron-core), megatron-core.lock. Every version there is exact and
# every file hash-checked; `make lock` (tools/lock.sh) writes them from requirements/*.in/.txt.
# Idempotent: a stamp file holding the locks' checksum skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${BOOTSTRAP_PYTHON:-python3}
STAMP="$VENV/.requirements.sha256"
want=$(cat requirements/installer.lock requirements/cpu.lock requirements/megatron-core.lock | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then exit 0; fi
echo "bootstrap: creating $VENV from requirements/ (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# uv (requirements/installer.lock) installs requirements/cpu.lock: pip unpacks wheels one at a
# time (17 s of a fresh venv here, uv 4 s, the same versions). uv does not read pip's
# configuration, so the wheel folders pip is told about (the CPU torch build on the development
# and CI machines) are handed to it; the lock pins torch 2.13.0+cpu by that wheel's hash, so
# without them uv stops (no such file on the index) instead of taking a CUDA build.
"${PIP[@]}" install --no-compile --no-deps --require-hashes -r requirements/installer.lock
links=()
for dir in ${PIP_FIND_LINKS:-$("${PIP[@]}" config get global.find-links 2>/dev/null || true)}; do
  links+=(--find-links "$dir")
done
# Every package of the lock at the lock's version. install, not `uv pip sync`: sync would also
# remove what is not in the lock, i.e. the lint tools tools/lint-install.sh puts into the same
# .venv on demand (.ci/run installs them before `make test` bootstraps) and megatron-core.
VIRTUAL_ENV="$PWD/$VENV" "$VENV/bin/uv" pip install --quiet --require-hashes --python "$VENV/bin/python" \
  "${links[@]}" -r requirements/cpu.lock
# megatron-core declares Python>=3.12: pip --ignore-requires-python takes its cp311 wheel (uv has no
# such switch). --no-deps: its dependencies are in cpu.lock. The lock holds its files' hashes.
"${PIP[@]}" install --no-compile --no-deps --ignore-requires-python --require-hashes -r requirements/megatron-core.lock
# Bytecode on every core: pip or uv would compile file by file on one (47 s -> 36 s for
# the cpu requirements, docs/benchmarks.md). Test suites inside the packages (tests/,
# torch/testing/_internal) are never imported by the harness: 2-3 s less. Files from other
# Python versions' syntax are not an error.
"$VENV/bin/python" -m compileall -q -j 0 -x 'site-packages/.*/(tests?|testing/_internal)/' \
  "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
# Fail here, not deep inside a test, if the stack does not import.
"$VENV/bin/python" -c "import torch, megatron.core, modelopt.torch.quantization; print('bootstrap: torch', torch.__version__, '| megatron-core', megatron.core.__version__)" >&2
echo "$want" > "$STAMP"
