#!/usr/bin/env bash
# One Python environment per ModelOpt version for `make matrix` (harness/run/matrix.py).
#   tools/matrix-env.sh <version-or-git-ref>      -> prints the env's python on stdout
#
# CPU machines (default, MATRIX_ENV_MODE=layer): .venv-modelopt-<V> is a thin venv LAYERED on
# .venv: it sees .venv's site-packages (torch CPU, megatron-core, ...) through a .pth file and
# holds only nvidia-modelopt==<V> (--no-deps) in its own site-packages, which comes first on
# sys.path. Why: requirements/cpu.in differs between versions only in the modelopt pin, and a
# full install re-resolves a multi-GB stack; the layer takes seconds. MATRIX_ENV_MODE=full
# builds a standalone venv from requirements/cpu.in with the pin replaced instead (minutes; pip
# resolves that version's dependencies afresh: cpu.lock holds 0.47.0's).
#   Local wheels: a wheel in .whl-<V> (e.g. `pip download --no-deps nvidia-modelopt==0.46.1
#   -d .whl-046`) is used offline; name the dir in MATRIX_WHEEL_DIR, or it tries .whl-<digits>.
# GPU hosts with the stack on the system python / PYTHONPATH and no registry (the lent H200:
# wheelhouse under /root/site), MATRIX_ENV_MODE=system: no venv. .venv-modelopt-<V>/bin/python
# is a wrapper putting .venv-modelopt-<V>/site FIRST on PYTHONPATH (PYTHONPATH entries precede
# every site-packages, so a venv could not shadow the wheelhouse) and exec'ing the host python
# (MATRIX_BASE_PYTHON, default python3); ranks inherit PYTHONPATH. The version's wheel comes
# from .whl-<V> (offline); a version the host already has gets an empty site dir.
# A local wheel: tools/matrix-env.sh path/to/nvidia_modelopt-<V>-py3-none-any.whl (offline).
# A git ref: tools/matrix-env.sh git:<branch|tag|commit> installs
#   "nvidia-modelopt @ git+https://github.com/NVIDIA/Model-Optimizer@<ref>"
# (needs git and network: the docker image; with MATRIX_ENV_MODE=system there).
# megatron-core axis: MATRIX_MCORE=<version> (e.g. 0.15.3) also installs megatron-core==<version>
# (--no-deps) into the same layer/site dir, ahead of the base one; the env is then
# .venv-mo<V>-mc<MCORE>. Its wheel comes from .whl-mc<digits> (e.g. .whl-mc0153) when that dir
# has it (offline; required in system mode), else from the registry (layer mode). megatron-core
# wheels are per platform and Python (compiled bits): the host's own tags must match.
# Every pip call is bounded by MATRIX_ENV_TIMEOUT_S (default 600 s). Idempotent: a stamp skips.
set -euo pipefail
cd "$(dirname "$0")/.."
ARG=${1:?usage: tools/matrix-env.sh <modelopt-version | path/to/nvidia_modelopt-V-*.whl | git:<ref>>}
MODE=${MATRIX_ENV_MODE:-layer}
T=${MATRIX_ENV_TIMEOUT_S:-600}
BASE=${MATRIX_BASE_VENV:-.venv}
find_links=()
case "$ARG" in
  *.whl)  # a local wheel: its version from the file name, installed offline
    [ -f "$ARG" ] || { echo "matrix-env: wheel $ARG not found" >&2; exit 2; }
    V=$(basename "$ARG" | cut -d- -f2)
    src="$(cd "$(dirname "$ARG")" && pwd)/$(basename "$ARG")" ;;
  git:*)  # a branch, tag or commit of the upstream repository (needs git + network: docker image)
    REF=${ARG#git:}
    case "$REF" in *[!0-9A-Za-z._/-]*|"") echo "matrix-env: '$REF' is not a git ref" >&2; exit 2 ;; esac
    V="git-$(echo "$REF" | tr '/' '_')"
    src="nvidia-modelopt @ git+https://github.com/NVIDIA/Model-Optimizer@$REF" ;;
  *)
    V=$ARG
    case "$V" in
      *[!0-9.a-z]*|"") echo "matrix-env: '$V' is not a release version, a .whl file or git:<ref>" >&2; exit 2 ;;
    esac
    src="nvidia-modelopt==$V"
    wheeldir=${MATRIX_WHEEL_DIR:-.whl-$(echo "$V" | tr -d . | cut -c1-3)}
    if [ -d "$wheeldir" ] && ls "$wheeldir"/nvidia_modelopt-"$V"-*.whl >/dev/null 2>&1; then
      find_links=(--find-links "$wheeldir"); echo "matrix-env: using wheel from $wheeldir" >&2
    fi ;;
esac
MC=${MATRIX_MCORE:-}
mc_src=(); mc_links=()
if [ -n "$MC" ]; then
  case "$MC" in *[!0-9.a-z]*) echo "matrix-env: megatron-core '$MC' is not a release version" >&2; exit 2 ;; esac
  mc_src=("megatron-core==$MC")
  mcdir=${MATRIX_MCORE_WHEEL_DIR:-.whl-mc$(echo "$MC" | tr -d .)}
  if ls "$mcdir"/megatron_core-"$MC"-*.whl >/dev/null 2>&1; then
    mc_links=(--find-links "$mcdir"); echo "matrix-env: megatron-core wheel from $mcdir" >&2
  elif [ "$MODE" = system ]; then
    echo "matrix-env: system mode needs megatron-core $MC's wheel in $mcdir (no registry assumed)" >&2; exit 2
  fi
  ENV=".venv-mo$V-mc$MC"
else
  ENV=".venv-modelopt-$V"
fi
STAMP="$ENV/.matrix-stamp"
want="$MODE $ARG mc=$MC $(cat requirements/cpu.lock requirements/megatron-core.lock | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then echo "$PWD/$ENV/bin/python"; exit 0; fi
rm -rf "$ENV"
if [ "$MODE" = system ]; then
  syspy=$(command -v "${MATRIX_BASE_PYTHON:-python3}")
  mkdir -p "$ENV/bin" "$ENV/site"
  have=$("$syspy" -c 'from importlib.metadata import version; print(version("nvidia-modelopt"))' 2>/dev/null || true)
  if [ "$have" != "$V" ]; then
    index=(--no-index)  # GPU hosts reach no registry: a release needs its wheel in .whl-<V>
    case "$ARG" in
      git:*) index=() ;;
      *.whl) ;;
      *) [ ${#find_links[@]} -gt 0 ] || { echo "matrix-env: system mode needs nvidia-modelopt $V's wheel in ${wheeldir} (no registry assumed)" >&2; exit 2; } ;;
    esac
    timeout "$T" "$syspy" -m pip --disable-pip-version-check -q install --no-deps "${index[@]}" \
      "${find_links[@]}" --target "$ENV/site" "$src" >&2
  fi
  have_mc=$("$syspy" -c 'from importlib.metadata import version; print(version("megatron-core"))' 2>/dev/null || true)
  if [ -n "$MC" ] && [ "${have_mc%%+*}" != "$MC" ]; then  # its wheel from .whl-mc<digits>, offline
    timeout "$T" "$syspy" -m pip --disable-pip-version-check -q install --no-deps --no-index \
      --ignore-requires-python "${mc_links[@]}" --target "$ENV/site" "${mc_src[@]}" >&2
  fi
  printf '#!/usr/bin/env bash\n# matrix-env system mode: nvidia-modelopt %s (and megatron-core, when MATRIX_MCORE) first on PYTHONPATH\nexport PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexec %s "$@"\n' \
    "$V" "$PWD/$ENV/site" "$syspy" > "$ENV/bin/python"
  chmod +x "$ENV/bin/python"
else
[ -x "$BASE/bin/python" ] || bash tools/bootstrap-venv.sh >&2
basepy="$BASE/bin/python"
fi
if [ "$MODE" = system ]; then
  :
elif [ "$MODE" = layer ]; then
  timeout "$T" "$basepy" -m venv --without-pip "$ENV"
  site=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  basesite=$("$basepy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir (not a bare path) so .venv's own .pth files are processed too
  echo "import site; site.addsitedir('$basesite')" > "$site/_matrix_base.pth"
  timeout "$T" "$basepy" -m pip --disable-pip-version-check -q install --no-deps \
    "${find_links[@]}" --target "$site" "$src" >&2
  if [ -n "$MC" ]; then
    timeout "$T" "$basepy" -m pip --disable-pip-version-check -q install --no-deps \
      --ignore-requires-python "${mc_links[@]}" --target "$site" "${mc_src[@]}" >&2
  fi
else
  timeout "$T" "$basepy" -m venv "$ENV"
  sed "s/^nvidia-modelopt==.*/$src/; s|^-r test.txt|-r $PWD/requirements/test.txt|" requirements/cpu.in > "$ENV/requirements.txt"
  timeout "$T" "$ENV/bin/python" -m pip --disable-pip-version-check -q install \
    "${find_links[@]}" -r "$ENV/requirements.txt" >&2
  timeout "$T" "$ENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps \
    --ignore-requires-python "${mc_links[@]}" ${MC:+"megatron-core==$MC"} \
    $([ -z "$MC" ] && echo "-r requirements/megatron-core.lock --require-hashes") >&2
fi
got=$("$ENV/bin/python" -c 'import modelopt; print(modelopt.__version__)' 2>/dev/null | tail -1)
case "$ARG" in
  git:*) echo "matrix-env: $ARG is nvidia-modelopt $got" >&2 ;;
  *) [ "$got" = "$V" ] || { echo "matrix-env: $ENV imports nvidia-modelopt $got, wanted $V" >&2; exit 1; } ;;
esac
if [ -n "$MC" ]; then
  got_mc=$("$ENV/bin/python" -c 'from importlib.metadata import version; print(version("megatron-core"))' 2>/dev/null | tail -1)
  [ "$got_mc" = "$MC" ] || { echo "matrix-env: $ENV imports megatron-core ${got_mc:-none}, wanted $MC" >&2; exit 1; }
fi
echo "$want" > "$STAMP"
echo "$PWD/$ENV/bin/python"
