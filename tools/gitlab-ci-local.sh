#!/usr/bin/env bash
# Run gitlab-ci-local, a real GitLab CI pipeline parser and local runner (npm), on this checkout.
#   bash tools/gitlab-ci-local.sh --list --variable CI_PIPELINE_SOURCE=schedule
#   bash tools/gitlab-ci-local.sh --preview --variable CI_PIPELINE_SOURCE=merge_request_event
#   bash tools/gitlab-ci-local.sh --force-shell-executor lint      (runs the job here, no docker)
# Installs the pinned version into .ci-tools/ (git-ignored) from the npm registry when it is
# missing or differs; later runs need no network. 4.60.1 is the newest release that runs on
# Node 20 (newer ones need a newer Node). Its `re2` dependency is replaced (npm "overrides") by
# tools/gitlab-ci-local-re2: the same RE2 engine as WebAssembly, so nothing is compiled (the
# native module's build took about 4 minutes on 2 cores; its prebuilt binary is not reachable).
# The install counts only once `gitlab-ci-local --version` runs and prints the pinned version:
# then the stamp .ci-tools/installed is written. Without the stamp (an install that failed, or
# was interrupted) the next run removes what is there and installs again. Concurrent runs wait
# on .ci-tools/.install.lock: exclusive while installing, shared while gitlab-ci-local runs, so
# nothing runs a half-installed copy and no install starts under a running one.
# Exit 127: node, npm, flock or timeout missing, or Node.js older than 18 (one line says which);
# `--prerequisites` as the only argument runs just those checks.
# Running a job (not --list/--preview) also needs rsync: installed with apt-get when missing and
# running as root. Its state (job logs, pipeline counter) goes to .ci-tools/state and its "home"
# configuration is .ci-tools/home, so a developer's own gitlab-ci-local settings do not change
# what it reports.
#   GITLAB_CI_LOCAL_VERSION    the version to install (default 4.60.1)
#   GITLAB_CI_LOCAL_TIMEOUT    seconds allowed for each install step and lock wait (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${GITLAB_CI_LOCAL_VERSION:-4.60.1}
limit=${GITLAB_CI_LOCAL_TIMEOUT:-300}
prefix=.ci-tools
shim=tools/gitlab-ci-local-re2
bin="$prefix/node_modules/.bin/gitlab-ci-local"
stamp="$prefix/installed"
say() { echo "gitlab-ci-local.sh: $*" >&2; }
missing() { say "$*"; exit 127; }
for tool in node npm flock timeout; do
  command -v "$tool" >/dev/null || missing "$tool not found on PATH (gitlab-ci-local needs Node.js >= 18 and npm)"
done
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$node_major" -ge 18 ] 2>/dev/null ||
  missing "gitlab-ci-local@$version needs Node.js >= 18; node is $(node --version 2>/dev/null || echo unreadable)"
[ "${1:-}" = --prerequisites ] && exit 0  # only the checks above (the tests ask this first)
# What a complete install is: this version with this re2 stand-in.
want="gitlab-ci-local@$version re2:$(cat "$shim/package.json" "$shim/index.js" | sha256sum | cut -c1-16)"
complete() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin" ]; }

bounded() {  # "$@" under timeout (its own process group); a signal to this script ends that group
  timeout -k 10 "$limit" "$@" & local pid=$! rc=0
  trap 'kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; exit 130' INT TERM HUP
  wait "$pid" || rc=$?
  trap - INT TERM HUP
  return "$rc"
}

install() {
  say "installing gitlab-ci-local@$version into $prefix/ (npm registry; re2 as WebAssembly, nothing to compile)"
  rm -rf "$stamp" "$prefix/node_modules" "$prefix/package.json" "$prefix/package-lock.json"
  # --install-links: the stand-in is copied in as a package, with its own dependency (re2-wasm)
  printf '{"private": true, "dependencies": {"gitlab-ci-local": "%s"}, "overrides": {"re2": "file:../%s"}}\n' \
    "$version" "$shim" > "$prefix/package.json"
  bounded npm install --prefix "$prefix" --install-links --no-audit --no-fund --loglevel=error >&2 ||
    { say "npm install of gitlab-ci-local@$version failed (or ran past ${limit}s); the next run starts it again"; exit 1; }
  local got
  got=$(bounded "$bin" --version 2>&1) || true
  [ "$got" = "$version" ] ||
    { say "gitlab-ci-local@$version installed but '$bin --version' printed '${got:0:300}'; not marked installed"; exit 1; }
  echo "$want" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
}

mkdir -p "$prefix/state" "$prefix/home"
exec 9>"$prefix/.install.lock"
waited() { say "waited ${limit}s for $prefix/.install.lock (another install, or a running gitlab-ci-local that this install would replace)"; exit 1; }
for _ in 1 2 3; do
  flock -s -w "$limit" 9 || waited
  complete && break
  flock -u 9
  flock -x -w "$limit" 9 || waited
  complete || install
  flock -u 9
done
complete || { say "gitlab-ci-local@$version was replaced by another install three times while starting"; exit 1; }
runs_jobs=1
for arg in "$@"; do
  case "$arg" in --list*|--preview|--help|--version|--completion) runs_jobs=0 ;; esac
done
if [ "$runs_jobs" = 1 ] && ! command -v rsync >/dev/null; then
  # gitlab-ci-local copies the tracked files with rsync before it runs any job.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing rsync (apt-get), which gitlab-ci-local needs to run jobs"
    export DEBIAN_FRONTEND=noninteractive
    bounded apt-get install -y -qq --no-install-recommends rsync >&2 ||
      { bounded apt-get update -qq >&2 &&
        bounded apt-get install -y -qq --no-install-recommends rsync >&2; }
  fi
  command -v rsync >/dev/null || { say "rsync not found: install it to run jobs"; exit 127; }
fi
# fd 9 (the shared lock) stays open in gitlab-ci-local: no install replaces it while it runs.
exec "$bin" --state-dir "$prefix/state" --home "$prefix/home" "$@"
