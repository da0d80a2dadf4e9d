#!/usr/bin/env bash
# `make lock`: regenerate the lock files tools/bootstrap-venv.sh installs, from their inputs.
#   requirements/cpu.in (+ test.txt)   -> requirements/cpu.lock           (uv pip install)
#   requirements/megatron-core.txt     -> requirements/megatron-core.lock  (pip --no-deps)
#   requirements/installer.txt         -> requirements/installer.lock      (pip, uv itself)
#   requirements/lint.txt              -> requirements/lint.lock           (pip, tools/lint-install.sh;
#                                         constrained to cpu.lock's versions: both go into .venv)
# Every line of a lock is name==version with the sha256 of each file the index has for it (and
# of the local CPU torch wheel). uv keeps the versions an existing lock already has unless
# UPGRADE=1 (`make lock UPGRADE=1`) or an input asks for another; commit inputs and locks together.
# Each lock's second header line records the sha256 of its inputs: tests/test_lock.py fails when
# an input changed after its lock was written.
# The resolution is for the cpu tier's machines: CPython 3.11 on x86_64 Linux (manylinux_2_28).
set -euo pipefail
cd "$(dirname "$0")/.."
want_uv=$(grep -E '^uv==' requirements/installer.txt | cut -d= -f3)
UV=${UV:-}
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=.venv/bin/uv; else UV=$(command -v uv || true); fi
fi
[ -n "$UV" ] || { echo "lock: no uv; bash tools/bootstrap-venv.sh installs uv==$want_uv into .venv" >&2; exit 2; }
have_uv=$("$UV" --version | cut -d' ' -f2)
[ "$have_uv" = "$want_uv" ] || { echo "lock: $UV is uv $have_uv, requirements/installer.txt pins $want_uv" >&2; exit 2; }
# The wheel folders pip is told about (the CPU torch build), as tools/bootstrap-venv.sh does.
links=()
for dir in ${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}; do
  links+=(--find-links "$dir")
done
upgrade=()
[ "${UPGRADE:-0}" = 1 ] && upgrade=(--upgrade)
export UV_PYTHON_DOWNLOADS=never
compile() {  # OUT PYTHON_VERSION INPUT... [-- uv options]
  local out=$1 pyv=$2; shift 2
  local inputs=() opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do inputs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && opts=("$@")
  local sum; sum=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
  local tmp; tmp=$(mktemp)
  [ -f "$out" ] && cp "$out" "$tmp"
  "$UV" pip compile --quiet "${inputs[0]}" -o "$tmp" --python-version "$pyv" \
    --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "make lock" \
    "${links[@]}" "${upgrade[@]}" "${opts[@]}"
  # line 2 of uv's header names the command; the inputs' checksum follows it
  { sed -n 1,2p "$tmp"; echo "#    inputs: ${inputs[*]} sha256=$sum"; sed -n '3,$p' "$tmp" | grep -v '^#    inputs: '; } > "$out"
  rm -f "$tmp"
  echo "lock: $out ($(grep -cE '^[A-Za-z0-9]' "$out") packages)" >&2
}
compile requirements/cpu.lock 3.11 requirements/cpu.in requirements/test.txt
# megatron-core declares Python>=3.12; only its hashes are wanted here (all of its files,
# the cp311 wheel pip installs among them), so resolve it alone, for 3.12, without dependencies.
compile requirements/megatron-core.lock 3.12 requirements/megatron-core.txt -- --no-deps
compile requirements/installer.lock 3.11 requirements/installer.txt -- --no-deps
compile requirements/lint.lock 3.11 requirements/lint.txt -- --constraint requirements/cpu.lock
