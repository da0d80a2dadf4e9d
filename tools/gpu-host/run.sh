#!/usr/bin/env bash
# The jobs of a lent GPU host (docs/gpu-host.md), one mode each. Assumes a GPU wheelhouse is
# installed under /root/site with its env.sh at /root/gw/base. Usage: run.sh <mode>; results -> $OUT.
#   smoke        the GPU unit tests, a few witness + fix cells and world-1 cells
#   witness      the full unpatched grid (gpu-shared)
#   fix          the patched grid (gpu-shared) and world-1 on tier gpu; FIX_HALF=1 or 2: one half
#                (saves tp2-etp1-ep2 + tp4-etp1-ep8, or tp1-etp1-ep8 + tp2-etp2-ep4 + world 1)
#   cells        any scenarios' cells: SCENARIOS (commas), CELLS (cell-id globs, commas; a comma
#                inside an id: ?), CELLS_JOBS (4), CELLS_LABEL (cells), NCCL_SHARED_GPU=1 (NCCL
#                ranks sharing the GPU), CELLS_TIMEOUT_S (540)
#   golden       the golden checkpoints (tests/golden) loaded patched and unpatched
#   repro        make repro (timed); also brings back the unpatched TP==ETP checkpoint
#   repro-modes  make repro's job once per stage mode of REPRO_MODES (fresh,pool), timed
#   equivalence  EQ_SCENARIOS (gpu-witness) fresh, then with --stage-mode EQ_MODE (pool), compared
#   test-gpu     the nightly job's own command, `make test-gpu` (SHARD=K/N, SCENARIOS narrows;
#                PYTEST_WORKERS 5, TEST_GPU_TIMEOUT_S 2700), with the carried .whl-test
#   fix-te       the fix's TE unit tests under FIX_TE_VERSIONS (0.47.0 0.48.0rc1); carry .whl-048, .whl-test
#   record       metadata recordings for tests/data/recorded: buggy and patched under the wheelhouse's
#                release, or unpatched under RECORD_VERSION (carry its .whl-<digits>)
#   matrix       the decisive cells per modelopt version (MATRIX_VERSIONS), wheels carried
#   pairs        the deciding cells per (modelopt, megatron-core) pair: PAIRS_MODELOPT (0.47.0
#                0.48.0rc1) x PAIRS_MCORE (0.15.3 0.16.1 0.19.2); carry .whl-048 .whl-mc0153 .whl-mc0161
#   recipes      the jobs' recipes (gpu-*-recipe*) per RECIPE_PARTS, at once: items
#                <modelopt>-<patch>[-mc<megatron-core>] (carry .whl-048, .whl-mc<digits>);
#                RECIPE_SCENARIOS_none/_fix pick the scenarios, RECIPE_CELLS narrows to cell-id globs
#   sample       randomized cells (harness sample) and the cross-topology noise floor, SAMPLE_PARTS;
#                SAMPLE_LIBRARY=<release>: recipes and modules drawn from that release's library;
#                SAMPLE_RANKS=N: no drawn topology needs more ranks
#   mamba        compile mamba-ssm and causal-conv1d for this GPU (carry .whl-mamba, staged by
#                tools/gpu-host/stage-mamba.sh; or its built/ wheels), run the hybrid scenarios, and
#                put the wheels it compiled into $OUT (15 MiB parts) for the next lease
#   upstream     the standalone reproducers under upstream/ (upstream/run-on-gpu-host.sh)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: run.sh <mode> (the modes are listed at the top of tools/gpu-host/run.sh)" >&2; exit 2; }
source /root/gw/base/env.sh
export HARNESS_PYTHON=system PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=results
PWD_ROOT=$PWD
H="python3 -m harness --results-root $R"
# yes/no switches, each NAME=its default: the words of harness/switches.py (1/true/yes,
# 0/false/no), read as 1 or 0 below; any other word stops run.sh here in one line (exit 2)
for s in SAMPLE_CONCURRENT=off RECIPE_PRECOMPILE=on; do
  v=$(python3 -m harness.switches "${s%=*}" "${s#*=}") || exit 2
  export "${s%=*}=$v"
done
# GPU memory in use (all processes, CUDA contexts included), once a second, for the whole call
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 1000 > "$OUT/gpu-memory-$1.csv" 2>/dev/null &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
# Wait for the given background pids only. A bare `wait` (what `wait "${PIDS[@]}"` becomes when
# PIDS is empty) also waits for the sampler above, forever: nccl-teardown with
# TEARDOWN_WORLDS=none hung so on the H100 (20261206 15:31), until the sampler was killed.
wait_jobs() { [ $# = 0 ] || wait "$@"; }
# ModelOpt's FP8 extension built before any cell, bounded (PRECOMPILE_TIMEOUT_S, 300): a stale
# build lock made an unbounded one wait 12 minutes (20261206). precompile PYTHON LOG
precompile() {
  local start=$(date +%s)
  timeout -s KILL ${PRECOMPILE_TIMEOUT_S:-300} "$1" -m harness.launch.extensions > "$2" 2>&1
  echo "precompile ($1): rc $? wall $(( $(date +%s) - start )) s: $(tail -n 1 "$2")"
}
# SCENARIOS / EQ_SCENARIOS: names separated by commas or spaces (commas fit a queue.sh entry)
scenarios() { local l=${SCENARIOS:-$*}; for s in ${l//,/ }; do echo "--scenario $s"; done; }
case "$1" in
  smoke)
    python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tail -25
    $H run --label smoke --jobs 5 --scenario gpu-witness --scenario gpu-fix \
      --cells 'gpu-witness[save=tp2-etp1-ep2-pp1,save-only]' \
      --cells 'gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]' \
      --cells 'gpu-witness[save=tp1-etp1-ep8-pp1,load=tp1-etp1-ep1-pp1]' \
      --cells 'gpu-fix[save=tp2-etp1-ep2-pp1,load=tp1-etp2-ep1-pp1]' \
      --cells 'gpu-fix[save=tp4-etp1-ep8-pp1,load=tp2-etp2-ep4-pp1]' \
      --scenario gpu-world1 --cells 'gpu-world1*' ;;
  witness) $H run --label witness --jobs 6 --scenario gpu-witness ;;
  fix)  # FIX_HALF (1, 2 or empty: the whole grid)
    case "${FIX_HALF:-}" in
      1) $H run --label fix1 --jobs 6 --scenario gpu-fix --cells '*save=tp2-etp1-ep2-pp1*' --cells '*save=tp4-etp1-ep8-pp1*' ;;
      2) $H run --label fix2 --jobs 6 --scenario gpu-fix --scenario gpu-world1 \
           --cells '*save=tp1-etp1-ep8-pp1*' --cells '*save=tp2-etp2-ep4-pp1*' --cells 'gpu-world1*' ;;
      "") $H run --label fix --jobs 6 --scenario gpu-fix --scenario gpu-world1 ;;
      *) echo "run.sh fix: FIX_HALF is 1, 2 or empty, not '$FIX_HALF'" >&2; exit 2 ;;
    esac ;;
  cells)  # SCENARIOS and CELLS pick the cells (see the top of this file)
    [ -n "${SCENARIOS:-}" ] || { echo "run.sh cells: name the scenarios in SCENARIOS (commas between)" >&2; exit 2; }
    start=$(date +%s); label=${CELLS_LABEL:-cells}
    precompile python3 "$OUT/precompile.log"
    set -f  # the globs are for harness, not for this shell
    timeout -s TERM ${CELLS_TIMEOUT_S:-540} $H run ${NCCL_SHARED_GPU:+--nccl-shared-gpu} --label $label \
      --jobs ${CELLS_JOBS:-4} $(scenarios) $(c=${CELLS:-}; for g in ${c//,/ }; do echo "--cells $g"; done) > "$OUT/$label.log" 2>&1
    rc=$?; set +f
    echo "cells: rc $rc wall $(( $(date +%s) - start )) s"; grep -E '^- cells:|^results:' "$OUT/$label.log"
    d=$(ls -d $R/*-$label | tail -1); cp "$d/results.json" "$OUT/$label.results.json" 2>/dev/null ;;
  golden) $H run --label golden --jobs 8 --scenario gpu-golden --scenario gpu-golden-witness ;;
  repro)  # timed; also brings back the unpatched TP==ETP checkpoint as a golden candidate
    start=$(date +%s)
    python3 -m harness --results-root $R repro
    echo "repro wall: $(( $(date +%s) - start )) s (imports included)"
    ck=$(ls -d $R/*repro-gpu/saves/gpu-shared-te-none-tp1-etp1-ep8-pp1/ckpt | head -1)
    [ -n "$ck" ] && tar czf "$OUT/golden-0.47.0-tp1-etp1-ep8.tgz" -C "$(dirname "$ck")" ckpt ;;
  repro-modes)  # REPRO_MODES (fresh,pool): make repro's job once per stage mode, timed
    for m in $(echo "${REPRO_MODES:-fresh,pool}" | tr , ' '); do
      start=$(date +%s)
      HARNESS_STAGE_MODE=$m python3 -m harness --results-root $R repro > "$OUT/repro-$m.log" 2>&1
      echo "repro $m: rc $? wall $(( $(date +%s) - start )) s"
    done ;;
  equivalence)  # a warm mode (EQ_MODE: pool, fork) must give fresh's results, cell for cell
    SC=$(SCENARIOS=${EQ_SCENARIOS:-} scenarios gpu-witness)
    for m in fresh ${EQ_MODE:-pool}; do
      start=$(date +%s)
      $H run --label eq-$m --jobs ${EQ_JOBS:-4} --stage-mode $m $SC | tail -4
      echo "$m wall: $(( $(date +%s) - start )) s"
    done
    # the newest pair (run directories start with their time; a queue may run this mode twice)
    python3 -m harness equivalence "$(ls -d $R/*-eq-fresh | tail -1)/results.json" \
      "$(ls -d $R/*-eq-${EQ_MODE:-pool} | tail -1)/results.json" ;;
  test-gpu)  # SHARD=K/N: the K-th of N shards (make test-gpu SHARD=...); files named per shard
    python3 -m pip install -q --no-index --no-deps --target /root/site-test .whl-test/*.whl || exit 2
    export PYTHONPATH=/root/site-test${PYTHONPATH:+:$PYTHONPATH}
    tag=${SHARD:+-shard${SHARD%/*}of${SHARD#*/}}
    precompile python3 "$OUT/precompile$tag.log"  # the MSE cells' FP8 extension, once per host
    start=$(date +%s)
    timeout -s TERM -k 60 ${TEST_GPU_TIMEOUT_S:-2700} make test-gpu PYTEST_WORKERS=${PYTEST_WORKERS:-5} \
      RESULTS=$R SHARD=${SHARD:-} PYTEST_ADDOPTS="-v --durations=30 ${SCENARIOS:+$(scenarios)}" > "$OUT/test-gpu$tag.log" 2>&1
    echo "make test-gpu${SHARD:+ SHARD=$SHARD}: rc $? wall $(( $(date +%s) - start )) s"
    tail -n 40 "$OUT/test-gpu$tag.log"
    cp $R/junit.xml "$OUT/junit-test-gpu$tag.xml" 2>/dev/null ;;
  fix-te)  # the fix's TE unit tests on 0.47.0 and FIX_TE_VERSIONS' others (carry .whl-048, .whl-test)
    python3 -m pip install -q --no-index --no-deps --target /root/site-test .whl-test/*.whl || exit 2
    for v in ${FIX_TE_VERSIONS:-0.47.0 0.48.0rc1}; do
      py=python3
      [ "$v" != 0.47.0 ] && py=$(MATRIX_ENV_MODE=system bash tools/matrix-env.sh "$v" | tail -1)
      PYTHONPATH=/root/site-test${PYTHONPATH:+:$PYTHONPATH} timeout -s TERM -k 30 900 $py -m pytest \
        -p no:cacheprovider -q -rA tests/gpu/test_fix_te.py tests/gpu/test_unloaded_amax.py \
        > "$OUT/fix-te-$v.log" 2>&1
      echo "fix-te $v: rc $?"; grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$OUT/fix-te-$v.log" | tail -n 20
    done ;;
  record)  # RECORD_VERSION empty: buggy and patched metadata of 6 topologies under the wheelhouse's
           # release; else unpatched under that release -> tests/data/recorded/<version>/; 4 dumps at a time
    TOPOS="tp2-etp1-ep2 tp1-etp2-ep1 tp4-etp1-ep8 tp1-etp1-ep8 tp2-etp2-ep4 tp2-etp1-ep1"
    if [ -z "${RECORD_VERSION:-}" ]; then
      for t in $TOPOS; do for p in none fix; do echo "$t $p"; done; done | xargs -P 4 -L 1 bash -c \
        "$H dump-metadata --topology \$0 --patch \$1 --out tests/data/recorded/\$0-\$1.json | tail -3"
      tar czf "$OUT/recorded.tgz" tests/data/recorded
    else
      V=$RECORD_VERSION; PYV=$(MATRIX_ENV_MODE=system bash tools/matrix-env.sh "$V" | tail -1)
      mkdir -p "tests/data/recorded/$V"
      for t in $TOPOS; do echo "$t"; done | xargs -P 4 -I{} bash -c \
        "$PYV -m harness --results-root $R dump-metadata --topology {} --patch none --out tests/data/recorded/$V/{}-none.json | tail -3"
      tar czf "$OUT/recorded-$V.tgz" "tests/data/recorded/$V"
    fi ;;
  matrix)  # MATRIX_VERSIONS (default 0.46.1 0.47.0 0.48.0rc1; carry .whl-046 .whl-048),
           # system mode of tools/matrix-env.sh; the table also lands in $OUT
    MATRIX_ENV_MODE=system MATRIX_BASE_PYTHON=python3 $H matrix \
      $(for v in ${MATRIX_VERSIONS:-0.46.1 0.47.0 0.48.0rc1}; do echo "--modelopt $v"; done)
    cp $R/matrix-*/matrix.md $R/matrix-*/matrix.json "$OUT"/ 2>/dev/null ;;
  pairs)  # 6 pairs at once, each a few cells at a time (16 cores)
    MATRIX_ENV_MODE=system MATRIX_BASE_PYTHON=python3 MATRIX_JOBS=${PAIRS_JOBS:-6} \
      MATRIX_RUN_JOBS=${PAIRS_RUN_JOBS:-2} MATRIX_CELLS_SET=pairs $H matrix \
      $(for v in ${PAIRS_MODELOPT:-0.47.0 0.48.0rc1}; do echo "--modelopt $v"; done) \
      $(for v in ${PAIRS_MCORE:-0.15.3 0.16.1 0.19.2}; do echo "--mcore $v"; done)
    d=$(ls -d $R/matrix-* | tail -1)
    cp "$d/matrix.md" "$d/matrix.json" "$OUT"/ 2>/dev/null
    tar czf "$OUT/pairs-logs.tgz" --exclude='*/ckpt' --exclude='*/reference' --exclude='*/saves' "$d" 2>/dev/null ;;
  recipes)  # the jobs' recipes, RECIPE_PARTS (default 0.47.0-none,0.47.0-fix,0.48.0rc1-none)
    # at once, each bounded by RECIPE_PART_TIMEOUT_S (520); RECIPE_SCENARIOS_<patch> narrows.
    # MSE calibration compiles ModelOpt's modelopt_cuda_ext_fp8 once per ModelOpt version (about
    # 40 s), in that version's own TORCH_EXTENSIONS_DIR (harness/launch/extensions.py): each part
    # does it first, so no stage pays it inside its timeout. Carry .whl-048.
    mkdir -p $R
    WIT=${RECIPE_SCENARIOS_none:-gpu-ultra-recipe-witness,gpu-ultra-modules-witness,gpu-nano-recipe-witness,gpu-super-recipe-witness}
    FIX=${RECIPE_SCENARIOS_fix:-gpu-ultra-recipe,gpu-nano-recipe,gpu-modules}
    recipe_part() {  # <modelopt>-<patch>[-mc<megatron-core>], e.g. 0.48.0rc1-none-mc0.16.1
      local part=$1 v=${1%%-*} rest=${1#*-} py=python3 sc=$WIT start=$(date +%s)
      local patch=${rest%%-*} mc=
      local -; set -f  # RECIPE_CELLS holds globs for harness, not for the shell
      [ "$rest" != "$patch" ] && mc=${rest#*-mc}
      if [ "$v" != 0.47.0 ] || [ -n "$mc" ]; then  # the wheelhouse has 0.47.0 + megatron-core 0.19.2
        py=$(MATRIX_ENV_MODE=system MATRIX_MCORE=$mc bash tools/matrix-env.sh "$v" | tail -1)
        [ -x "$py" ] || { echo "$part: no environment (tools/matrix-env.sh)"; return 1; }
      fi
      [ "$patch" = fix ] && sc=$FIX
      [ "${RECIPE_PRECOMPILE:-1}" = 1 ] && precompile "$py" "$R/precompile-$part.log"
      timeout -s TERM ${RECIPE_PART_TIMEOUT_S:-520} $py -m harness --results-root $R run \
        --label ${RECIPE_LABEL:-recipes}-$part --jobs ${RECIPE_JOBS:-3} $(SCENARIOS=$sc scenarios) $(c=${RECIPE_CELLS:-}; for g in ${c//,/ }; do echo "--cells $g"; done) > "$OUT/recipes-$part.log" 2>&1
      echo "$part: rc $? wall $(( $(date +%s) - start )) s"; grep -E '^- cells:' "$OUT/recipes-$part.log"
    }
    PIDS=()
    for part in $(echo "${RECIPE_PARTS:-0.47.0-none,0.47.0-fix,0.48.0rc1-none}" | tr , ' '); do
      recipe_part "$part" & PIDS+=($!)
    done
    wait_jobs "${PIDS[@]}" ;;
  sample)
    PY048=$(MATRIX_ENV_MODE=system bash tools/matrix-env.sh 0.48.0rc1 | tail -1)
    T=${SAMPLE_PART_TIMEOUT_S:-280}
    SL=${SAMPLE_SLICE:+--slice $SAMPLE_SLICE}; TAG=${SAMPLE_SLICE:+-slice${SAMPLE_SLICE//\//of}}
    sample_part() {  # one part, bounded; its log in $OUT
      local part=$1 start=$(date +%s) py=python3 log
      [ "$part" = 0.48.0rc1 ] && part=0.48.0rc1-none
      log="$OUT/sample-$part$TAG.log"; [ "$part" = cross ] && log="$OUT/sample-cross.log"
      case "$part" in
        cross)
          timeout -s TERM $T $PY048 -m harness --results-root $R run --label cross-topology-0.48.0rc1 \
            --jobs 4 --scenario gpu-cross-topology --scenario gpu-cross-topology-8 > "$log" 2>&1 ;;
        0.48.0rc1-none|0.47.0-fix|0.47.0-none)
          [ "${part%-*}" = 0.48.0rc1 ] && py=$PY048
          # SAMPLE_LIBRARY: recipes and modules drawn from that release's library; the
          # extensions its recipes may need built first (HARNESS_PRECOMPILE_EXTENSIONS)
          [ -n "${SAMPLE_LIBRARY:-}" ] && [ "$RECIPE_PRECOMPILE" = 1 ] && precompile "$py" "$R/precompile-$part.log"
          timeout -s TERM $T $py -m harness --results-root $R sample --seed ${SAMPLE_SEED:-25} \
            ${SAMPLE_LIBRARY:+--library $SAMPLE_LIBRARY} \
            --cells ${SAMPLE_CELLS:-50} --loads-per-save ${SAMPLE_LOADS_PER_SAVE:-5} $SL \
            ${SAMPLE_RANKS:+--ranks $SAMPLE_RANKS} \
            --jobs ${SAMPLE_JOBS:-4} --patch ${part##*-} --label sample-$part$TAG > "$log" 2>&1 ;;
        *) echo "run.sh sample: unknown part '$part' (cross, 0.48.0rc1, 0.47.0-fix, 0.47.0-none)" >&2
           return 2 ;;
      esac
      echo "$part$TAG: rc $? wall $(( $(date +%s) - start )) s"; grep -E '^- cells:' "$log"
    }
    # SAMPLE_CONCURRENT=1: the parts at once (the save and load waves of one part leave cores idle)
    PIDS=()
    for part in $(echo "${SAMPLE_PARTS:-cross,0.48.0rc1,0.47.0-fix,0.47.0-none}" | tr , ' '); do
      if [ "${SAMPLE_CONCURRENT:-0}" = 1 ]; then sample_part "$part" & PIDS+=($!); else sample_part "$part"; fi
    done
    wait_jobs "${PIDS[@]}" ;;
  mamba)
    T=/root/site-mamba W=${MAMBA_WHEEL_DIR:-/root/mamba-wheels}; mkdir -p $T $W; start=$(date +%s)
    export PATH=$T/bin:$PATH PYTHONPATH=$T${PYTHONPATH:+:$PYTHONPATH}
    if ls .whl-mamba/built/mamba_ssm-*.whl .whl-mamba/built/causal_conv1d-*.whl .whl-mamba/einops-*.whl > /dev/null 2>&1; then
      # compiled on an earlier lease for this host's torch and GPU (`mamba-wheels` brought them back)
      python3 -m pip install --no-deps --no-index --target $T .whl-mamba/einops-*.whl .whl-mamba/built/*.whl > "$OUT/mamba-build.log" 2>&1
      echo "mamba: the carried built wheels installed (.whl-mamba/built), rc $?, no compile"
    else
      ls .whl-mamba/*.tar.gz .whl-mamba/ninja-*.whl .whl-mamba/einops-*.whl > /dev/null || {
        echo "run.sh mamba: carry .whl-mamba (tools/gpu-host/stage-mamba.sh), or its built/ wheels and einops" >&2; exit 2; }
      # ninja first: torch's cpp_extension takes PYTORCH_NVCC (one architecture, nvcc-one-arch.sh)
      # only on its ninja path; without ninja it would compile 8 architectures one file at a time
      python3 -m pip install --no-deps --no-index --target $T .whl-mamba/ninja-*.whl > "$OUT/mamba-build.log" 2>&1
      python3 -c "from torch.utils.cpp_extension import is_ninja_available as n; assert n()" || { echo "run.sh mamba: ninja not usable from $T" >&2; exit 1; }
      export CUDA_HOME=$(python3 -c "from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME)")
      export NVCC_ONE_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
      export PYTORCH_NVCC=$PWD_ROOT/tools/gpu-host/nvcc-one-arch.sh
      echo "mamba build: CUDA_HOME $CUDA_HOME, sm_$NVCC_ONE_ARCH only, MAX_JOBS ${MAMBA_MAX_JOBS:-12}"
      # each sdist built into a wheel in $W (kept for `mamba-wheels`), then installed; causal-conv1d
      # first: mamba-ssm's build looks for it. No registry here: --no-index.
      MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAMBA_MAX_JOBS:-12} \
        timeout -s TERM ${MAMBA_BUILD_TIMEOUT_S:-1500} bash -c 'python3 -m pip install --no-deps --no-index --target '"$T"' .whl-mamba/einops-*.whl || exit 1
          for s in .whl-mamba/causal_conv1d-*.tar.gz .whl-mamba/mamba_ssm-*.tar.gz; do
            python3 -m pip wheel -v --no-deps --no-build-isolation --no-index -w '"$W"' "$s" || exit 1
            n=$(basename "$s" .tar.gz); python3 -m pip install --no-deps --no-index --target '"$T"' '"$W"'/${n%%-*}-*.whl || exit 1
          done' >> "$OUT/mamba-build.log" 2>&1
      echo "mamba build: rc $? wall $(( $(date +%s) - start )) s; wheels in $W: $(cd $W && ls -s --block-size=M *.whl 2>/dev/null | tr '\n' ' ')"
      tail -n 3 "$OUT/mamba-build.log"
    fi
    python3 -c "import mamba_ssm, causal_conv1d; print('mamba-ssm', mamba_ssm.__version__, '| causal-conv1d', causal_conv1d.__version__)" || exit 1
    # the hybrid cells per MAMBA_PARTS (<modelopt>-<patch>[-mc<megatron-core>], as recipes' parts;
    # the Nano recipe needs no FP8 extension), with /root/site-mamba on every part's PYTHONPATH
    RECIPE_PARTS=${MAMBA_PARTS:-0.47.0-none,0.47.0-fix,0.48.0rc1-none} RECIPE_SCENARIOS_none=gpu-nano-hybrid-witness \
      RECIPE_SCENARIOS_fix=gpu-nano-hybrid RECIPE_PRECOMPILE=0 RECIPE_LABEL=hybrid RECIPE_JOBS=${MAMBA_JOBS:-3} \
      RECIPE_PART_TIMEOUT_S=${MAMBA_PART_TIMEOUT_S:-600} bash "$0" recipes
    # the wheels compiled on this lease into $OUT, for the next lease to carry (at most 16 MiB a
    # file comes back: larger ones in parts, joined by tools/gpu-host/stage-mamba.sh --built DIR)
    rc=$?; W=${MAMBA_WHEEL_DIR:-/root/mamba-wheels}
    for f in $W/*.whl; do
      [ -f "$f" ] || continue
      if [ $(stat -c %s "$f") -le $((15 * 1024 * 1024)) ]; then cp "$f" "$OUT/"
      else split -b 15M -d "$f" "$OUT/$(basename "$f").part"; fi
    done
    exit $rc ;;
  upstream)  # each reproducer copied outside the repository; logs upstream-<finding>-<label>.log
    OUT="$OUT" timeout -s TERM 900 bash upstream/run-on-gpu-host.sh ;;
  *) echo "run.sh: unknown mode '${1:-}' (the modes are listed at the top of tools/gpu-host/run.sh)" >&2
     exit 2 ;;
esac
