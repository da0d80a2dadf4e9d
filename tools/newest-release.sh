#!/usr/bin/env bash
# The newest release of a package on the configured registry (pre-releases included), one line:
#   tools/newest-release.sh nvidia-modelopt   -> 0.48.0rc1
# For the nightly pairs job (.gitlab-ci.yml pairs-nightly). Bounded by NEWEST_TIMEOUT_S (60 s).
set -euo pipefail
DIST=${1:?usage: tools/newest-release.sh <package>}
case "$DIST" in *[!0-9A-Za-z._-]*) echo "newest-release: '$DIST' is not a package name" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
out=$(timeout "${NEWEST_TIMEOUT_S:-60}" "$PY" -m pip index versions --pre "$DIST" 2>/dev/null) || {
  echo "newest-release: the registry gave no versions of $DIST" >&2; exit 2; }
# "megatron-core (0.19.2)" is pip's first line: the newest version it can install here
v=$(printf '%s\n' "$out" | head -1 | sed -n 's/^[^(]*(\([^)]*\)).*/\1/p')
[ -n "$v" ] || { echo "newest-release: could not read a version of $DIST from pip" >&2; exit 2; }
echo "$v"
