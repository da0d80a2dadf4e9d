# Sourced by tools/validate-gitlab-ci.sh and tools/lint-dockerfile.sh (run from the repo root):
#   lint_install PACKAGE CMD   puts the version of PACKAGE pinned in requirements/lint.txt into
#   $VENV (default .venv; created bare if missing) unless `CMD --version` already reports it.
# It installs requirements/lint.lock (`make lock`: both tools and their dependencies, exact and
# hash-checked, at the versions requirements/cpu.lock has where the two share a package, since
# they share .venv), with pip: the venv may be bare here, before tools/bootstrap-venv.sh put uv in.
lint_install() {
  local package=$1 cmd=$2 pin want
  pin=$(grep -E "^$package==" requirements/lint.txt | cut -d' ' -f1)
  want=${pin#"$package"==}
  grep -qE "^$pin( |$)" requirements/lint.lock || { echo "lint-install: requirements/lint.lock lacks $pin: run make lock" >&2; return 2; }
  VENV=${VENV:-.venv}
  [ -x "$VENV/bin/python" ] || "${BOOTSTRAP_PYTHON:-python3}" -m venv "$VENV"
  if ! "$VENV/bin/$cmd" --version 2>/dev/null | grep -qE "(^| )$want\$"; then
    "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps --require-hashes \
      -r requirements/lint.lock
  fi
}
