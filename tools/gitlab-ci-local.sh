#!/usr/bin/env bash
# Run gitlab-ci-local, a real GitLab CI pipeline parser and local runner (npm), on this checkout.
#   bash tools/gitlab-ci-local.sh --list --variable CI_PIPELINE_SOURCE=schedule
#   bash tools/gitlab-ci-local.sh --preview --variable CI_PIPELINE_SOURCE=merge_request_event
#   bash tools/gitlab-ci-local.sh --force-shell-executor lint      (runs the job here, no docker)
# Installs the pinned version into .ci-tools/ (git-ignored) from the npm registry when it is
# missing or differs; later runs need no network. 4.60.1 is the newest release that runs on
# Node 20 (newer ones need a newer Node). Needs node and npm on PATH. Running a job (not
# --list/--preview) also needs rsync: installed with apt-get when missing and running as root.
# Its state (job logs, pipeline counter) goes to .ci-tools/state and its "home" configuration is
# .ci-tools/home, so a developer's own gitlab-ci-local settings do not change what it reports.
#   GITLAB_CI_LOCAL_VERSION    the version to install (default 4.60.1)
#   GITLAB_CI_LOCAL_TIMEOUT    seconds allowed for each install step (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${GITLAB_CI_LOCAL_VERSION:-4.60.1}
limit=${GITLAB_CI_LOCAL_TIMEOUT:-900}  # the re2 native build alone took over 300 s on a busy 2-core machine
prefix=.ci-tools
bin="$prefix/node_modules/.bin/gitlab-ci-local"
pkg="$prefix/node_modules/gitlab-ci-local/package.json"
say() { echo "gitlab-ci-local.sh: $*" >&2; }
for tool in node npm; do
  command -v "$tool" >/dev/null || { say "$tool not found on PATH (install Node.js 20 and npm)"; exit 127; }
done
installed() {
  [ -x "$bin" ] && [ -f "$pkg" ] &&
    [ "$(node -p 'require(process.argv[1]).version' "$PWD/$pkg" 2>/dev/null)" = "$version" ]
}
mkdir -p "$prefix/state" "$prefix/home"
if ! installed; then
  exec 9>"$prefix/.install.lock"
  flock -w "$limit" 9 || { say "timed out waiting for another install"; exit 1; }
  if ! installed; then  # another process may have installed it while this one waited
    say "installing gitlab-ci-local@$version into $prefix/ (npm registry)"
    timeout "$limit" npm install --prefix "$prefix" --no-save --no-audit --no-fund \
      --loglevel=error "gitlab-ci-local@$version" >&2
    installed || { say "gitlab-ci-local@$version did not install"; exit 1; }
  fi
  exec 9>&-
fi
runs_jobs=1
for arg in "$@"; do
  case "$arg" in --list*|--preview|--help|--version|--completion) runs_jobs=0 ;; esac
done
if [ "$runs_jobs" = 1 ] && ! command -v rsync >/dev/null; then
  # gitlab-ci-local copies the tracked files with rsync before it runs any job.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing rsync (apt-get), which gitlab-ci-local needs to run jobs"
    export DEBIAN_FRONTEND=noninteractive
    timeout "$limit" apt-get install -y -qq --no-install-recommends rsync >&2 ||
      { timeout "$limit" apt-get update -qq >&2 &&
        timeout "$limit" apt-get install -y -qq --no-install-recommends rsync >&2; }
  fi
  command -v rsync >/dev/null || { say "rsync not found: install it to run jobs"; exit 127; }
fi
exec "$bin" --state-dir "$prefix/state" --home "$prefix/home" "$@"
