"""tools/gitlab-ci-local.sh installs gitlab-ci-local once, completely, or not at all.

The install counts only when `gitlab-ci-local --version` runs (then a stamp is written);
concurrent callers (two xdist workers on a fresh clone) wait on a lock for that stamp; an
install that failed or was interrupted is found by the missing stamp and redone from scratch,
never run half-made; a machine without node skips the pipeline tests under one reason line.
These run the real script with stand-ins for node and npm (no registry): seconds, any machine.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import bounded as bounded_process
from harness.bounded import Finished
from harness.paths import REPO_ROOT
from tests.helpers import GITLAB_CI_LOCAL, GITLAB_CI_LOCAL_VERSION, MISSING_PREREQUISITE, bounded

pytestmark = pytest.mark.cpu


FAKE_NPM = r"""#!/bin/bash
# npm install --prefix P ...: counts its calls, leaves a partial tree, then per FAKE_NPM_MODE
# installs a gitlab-ci-local that runs (ok), one that does not (broken), or fails (fail).
set -e
prefix=$3
echo "$$" >> "$FAKE_LOG"
mkdir -p "$prefix/node_modules/.bin" && touch "$prefix/node_modules/partial-$$"
sleep "${FAKE_NPM_SLEEP:-0}"
[ "${FAKE_NPM_MODE:-ok}" = fail ] && exit 1
bin="$prefix/node_modules/.bin/gitlab-ci-local"
if [ "${FAKE_NPM_MODE:-ok}" = broken ]; then
  printf '#!/bin/sh\necho "Error: Cannot find module re2.node" >&2; exit 1\n' > "$bin"
else
  printf '#!/bin/sh\nfor a; do [ "$a" = --version ] && { echo %s; exit 0; }; done; echo "ran $*"\n' "$FAKE_VERSION" > "$bin"
fi
chmod +x "$bin"
rm -f "$prefix/node_modules/partial-$$"
"""
TOOLS = ["bash", "sh", "cat", "cut", "sha256sum", "mkdir", "rm", "mv", "touch", "sleep", "chmod",
         "dirname", "id", "flock", "timeout", "printf"]


@pytest.fixture
def sandbox(tmp_path):
    """A checkout holding only the script and the re2 stand-in, and a PATH of plain tools with a
    fake npm and a node that reports version 20; returns (root, env, npm call log)."""
    root = tmp_path / "repo"
    (root / "tools").mkdir(parents=True)
    shutil.copy(GITLAB_CI_LOCAL, root / "tools")
    shutil.copytree(REPO_ROOT / "tools" / "gitlab-ci-local-re2",
                    root / "tools" / "gitlab-ci-local-re2")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "npm").write_text(FAKE_NPM)
    (bin_dir / "node").write_text('#!/bin/sh\n[ "$1" = -p ] && echo 20 || echo v20.0.0\n')
    for fake in ("npm", "node"):
        (bin_dir / fake).chmod(0o755)
    log = tmp_path / "npm-calls"
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "FAKE_LOG": str(log),
           "FAKE_VERSION": GITLAB_CI_LOCAL_VERSION,
           "GITLAB_CI_LOCAL_VERSION": GITLAB_CI_LOCAL_VERSION}
    return root, env, log


def run_tool(root: Path, env: dict, *args: str, **extra) -> Finished:
    return bounded(["bash", str(root / "tools" / "gitlab-ci-local.sh"), *args], 60,
                   cwd=root, env={**env, **extra})


def npm_calls(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def start_tool(root: Path, env: dict, *args: str, **extra) -> subprocess.Popen:
    return bounded_process.start(["bash", str(root / "tools" / "gitlab-ci-local.sh"), *args],
                                 cwd=root, env={**env, **extra}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    done = bounded_process.finish(p, timeout).raise_if_timed_out()
    return done.returncode, done.stdout, done.stderr


def test_concurrent_callers_wait_for_one_install(sandbox):
    """Two callers on an empty checkout (two xdist workers): one installs, the other waits on the
    lock and runs only what the first finished; npm runs once."""
    root, env, log = sandbox
    procs = [start_tool(root, env, "--list", FAKE_NPM_SLEEP="2") for _ in range(2)]
    for p in procs:
        rc, out, err = finish(p)
        assert rc == 0 and out.startswith("ran ") and "--list" in out, (rc, out, err)
    assert npm_calls(log) == 1
    installed = (root / ".ci-tools" / "installed").read_text()
    assert installed.startswith(f"gitlab-ci-local@{GITLAB_CI_LOCAL_VERSION} ")
    rc = run_tool(root, env, "--list")
    assert rc.returncode == 0 and npm_calls(log) == 1, "a complete install is not redone"


@pytest.mark.parametrize("mode", ["fail", "broken"])
def test_a_failed_install_is_never_used_and_is_redone(sandbox, mode):
    """npm failing, or an install whose `gitlab-ci-local --version` does not run (the re2.node
    case): exit 1 with one line, no stamp; the next call removes the tree and installs again."""
    root, env, log = sandbox
    bad = run_tool(root, env, "--list", FAKE_NPM_MODE=mode)
    assert bad.returncode == 1 and "ran " not in bad.stdout, bad
    assert not (root / ".ci-tools" / "installed").exists()
    good = run_tool(root, env, "--list")
    assert good.returncode == 0 and good.stdout.startswith("ran "), good
    assert npm_calls(log) == 2
    assert not list((root / ".ci-tools" / "node_modules").glob("partial-*")), "half tree kept"


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_an_interrupted_install_is_redone(sandbox, sig):
    """The installing caller is cancelled (SIGTERM: its npm is ended with it) or killed (SIGKILL:
    its npm runs on, holding the lock): the next caller waits for the lock, finds no stamp and
    installs from scratch."""
    root, env, log = sandbox
    first = start_tool(root, env, "--list", FAKE_NPM_SLEEP="3")
    deadline = time.monotonic() + 30
    while npm_calls(log) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert npm_calls(log) == 1, "the first caller never started npm"
    os.killpg(first.pid, sig)
    finish(first, 30)
    second = run_tool(root, env, "--list")
    assert second.returncode == 0 and second.stdout.startswith("ran "), second
    assert npm_calls(log) == 2, "the interrupted install was taken for a complete one"
    assert not list((root / ".ci-tools" / "node_modules").glob("partial-*"))


def test_without_node_the_script_says_so_in_one_line(sandbox):
    root, env, log = sandbox
    (Path(env["PATH"]) / "node").unlink()
    proc = run_tool(root, env, "--list")
    assert proc.returncode == MISSING_PREREQUISITE and proc.stdout == "", proc
    assert proc.stderr.splitlines() == [
        "gitlab-ci-local.sh: node not found on PATH (gitlab-ci-local needs Node.js >= 18 and npm)"]
    assert npm_calls(log) == 0


def test_without_node_these_tests_skip_with_one_reason(sandbox, tmp_path):
    """pytest on a machine without node: every gitlab-ci-local test skips, under one reason line."""
    _, env, _ = sandbox
    (Path(env["PATH"]) / "node").unlink()
    proc = bounded([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                    "-m", "not slow", "--results-root", str(tmp_path / "r"),
                    str(REPO_ROOT / "tests" / "test_gitlab_pipeline.py")],
                   300, cwd=REPO_ROOT, env={**os.environ, "PATH": env["PATH"]})
    reasons = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    # exit 5: pytest ran no test (the whole module skipped), as it is alone here
    assert proc.returncode == 5 and len(reasons) == 1, proc.stdout[-3000:]
    assert reasons[0].endswith("gitlab-ci-local.sh: node not found on PATH "
                               "(gitlab-ci-local needs Node.js >= 18 and npm)"), reasons
    assert "passed" not in proc.stdout and "error" not in proc.stdout, proc.stdout[-3000:]
