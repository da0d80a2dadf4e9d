#!/usr/bin/env bash
# Validate a GitLab CI file (default .gitlab-ci.yml) against GitLab's CI JSON schema.
# check-jsonschema (PyPI) vendors that schema in its wheel (`--builtin-schema vendor.gitlab-ci`),
# so after the first install this runs offline. Installs the version pinned in
# requirements/lint.txt into .venv when it is missing or differs; exits non-zero when the file
# is invalid. `--data-transform gitlab-ci` lets it read GitLab's `!reference` tags.
set -euo pipefail
file=$(realpath "${1:-$(dirname "$0")/../.gitlab-ci.yml}")
cd "$(dirname "$0")/.."
. tools/lint-install.sh
lint_install check-jsonschema check-jsonschema
exec "$VENV/bin/check-jsonschema" --builtin-schema vendor.gitlab-ci --data-transform gitlab-ci \
  "$file"
