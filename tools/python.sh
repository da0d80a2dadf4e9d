#!/usr/bin/env bash
# Print the Python interpreter the harness should use, bootstrapping .venv when needed.
#   HARNESS_PYTHON=system  use python3 as found (NGC container, GPU host with the stack installed)
#   HARNESS_PYTHON=venv    always use .venv (created from requirements/ on first use)
#   HARNESS_PYTHON=auto    (default) system python3 if it already imports torch, megatron-core,
#                          nvidia-modelopt and Transformer Engine; otherwise .venv
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${HARNESS_PYTHON:-auto}
has_stack() {
  timeout 120 python3 - <<'PY' >/dev/null 2>&1
import torch, megatron.core, modelopt.torch.quantization, transformer_engine.pytorch
PY
}
case "$mode" in
  system) command -v python3 ;;
  venv) bash tools/bootstrap-venv.sh >&2 && echo "$PWD/.venv/bin/python" ;;
  auto)
    if has_stack; then command -v python3
    else bash tools/bootstrap-venv.sh >&2 && echo "$PWD/.venv/bin/python"; fi ;;
  *) echo "HARNESS_PYTHON must be system, venv or auto (got '$mode')" >&2; exit 2 ;;
esac
