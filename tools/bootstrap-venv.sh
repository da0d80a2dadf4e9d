#!/usr/bin/env bash
# Create .venv from the pinned requirements (cpu tier + controller). Idempotent: a stamp file
# holding the requirements' checksum skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${BOOTSTRAP_PYTHON:-python3}
STAMP="$VENV/.requirements.sha256"
want=$(cat requirements/installer.txt requirements/cpu.txt requirements/test.txt requirements/megatron-core.txt | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then exit 0; fi
echo "bootstrap: creating $VENV from requirements/ (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# uv (requirements/installer.txt) installs requirements/cpu.txt: pip unpacks wheels one at a
# time (17 s of a fresh venv here, uv 4 s, the same versions). uv does not read pip's
# configuration, so the wheel folders pip is told about (the CPU torch build on the development
# and CI machines) are handed to it; without them both would take torch from the index alike.
"${PIP[@]}" install --no-compile -r requirements/installer.txt
links=()
for dir in ${PIP_FIND_LINKS:-$("${PIP[@]}" config get global.find-links 2>/dev/null || true)}; do
  links+=(--find-links "$dir")
done
VIRTUAL_ENV="$PWD/$VENV" "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
  "${links[@]}" -r requirements/cpu.txt
"${PIP[@]}" install --no-compile --no-deps --ignore-requires-python -r requirements/megatron-core.txt
# Bytecode on every core: pip or uv would compile file by file on one (47 s -> 36 s for
# requirements/cpu.txt, docs/benchmarks.md). Test suites inside the packages (tests/,
# torch/testing/_internal) are never imported by the harness: 2-3 s less. Files from other
# Python versions' syntax are not an error.
"$VENV/bin/python" -m compileall -q -j 0 -x 'site-packages/.*/(tests?|testing/_internal)/' \
  "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
# Fail here, not deep inside a test, if the stack does not import.
"$VENV/bin/python" -c "import torch, megatron.core, modelopt.torch.quantization; print('bootstrap: torch', torch.__version__, '| megatron-core', megatron.core.__version__)" >&2
echo "$want" > "$STAMP"
