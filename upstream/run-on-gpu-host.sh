#!/usr/bin/env bash
# Run every standalone reproducer under upstream/ on a GPU host, each copied to a temp dir
# outside the repository (nothing of it importable), and the static-block change with and without
# modelopt.diff, plus its checkpoint format check both ways. Logs + exit codes:
# $OUT/upstream-<finding>-<label>.log (the last line of each is `exit N`). About 4 minutes on one
# H100 (2 ranks sharing it over gloo; one rank per GPU over nccl where there are 2).
#   OUT=/path/to/logs bash upstream/run-on-gpu-host.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:?set OUT to the log directory}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Only installed packages: the host's own PYTHONPATH (where its stack may live), never this
# repository (each reproducer runs from a temp dir outside it).
STOCK_PATH=${PYTHONPATH:-}

run() {  # run FINDING LABEL NPROC TIMEOUT [args...]: one reproducer, one log
  local finding=$1 label=$2 n=$3 limit=$4; shift 4
  local dir="$WORK/$finding-$label" log="$OUT/upstream-$finding-$label.log"
  mkdir -p "$dir" && cp "$HERE/$finding/repro.py" "$dir/"
  { echo "# $finding $label: torchrun --nproc-per-node $n repro.py $*"; nvidia-smi -L 2>/dev/null
    "$PY" -c 'import torch,megatron.core as m,modelopt as o;print("torch",torch.__version__,"mcore",m.__version__,"modelopt",o.__version__,o.__file__)'
  } >"$log" 2>&1
  (cd "$dir" && timeout -k 10 "$limit" "$PY" -m torch.distributed.run --nproc-per-node "$n" \
      --rdzv-backend c10d --rdzv-endpoint localhost:0 repro.py "$@") >>"$log" 2>&1
  local rc=$?
  echo "exit $rc" >>"$log"
  printf '%-28s %-22s exit %s  %s\n' "$finding" "$label" "$rc" "$(grep '^REPRO:' "$log" | tail -1)"
}

MO=$("$PY" -c 'import modelopt;print(modelopt.__version__)')
run mtp-pp-position-embedding learned 2 120
run mtp-pp-position-embedding none 2 120 --position-embedding none
run awq-te-grouped-experts "$MO" 2 180
run integer-expert-restore "$MO" 2 180
run static-block-expert-tp "$MO-stock" 2 240

# The change: a copy of the installed modelopt with modelopt.diff applied, first on PYTHONPATH.
SITE=$("$PY" -c 'import modelopt,pathlib;print(pathlib.Path(modelopt.__file__).parents[1])')
PATCHED="$WORK/patched"
mkdir -p "$PATCHED" && cp -r "$SITE/modelopt" "$PATCHED/"
if timeout 60 patch -p1 -d "$PATCHED" -i "$HERE/static-block-expert-tp/modelopt.diff" \
    >"$OUT/upstream-static-block-expert-tp-patch.log" 2>&1; then
  export PYTHONPATH="$PATCHED${STOCK_PATH:+:$STOCK_PATH}"
  run static-block-expert-tp "$MO-patched" 2 240
  # Format check both ways: saved with the change at ETP 2 -> stock loads at ETP 1; stock ETP-1
  # checkpoint -> loads with the change at ETP 2; each re-saved and compared bit for bit.
  C1="$WORK/ckpt-patched-etp2" C2="$WORK/ckpt-stock-etp1"
  run static-block-expert-tp "compat-save-patched-etp2" 2 240 --stage save --save-etp 2 --ckpt "$C1"
  export PYTHONPATH="$STOCK_PATH"
  run static-block-expert-tp "compat-load-stock-etp1" 2 240 --stage load --load-etp 1 --ckpt "$C1"
  run static-block-expert-tp "compat-save-stock-etp1" 2 240 --stage save --save-etp 1 --ckpt "$C2"
  export PYTHONPATH="$PATCHED${STOCK_PATH:+:$STOCK_PATH}"
  run static-block-expert-tp "compat-load-patched-etp2" 2 240 --stage load --load-etp 2 --ckpt "$C2"
  # The test beside the diff, with the change (it failed without: the stock run above).
  cp "$HERE/static-block-expert-tp/"{repro.py,test_static_block_expert_tp.py} "$WORK/"
  (cd "$WORK" && timeout -k 10 600 "$PY" -m pytest -q -p no:cacheprovider \
      test_static_block_expert_tp.py) >"$OUT/upstream-static-block-expert-tp-test-patched.log" 2>&1
  echo "exit $?" >>"$OUT/upstream-static-block-expert-tp-test-patched.log"
  export PYTHONPATH="$STOCK_PATH"
else
  echo "modelopt.diff does not apply to $SITE/modelopt (see the patch log)"
fi
