#!/usr/bin/env bash
# Create .venv from the pinned requirements (cpu tier + controller). Idempotent: a stamp file
# holding the requirements' checksum skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${BOOTSTRAP_PYTHON:-python3}
STAMP="$VENV/.requirements.sha256"
want=$(cat requirements/cpu.txt requirements/megatron-core.txt | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then exit 0; fi
echo "bootstrap: creating $VENV from requirements/ (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip compiles bytecode file by file on one core; compileall on every core does the same work
# in about half the time on 2 cores (47 s -> 36 s for requirements/cpu.txt, docs/benchmarks.md).
# Files pip would also have skipped (syntax from other Python versions) are not an error.
"${PIP[@]}" install --no-compile -r requirements/cpu.txt
"${PIP[@]}" install --no-compile --no-deps --ignore-requires-python -r requirements/megatron-core.txt
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
# Fail here, not deep inside a test, if the stack does not import.
"$VENV/bin/python" -c "import torch, megatron.core, modelopt.torch.quantization; print('bootstrap: torch', torch.__version__, '| megatron-core', megatron.core.__version__)" >&2
echo "$want" > "$STAMP"
