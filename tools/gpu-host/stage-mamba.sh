#!/usr/bin/env bash
# Stages the hybrid model's kernels for the lent GPU host (no registry there).
#   stage-mamba.sh [DIR]          the sdists of requirements/mamba.txt, einops' wheel and ninja's
#                                 wheel into DIR (default .whl-mamba, git-ignored; carry it with
#                                 the call that runs `tools/gpu-host/run.sh mamba`, which compiles
#                                 them with the host's nvcc for its GPU only: torch does that on
#                                 its ninja path, tools/gpu-host/nvcc-one-arch.sh)
#   stage-mamba.sh --built FROM [DIR]  the wheels `run.sh mamba` brought back (FROM: the
#                                 call's files folder; parts of a wheel over 15 MiB are joined)
#                                 into DIR/built: the next `run.sh mamba` installs them instead of
#                                 compiling (683 s on the H100's 16 cores), for the same torch
#                                 (2.11.0+cu130) and GPU architecture only
# The *_SKIP_CUDA_BUILD variables only keep pip's metadata step here from looking for CUDA.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --built ]; then
  FROM=${2:?usage: stage-mamba.sh --built FROM [DIR]}; DIR=${3:-.whl-mamba}
  [ -d "$FROM" ] || { echo "stage-mamba.sh: no folder $FROM (the files of a run.sh mamba call)" >&2; exit 2; }
  mkdir -p "$DIR/built"
  for f in "$FROM"/*.whl; do [ -e "$f" ] && cp "$f" "$DIR/built/"; done
  for first in "$FROM"/*.whl.part00; do
    [ -e "$first" ] || continue
    name=$(basename "$first" .part00); cat "$FROM/$name".part?? > "$DIR/built/$name"
  done
  ls "$DIR"/built/mamba_ssm-*.whl "$DIR"/built/causal_conv1d-*.whl > /dev/null \
    || { echo "stage-mamba.sh: $FROM holds no mamba_ssm and causal_conv1d wheels" >&2; exit 2; }
  for w in "$DIR"/built/*.whl; do
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip() is None or sys.exit(1)" "$w" 2> /dev/null \
      || { echo "stage-mamba.sh: $w is damaged (a part missing?)" >&2; exit 2; }
  done
  du -sh "$DIR"; exit 0
fi
DIR=${1:-.whl-mamba}
mkdir -p "$DIR"
MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE timeout 300 .venv/bin/python -m pip download \
  --no-deps --no-build-isolation --no-binary mamba-ssm,causal-conv1d -r requirements/mamba.txt -d "$DIR"
timeout 120 .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 ninja -d "$DIR"
ls -la "$DIR"
