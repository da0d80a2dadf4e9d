"""An error is never exit 0: a make target without a usable Python stops with make's exit 2
and one line, and a matrix row for a version that does not exist turns the run red."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.run import matrix
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parent.parent
# Every target whose recipe runs the harness's Python (the others run bash scripts or docker).
PYTHON_TARGETS = ("repro", "test", "test-slow", "test-all", "test-gpu", "witness", "verdict", "gate", "report", "map",
                  "bench", "matrix", "fix-wheel")


@pytest.mark.parametrize("target", PYTHON_TARGETS)
def test_make_target_stops_without_python(target):
    env = {**os.environ, "HARNESS_PYTHON": "bogus"}
    done = bounded(["make", "-s", target], 60, cwd=REPO, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "HARNESS_PYTHON must be system, venv or auto (got 'bogus')" in done.stderr
    assert "command not found" not in done.stderr
    assert "no Python for the harness" in done.stderr


def test_matrix_row_that_cannot_run_is_an_error(tmp_path, monkeypatch, capsys):
    """A version whose environment cannot be built is a red row, with one line naming it."""
    def no_env(cmd, timeout_s, log, env=None):
        return 2, "matrix-env: ERROR: No matching distribution found for nvidia-modelopt==9.9.9\n"

    monkeypatch.setattr(matrix, "_run", no_env)
    rc = matrix.main(SimpleNamespace(modelopt=["9.9.9"], from_runs=[], results_root=str(tmp_path)))
    err = capsys.readouterr().err
    assert rc == 1
    assert "matrix: error: modelopt 9.9.9 + mcore 0.19.2: import:" in err  # the pair, named
    assert "No matching distribution" in err


def test_matrix_cli_unknown_release_exits_nonzero(tmp_path):
    """End to end through tools/matrix-env.sh: pip finds no such release (or no registry)."""
    done = bounded([sys.executable, "-m", "harness", "--results-root", str(tmp_path), "matrix",
                    "--modelopt", "9.9.9"], 600, cwd=REPO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "matrix: error: modelopt 9.9.9" in done.stderr
