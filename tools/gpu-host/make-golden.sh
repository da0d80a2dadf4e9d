#!/usr/bin/env bash
# Ran on the lent H200 on 2026-12-02 (about 220 s for all three; run.sh's setup: wheelhouse
# under /root/site); its output is the committed tests/golden/<name>/ dirs. A rerun with a new
# stack makes new directories; the committed ones stay as they are (they are the point).
#
# Deterministic golden checkpoints (harness model, seed 1234, NVFP4_DEFAULT_CFG calibration,
# tier gpu-shared: TE TEGroupedMLP, ranks sharing the GPU over gloo), each with manifest.json:
#   a) modelopt-0.46.1-tp1-etp1-ep8   ModelOpt 0.46.1 (shared weight_quantizer per grouped linear)
#   b) modelopt-0.47.0-tp1-etp1-ep8   ModelOpt 0.47.0 at TP == ETP (per-expert amax, complete)
#   c) modelopt-0.47.0-tp2-etp1-ep2-novalidate   ModelOpt 0.47.0 at TP != ETP saved with
#      validate_sharding=false: some experts' amax are absent (0 main replicas)
# 0.46.1 carry: on the CPU machine `pip download --no-deps nvidia-modelopt==0.46.1 -d .whl-046`
# (2.1 MB); pass `.whl-046` in the run tool's carry. Here it is installed with --no-deps into
# /tmp/mo046 and put FIRST on PYTHONPATH, shadowing the wheelhouse's 0.47.0 for (a) only.
# Usage: make-golden.sh [a|b|c|all]   (results -> $OUT/golden-<name>.tgz and tests/golden/)
set -uo pipefail   # one golden failing must not stop the others
source /root/gw/base/env.sh
export HARNESS_PYTHON=system PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=tests/golden
make_one() {  # name topology validate [pythonpath-prefix]
  local name=$1 topo=$2 validate=$3 pre=${4:-}
  rm -rf "$G/$name"
  echo "=== golden $name ($(date +%T))"
  PYTHONPATH="$pre${pre:+:}$PWD:$PYTHONPATH" timeout 900 python3 -m harness golden make "$G/$name" \
    --topology "$topo" --validate-sharding "$validate" --notes "made by tools/gpu-host/make-golden.sh" \
    || { echo "golden $name FAILED"; tar czf "$OUT/golden-$name-failed.tgz" -C "$G" "$name"; return 1; }
  rm -rf "$G/$name/.work"                       # the reference and logs are not golden
  python3 -m harness golden verify "$G/$name"
  PYTHONPATH="$pre${pre:+:}$PWD:$PYTHONPATH" python3 -m harness inspect "$G/$name/ckpt" || true
  tar czf "$OUT/golden-$name.tgz" -C "$G" "$name"
}
what=${1:-all}
if [[ $what == a || $what == all ]]; then
  ls .whl-046/nvidia_modelopt-0.46.1-*.whl >/dev/null || { echo "carry .whl-046 (see header)" >&2; exit 2; }
  rm -rf /tmp/mo046 && python3 -m pip install -q --no-deps --target /tmp/mo046 .whl-046/nvidia_modelopt-0.46.1-*.whl
  PYTHONPATH=/tmp/mo046:$PYTHONPATH python3 -c 'import modelopt; assert modelopt.__version__ == "0.46.1", modelopt.__version__'
  make_one modelopt-0.46.1-tp1-etp1-ep8 tp1-etp1-ep8 true /tmp/mo046
fi
[[ $what == b || $what == all ]] && make_one modelopt-0.47.0-tp1-etp1-ep8 tp1-etp1-ep8 true
[[ $what == c || $what == all ]] && make_one modelopt-0.47.0-tp2-etp1-ep2-novalidate tp2-etp1-ep2 false
ls -la "$OUT"
