#!/usr/bin/env bash
# nvcc for one GPU architecture: drops every `-gencode` pair that is not for NVCC_ONE_ARCH (e.g.
# 90 on an H100/H200), then runs the real nvcc ($CUDA_HOME/bin/nvcc). Why: mamba-ssm's and
# causal-conv1d's setup.py hard-code 8 architectures for CUDA 13, which multiplies their compile
# time on the lent host by 8; torch's cpp_extension takes this wrapper through PYTORCH_NVCC (its
# ninja build path only, so run.sh checks ninja first). Both `-gencode X` and `-gencode=X` forms.
set -euo pipefail
keep=${NVCC_ONE_ARCH:?set NVCC_ONE_ARCH, e.g. 90}
real=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
args=() given=0 kept=0
while [ $# -gt 0 ]; do
  case "$1" in
    -gencode) spec=$2; shift 2 ;;
    -gencode=*) spec=${1#-gencode=}; shift ;;
    *) args+=("$1"); shift; continue ;;
  esac
  given=$((given + 1))
  if [[ "$spec" == "arch=compute_${keep},"* ]]; then args+=(-gencode "$spec"); kept=$((kept + 1)); fi
done
# architectures asked for, none of them this one: nvcc would build its default silently
[ $given = 0 ] || [ $kept -gt 0 ] || { echo "nvcc-one-arch.sh: none of the $given -gencode architectures is compute_$keep (NVCC_ONE_ARCH)" >&2; exit 2; }
exec "$real" "${args[@]}"
