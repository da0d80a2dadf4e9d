#!/usr/bin/env bash
# Development runs on a lent GPU host (docs/gpu-host.md). Assumes a GPU wheelhouse is
# installed under /root/site with its env.sh at /root/gw/base. Usage: run.sh <what> ; results -> $OUT.
#   smoke      a few witness + fix cells, the TE unit test, two metadata recordings
#   witness    the full unpatched grid (gpu-shared)
#   fix1, fix2 the patched grid (gpu-shared) in two halves (one call each) + world-1 on tier gpu
#   record     metadata recordings for tests/data/recorded (buggy and patched)
#   repro      make repro (timed)
#   golden     the golden checkpoints (tests/golden) loaded patched and unpatched
#   nano       the Nano QAD fix cell three times concurrently (its logits anomaly in fix2)
#   routing    the Nano cell + a passing tp4-etp1-ep8 load, router selections compared
#   matrix     the decisive cells per modelopt version (MATRIX_VERSIONS), wheels carried
#   pairs      the deciding cells per (modelopt, megatron-core) pair: PAIRS_MODELOPT (default
#              0.47.0 0.48.0rc1) x PAIRS_MCORE (default 0.15.3 0.16.1 0.19.2); carry .whl-048
#              .whl-mc0153 .whl-mc0161 (py3.12 manylinux wheels, installed with --target first
#              on PYTHONPATH); the 2-D table and the records land in $OUT
#   record-next  metadata recordings under a later release (RECORD_VERSION)
#   pipeline   pp2 saves and loads at 128 experts, patched and unpatched (gpu-pipeline*)
#   shape-nano, shape-ultra  the quarantined jobs at their production parallel shapes (8/16 ranks)
#   profile    where a rank's import time goes (bench/import_profile.py), 1 and 8 at once, and
#              without the packages in TRIM
#   equivalence  EQ_SCENARIOS (default gpu-witness; a,b for several) fresh, then with --stage-mode pool, compared
#   recipes    issue 38: the jobs' recipes (gpu-*-recipe*) under 0.47.0 unpatched and patched and
#              0.48.0rc1 unpatched, at once (RECIPE_PARTS); carry .whl-048
#              RECIPE_PARTS items are <modelopt>-<patch>[-mc<megatron-core>] (carry .whl-mc<digits>)
#              and RECIPE_CELLS narrows to cell-id globs, separated by commas (a comma inside a
#              cell id: write ? there; a queue.sh entry splits on spaces)
#   nccl-probe issue 42: 2/4/8 NCCL ranks on one GPU with per-rank NCCL_HOSTID (+ the control);
#              PROBE_GATHERS=K times K all_gather_object calls over NCCL and over gloo (the cost of
#              ModelOpt's calibration check per quantizer), PROBE_CHECKPOINT=0 skips the save/load
#   nccl-teardown  issue 42 item 3: NCCL ranks sharing the GPU; bench/teardown.py --nccl-shared-gpu
#              (peers waiting in an all_reduce) at TEARDOWN_WORLDS (2 4 8; `none`: no bench), then gpu-nccl-teardown
#              (worlds 2, 4, 8) once per TEARDOWN_INJECT item (raise during save, during load,
#              hang; `none`: the bench only); TEARDOWN_KINDS narrows the bench's kinds and
#              TEARDOWN_RANKS picks its injected ranks (bench --inject-ranks, e.g. `last`); the
#              table (tools/gpu-host/teardown_table.py) and what is left afterwards
#   nccl-cells issue 42 item 4: witness and fix cells (report, Nano, Ultra recipe) run with
#              --nccl-shared-gpu, to compare with their gloo runs (equivalence --outcomes-only)
#   mamba      issue 38 item 2: compile requirements/mamba.txt's sdists (carry .whl-mamba, staged by
#              tools/gpu-host/stage-mamba.sh) with the host's nvcc, for the host GPU's architecture
#              only (tools/gpu-host/nvcc-one-arch.sh), into /root/site-mamba, bounded by
#              MAMBA_BUILD_TIMEOUT_S (1500; 683 s on the H100's 16 cores), import them, then
#              run the hybrid scenarios (gpu-nano-hybrid-witness unpatched, gpu-nano-hybrid with
#              the fix) as recipes' MAMBA_PARTS (default 0.47.0-none,0.47.0-fix,0.48.0rc1-none,
#              at once, each bounded by MAMBA_PART_TIMEOUT_S, 600) with that dir on PYTHONPATH.
#   mamba-wheels  the wheels `mamba` compiled on this lease, into $OUT (15 MiB parts): carried
#              back as .whl-mamba/built (tools/gpu-host/stage-mamba.sh --built), the next `mamba`
#              installs them instead of compiling (683 s on 16 cores)
#   test-gpu   issue 51: the nightly job's own command, `make test-gpu` (every gpu and gpu_shared
#              item under pytest-xdist, PYTEST_WORKERS (5) workers), with the test runner of
#              requirements/test.txt from a carried .whl-test (installed first on PYTHONPATH; the
#              host's own pytest is refused by conftest.py); bounded by TEST_GPU_TIMEOUT_S (2700):
#              SIGTERM then, the cells stop and pytest writes its JUnit file; the log and the
#              JUnit file (per test: file, id, seconds, outcome) land in $OUT. SCENARIOS (commas)
#              narrows the cells to those scenarios (`--scenario`; tests/gpu still runs)
#   pause      sleep PAUSE_S (60): a second queue's first entry, so its load misses a timing
#   repro-modes  make repro fresh, then with HARNESS_STAGE_MODE=pool, both timed
#   sample     issue 25, SAMPLE_PARTS (default cross,0.48.0rc1,0.47.0-fix,0.47.0-none; commas):
#              cross: gpu-cross-topology (4 layers, 64 experts) and its 8-expert twin under
#              0.48.0rc1 unpatched, with the noise-floor figures; <version>-<patch>: SAMPLE_CELLS
#              (50) cells of `harness sample --seed SAMPLE_SEED` (25), SAMPLE_LOADS_PER_SAVE (5)
#              loads per save, --jobs SAMPLE_JOBS (4); each part bounded by SAMPLE_PART_TIMEOUT_S
#              (280; SIGTERM: the run writes its results marked incomplete); SAMPLE_SLICE=K/N runs
#              the K-th slice of the draw (whole saves); SAMPLE_CONCURRENT=1 runs the parts at once.
#              Carry .whl-048.
#   repro-compare  make repro of an older checkout (OLD_TREE, default .gpu/old: `git archive <commit>`
#              unpacked there, carried), of this one, and of this one with HARNESS_RANK_TRIM=$TRIM,
#              each timed (harness clock and wall), the same outcomes checked (bench/repro_compare.py)
#   repair     issue 26: repair re-run here on the 0.46.1 and novalidate goldens; the committed
#              repaired goldens loaded by UNPATCHED 0.48.0rc1 (carry .whl-048) at 3 topologies (gpu-golden-repaired),
#              and each one's logits vs a model calibrated fresh (tools/gpu-host/repair_logits.py)
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
for s in SAMPLE_CONCURRENT=off RECIPE_PRECOMPILE=on WARM=on PROBE_CHECKPOINT=on; do
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
  # SCENARIOS narrows a mode to some of its scenarios (e.g. only the patched one of a re-run)
  pipeline) $H run --label pipeline --jobs 4 $(scenarios gpu-pipeline gpu-pipeline-witness) ;;
  shape-nano) $H run --label shape-nano --jobs 2 $(scenarios gpu-nano-shape gpu-nano-shape-witness) ;;
  shape-ultra) $H run --label shape-ultra --jobs 2 $(scenarios gpu-ultra-shape gpu-ultra-shape-witness) ;;
  equivalence)  # issues 14, 55: a warm mode (EQ_MODE: pool, fork) must give fresh's results, cell for cell
    SC=$(SCENARIOS=${EQ_SCENARIOS:-} scenarios gpu-witness)
    for m in fresh ${EQ_MODE:-pool}; do
      start=$(date +%s)
      $H run --label eq-$m --jobs ${EQ_JOBS:-4} --stage-mode $m $SC | tail -4
      echo "$m wall: $(( $(date +%s) - start )) s"
    done
    # the newest pair (run directories start with their time; a queue may run this mode twice)
    python3 -m harness equivalence "$(ls -d $R/*-eq-fresh | tail -1)/results.json" \
      "$(ls -d $R/*-eq-${EQ_MODE:-pool} | tail -1)/results.json" ;;
  fork-bench)  # issue 55: bench/fork.py on this host's tier (FORK_SCENARIO, gpu-fix: its cells pass), every mode
    python3 bench/fork.py --scenario ${FORK_SCENARIO:-gpu-fix} --cells ${FORK_CELLS:-3} \
      --modes ${FORK_MODES:-fresh,pool,fork} > "$OUT/fork-bench.md" 2>&1
    echo "fork-bench: rc $?"; tail -n 30 "$OUT/fork-bench.md" ;;
  fork-probe)  # issue 55: which preload import poisons forked ranks' CUDA, with and without NVML's check
    for nvml in "" 1; do
      PYTORCH_NVML_BASED_CUDA_CHECK=$nvml timeout 120 python3 tools/gpu-host/fork_probe.py gpu-shared 2>&1 | grep '^{'
    done
    start=$(date +%s)
    HARNESS_STAGE_MODE=fork timeout 300 python3 -m harness --results-root $R repro > "$OUT/repro-fork.log" 2>&1
    echo "repro fork: rc $? wall $(( $(date +%s) - start )) s"; grep -E "refuses|repro finished|cells:" "$OUT/repro-fork.log" | head ;;
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
          timeout -s TERM $T $py -m harness --results-root $R sample --seed ${SAMPLE_SEED:-25} \
            --cells ${SAMPLE_CELLS:-50} --loads-per-save ${SAMPLE_LOADS_PER_SAVE:-5} $SL \
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
  recipes)  # issue 38: the jobs' recipes, RECIPE_PARTS (default 0.47.0-none,0.47.0-fix,0.48.0rc1-none)
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
  nccl-probe)  # issue 42 item 1: NCCL ranks on ONE GPU, each with its own NCCL_HOSTID
    P=$R/nccl-probe; mkdir -p $P  # packed into results-nccl-probe.tgz ($OUT takes 8 files)
    for n in ${PROBE_WORLDS:-2 4 8}; do
      for mode in hostid control; do
        [ $mode = control ] && [ $n != 2 ] && continue  # the refusal needs showing once
        start=$(date +%s)
        timeout -s TERM ${PROBE_TIMEOUT_S:-150} python3 -m torch.distributed.run --nproc-per-node $n \
          --rdzv-endpoint localhost:0 --rdzv-backend c10d tools/gpu-host/nccl_probe.py $mode \
          "$P/world$n-$mode.json" > "$P/world$n-$mode.log" 2>&1
        echo "nccl probe world $n $mode: rc $? wall $(( $(date +%s) - start )) s"
        grep -h '^{' "$P/world$n-$mode.log" | sort | uniq -c | head -4
        grep -h -m2 -E 'Duplicate GPU|NCCL error|ncclRemoteError|Error' "$P/world$n-$mode.log" | cut -c1-300
      done
    done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 | tee $P/after.txt ;;
  nccl-teardown)
    P=$R/nccl-teardown; mkdir -p $P
    BENCH_WORLDS=${TEARDOWN_WORLDS:-2 4 8}; [ "$BENCH_WORLDS" = none ] && BENCH_WORLDS=  # the harness's runs only
    PIDS=()
    for n in $BENCH_WORLDS; do
      PYTHONPATH=$PWD_ROOT${PYTHONPATH:+:$PYTHONPATH} timeout -s TERM ${TEARDOWN_BENCH_TIMEOUT_S:-200} \
        python3 bench/teardown.py --nccl-shared-gpu --nproc $n --count ${TEARDOWN_COUNT:-1} \
        --kinds ${TEARDOWN_KINDS:-raise,sigkill,hang} --pg-timeout 10 ${TEARDOWN_RANKS:+--inject-ranks $TEARDOWN_RANKS} \
        --keep-missed "$P/missed-world$n" > "$P/bench-world$n.log" 2>&1 & PIDS+=($!)
    done; wait_jobs "${PIDS[@]}"
    # the rows as before, then each missed guarded run (the runs' lines start with two spaces;
    # a missed run's stage directory is in $P/missed-world$n/, packed below)
    for n in $BENCH_WORLDS; do echo "== bench world $n"; grep -v '^  ' "$P/bench-world$n.log" | tail -n 12
      grep '^  run [a-z]* guard .*right no$' "$P/bench-world$n.log" | cut -c1-220; done
    # TEARDOWN_INJECT: HARNESS_INJECT values separated by commas
    I=${TEARDOWN_INJECT:-raise:1:before_save,raise:1:before_load,hang:1:before_save}
    [ "$I" = none ] && I=  # the bench only
    for inj in ${I//,/ }; do
      name=$(echo "$inj" | tr : -) start=$(date +%s)
      timeout -s TERM ${TEARDOWN_RUN_TIMEOUT_S:-240} env HARNESS_INJECT="$inj" HARNESS_PG_TIMEOUT_S=30 \
        $H run --label nccl-teardown-$name --jobs 3 --scenario gpu-nccl-teardown > "$P/$name.log" 2>&1
      echo "$inj: rc $? wall $(( $(date +%s) - start )) s"
    done
    [ -n "$I" ] && PYTHONPATH=$PWD_ROOT${PYTHONPATH:+:$PYTHONPATH} python3 tools/gpu-host/teardown_table.py $(for d in $R/*-nccl-teardown-*/; do d=${d%/}; echo "${d##*nccl-teardown-}=$d/results.json"; done) | tee "$OUT/teardown-table.md"
    echo "rank processes left: $(pgrep -fc 'harness.rank|rank_programs' || true)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 | tee "$P/after.txt"
    tar czf "$OUT/nccl-teardown.tgz" --exclude='*/ckpt' --exclude='*/reference' $R/*-nccl-teardown-* $P 2>/dev/null ;;
  nccl-cells)  # NCCL_CELLS: cell-id globs, commas between (a comma inside an id: ?)
    start=$(date +%s)
    NCCL_CELLS=${NCCL_CELLS:-'*[save=tp2-etp1-ep2-pp1?save-only]','*[save=tp1-etp1-ep8-pp1?load=tp4-etp1-ep8-pp1]','*[save=tp4-etp1-ep8-pp1?save-only]','gpu-ultra-recipe*[save=tp4-etp1-ep8-pp1?load=tp2-etp?-ep4-pp1]'}
    precompile python3 "$OUT/precompile.log"
    set -f  # the globs are for harness, not for this shell
    timeout -s TERM ${NCCL_CELLS_TIMEOUT_S:-540} $H run --nccl-shared-gpu --label nccl-cells --jobs ${NCCL_JOBS:-3} \
      --scenario gpu-witness --scenario gpu-fix --scenario gpu-nano-shape --scenario gpu-nano-shape-witness \
      --scenario gpu-ultra-recipe --scenario gpu-ultra-recipe-witness \
      $(for g in ${NCCL_CELLS//,/ }; do echo "--cells $g"; done) > "$OUT/nccl-cells.log" 2>&1
    rc=$?; set +f
    echo "nccl-cells: rc $rc wall $(( $(date +%s) - start )) s"; grep -E '^- cells:|^results:' "$OUT/nccl-cells.log"
    d=$(ls -d $R/*-nccl-cells | tail -1); cp "$d/results.json" "$OUT/nccl-cells.results.json"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 ;;
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
      RECIPE_PART_TIMEOUT_S=${MAMBA_PART_TIMEOUT_S:-600} bash "$0" recipes ;;
  mamba-wheels)  # the wheels `mamba` compiled, into $OUT (at most 16 MiB a file comes back:
    # larger ones in parts, joined here by tools/gpu-host/stage-mamba.sh --built DIR)
    W=${MAMBA_WHEEL_DIR:-/root/mamba-wheels}
    ls $W/*.whl > /dev/null || { echo "run.sh mamba-wheels: nothing in $W (run.sh mamba first, on this lease)" >&2; exit 2; }
    for f in $W/*.whl; do
      if [ $(stat -c %s "$f") -le $((15 * 1024 * 1024)) ]; then cp "$f" "$OUT/"
      else split -b 15M -d "$f" "$OUT/$(basename "$f").part"; fi
    done; ls -la "$OUT" ;;
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
  pause)  # PAUSE_S (60): a queue's first entry, to keep its CPU load off the other queue's timing
    sleep ${PAUSE_S:-60} ;;
  repro-modes)  # REPRO_MODES (fresh,pool): make repro's job once per stage mode, timed
    for m in $(echo "${REPRO_MODES:-fresh,pool}" | tr , ' '); do
      start=$(date +%s)
      HARNESS_STAGE_MODE=$m python3 -m harness --results-root $R repro > "$OUT/repro-$m.log" 2>&1
      echo "repro $m: rc $? wall $(( $(date +%s) - start )) s"
    done ;;
  repro-compare)  # issue 23; SIDES narrows (default "old new trim"), WARM=0 skips the warm-up
    OLD_TREE=${OLD_TREE:-.gpu/old}
    [ -f "$OLD_TREE/harness/__main__.py" ] || {
      echo "repro-compare: no harness snapshot in $OLD_TREE (mkdir -p $OLD_TREE && git archive <commit> | tar -x -C $OLD_TREE)" >&2; exit 2; }
    # do the ranks find compiled bytecode, or compile the stack in every interpreter?
    python3 - <<'PY'
import importlib.util, os, sys
from pathlib import Path
tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
for name in ("torch", "transformer_engine", "megatron", "modelopt", "transformers"):
    spec = importlib.util.find_spec(name)
    dirs = [Path(d) for d in (spec.submodule_search_locations or [])] if spec else []
    py = sum(1 for d in dirs for _ in d.rglob("*.py"))
    pyc = sum(1 for d in dirs for _ in d.rglob(f"*.{tag}.pyc"))
    print(f"bytecode {name}: {py} .py, {pyc} .{tag}.pyc, writable {all(os.access(d, os.W_OK) for d in dirs)}")
print("PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"),
      "PYTHONPYCACHEPREFIX", os.environ.get("PYTHONPYCACHEPREFIX"))
PY
    # the stack's files in the page cache before the first side, so no side pays a cold read
    [ "${WARM:-1}" = 0 ] || python3 -c "import time; t = time.time(); import transformer_engine.pytorch, megatron.core, modelopt.torch.quantization; print(f'warm-up import {time.time() - t:.1f} s')"
    sides=()
    for side in ${SIDES:-old new trim}; do
      case $side in
        old) sides+=(--side old "$OLD_TREE" HARNESS_RANK_TRIM=) ;;
        new) sides+=(--side new . HARNESS_RANK_TRIM=) ;;
        trim) sides+=(--side trim . "HARNESS_RANK_TRIM=${TRIM:-transformers,torchvision,numba}") ;;
        *) echo "repro-compare: unknown side '$side' (old, new, trim)" >&2; exit 2 ;;
      esac
    done
    python3 bench/repro_compare.py --run "$OUT" --results-root "$PWD_ROOT/$R" "${sides[@]}" \
      | tee "$OUT/repro-compare.md" ;;
  profile)
    python3 bench/import_profile.py --repeats 2 --json "$OUT/import-profile.json"
    python3 bench/import_profile.py --repeats 1 --concurrent 8 --json "$OUT/import-profile-x8.json"
    # trimming (issue 14): can the stack import without packages a stage never uses?
    python3 bench/import_profile.py --repeats 2 --block ${TRIM:-transformers,torchvision,numba} \
      --json "$OUT/import-profile-trimmed.json" ;;
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
  fix1) $H run --label fix1 --jobs 6 --scenario gpu-fix \
      --cells '*save=tp2-etp1-ep2-pp1*' --cells '*save=tp4-etp1-ep8-pp1*' ;;
  fix2) $H run --label fix2 --jobs 6 --scenario gpu-fix --scenario gpu-world1 \
      --cells '*save=tp1-etp1-ep8-pp1*' --cells '*save=tp2-etp2-ep4-pp1*' --cells 'gpu-world1*' ;;
  golden) $H run --label golden --jobs 8 --scenario gpu-golden --scenario gpu-golden-witness ;;
  nano)  # the Nano QAD cell (save tp1-etp1-ep8 -> load tp4-etp1-ep8, patched) three times at once
    PIDS=()
    for i in 1 2 3; do
      $H run --label nano$i --jobs 2 --scenario gpu-fix \
        --cells 'gpu-fix[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]' > "$OUT/nano$i.log" 2>&1 & PIDS+=($!)
    done; wait_jobs "${PIDS[@]}"; tail -n 8 "$OUT"/nano*.log ;;
  routing)  # the Nano cell and a passing tp4-etp1-ep8 load, with router selections recorded
    $H run --label routing --jobs 4 --scenario gpu-fix \
      --cells 'gpu-fix[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]' \
      --cells 'gpu-fix[save=tp2-etp2-ep4-pp1,load=tp4-etp1-ep8-pp1]' ;;
  matrix)  # MATRIX_VERSIONS (default 0.46.1 0.47.0 0.48.0rc1; carry .whl-046 .whl-048),
           # system mode of tools/matrix-env.sh; the table also lands in $OUT
    MATRIX_ENV_MODE=system MATRIX_BASE_PYTHON=python3 $H matrix \
      $(for v in ${MATRIX_VERSIONS:-0.46.1 0.47.0 0.48.0rc1}; do echo "--modelopt $v"; done)
    cp $R/matrix-*/matrix.md $R/matrix-*/matrix.json "$OUT"/ 2>/dev/null ;;
  pairs)  # issue 24: 6 pairs at once, each a few cells at a time (16 cores)
    MATRIX_ENV_MODE=system MATRIX_BASE_PYTHON=python3 MATRIX_JOBS=${PAIRS_JOBS:-6} \
      MATRIX_RUN_JOBS=${PAIRS_RUN_JOBS:-2} MATRIX_CELLS_SET=pairs $H matrix \
      $(for v in ${PAIRS_MODELOPT:-0.47.0 0.48.0rc1}; do echo "--modelopt $v"; done) \
      $(for v in ${PAIRS_MCORE:-0.15.3 0.16.1 0.19.2}; do echo "--mcore $v"; done)
    d=$(ls -d $R/matrix-* | tail -1)
    cp "$d/matrix.md" "$d/matrix.json" "$OUT"/ 2>/dev/null
    tar czf "$OUT/pairs-logs.tgz" --exclude='*/ckpt' --exclude='*/reference' --exclude='*/saves' "$d" 2>/dev/null ;;
  record-next)  # unpatched metadata under a later release (RECORD_VERSION, default 0.48.0rc1;
                # carry its .whl-<digits>) -> tests/data/recorded/<version>/
    V=${RECORD_VERSION:-0.48.0rc1}
    PYV=$(MATRIX_ENV_MODE=system bash tools/matrix-env.sh "$V" | tail -1)
    mkdir -p "tests/data/recorded/$V"
    for t in tp2-etp1-ep2 tp1-etp2-ep1 tp4-etp1-ep8 tp1-etp1-ep8 tp2-etp2-ep4 tp2-etp1-ep1; do
      echo "$t"; done | xargs -P 4 -I{} bash -c \
      "$PYV -m harness --results-root $R dump-metadata --topology {} --patch none --out tests/data/recorded/$V/{}-none.json | tail -3"
    tar czf "$OUT/recorded-$V.tgz" "tests/data/recorded/$V" ;;
  record)  # buggy and patched metadata of 6 topologies, 4 dumps at a time
    for t in tp2-etp1-ep2 tp1-etp2-ep1 tp4-etp1-ep8 tp1-etp1-ep8 tp2-etp2-ep4 tp2-etp1-ep1; do
      for p in none fix; do echo "$t $p"; done
    done | xargs -P 4 -L 1 bash -c \
      "$H dump-metadata --topology \$0 --patch \$1 --out tests/data/recorded/\$0-\$1.json | tail -3"
    tar czf "$OUT/recorded.tgz" tests/data/recorded ;;
  repro)  # timed; also brings back the unpatched TP==ETP checkpoint as a golden candidate
    start=$(date +%s)
    python3 -m harness --results-root $R repro
    echo "repro wall: $(( $(date +%s) - start )) s (imports included)"
    ck=$(ls -d $R/*repro-gpu/saves/gpu-shared-te-none-tp1-etp1-ep8-pp1/ckpt | head -1)
    [ -n "$ck" ] && tar czf "$OUT/golden-0.47.0-tp1-etp1-ep8.tgz" -C "$(dirname "$ck")" ckpt ;;
  repair)
    PYV=$(MATRIX_ENV_MODE=system MATRIX_WHEEL_DIR=.whl-048 bash tools/matrix-env.sh 0.48.0rc1 | tail -1)
    for g in modelopt-0.46.1-tp1-etp1-ep8 modelopt-0.47.0-tp2-etp1-ep2-novalidate; do
      # repair runs on this host too (log + inspect come back; tests/test_repair.py checks the
      # committed repaired goldens equal what repair writes, tensor for tensor)
      mkdir -p "$R/again-$g"
      timeout 300 python3 -m harness repair tests/golden/$g/ckpt "$R/again-$g/ckpt" > "$OUT/repair-$g.log" 2>&1
      echo "repair $g: rc $?"
      timeout 120 python3 -m harness inspect --json "$R/again-$g/ckpt" > "$R/again-$g/inspect.json"
      timeout 300 $PYV -m torch.distributed.run --nproc-per-node 1 tools/gpu-host/repair_logits.py \
        "tests/golden/$g-repaired" "$OUT/logits-$g-repaired.json" > "$R/logits-$g.log" 2>&1
      echo "logits $g-repaired: rc $?"; tail -n 30 "$R/logits-$g.log"
    done
    $PYV -m harness --results-root $R run --label repaired --jobs 3 --scenario gpu-golden-repaired ;;
  *) echo "run.sh: unknown mode '${1:-}' (the modes are listed at the top of tools/gpu-host/run.sh)" >&2
     exit 2 ;;
esac
tar czf "$OUT/results-$1.tgz" --exclude='*/ckpt' --exclude='*/reference' $R 2>/dev/null
ls -la "$OUT"
