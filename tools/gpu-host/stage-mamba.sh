#!/usr/bin/env bash
# Stages the hybrid model's kernels for the lent GPU host (no registry there): the sdists of
# requirements/mamba.txt (and einops' wheel) into DIR (default .whl-mamba, git-ignored; carry it with the call that
# runs `tools/gpu-host/run.sh mamba`, which compiles them with the host's nvcc), and ninja's wheel:
# torch builds them for one architecture only on its ninja path (tools/gpu-host/nvcc-one-arch.sh).
# The *_SKIP_CUDA_BUILD variables only keep pip's metadata step here from looking for CUDA.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.whl-mamba}
mkdir -p "$DIR"
MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE timeout 300 .venv/bin/python -m pip download \
  --no-deps --no-build-isolation --no-binary mamba-ssm,causal-conv1d -r requirements/mamba.txt -d "$DIR"
timeout 120 .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 ninja -d "$DIR"
ls -la "$DIR"
