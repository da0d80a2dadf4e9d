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


# --- every command's exit codes are in its --help, and reach the caller ------------------------

def test_every_command_lists_its_exit_codes_in_its_help():
    from harness.cli import parser

    commands = next(a for a in parser()._actions if a.dest == "cmd").choices
    for name, sub in commands.items():
        epilog = sub.epilog or ""
        assert epilog.startswith("exit codes:\n  0 "), f"{name}: {epilog!r}"
    shown = bounded([sys.executable, "-m", "harness", "inspect", "--help"], 60, cwd=REPO).stdout
    assert "exit codes:" in shown and "  1      inspected, and the checkpoint needs care" in shown


def test_inspect_exits_1_for_a_checkpoint_that_needs_care():
    """The documented 1: a checkpoint saved with validation off lacks expert amax."""
    ckpt = REPO / "tests" / "golden" / "modelopt-0.47.0-tp2-etp1-ep2-novalidate" / "ckpt"
    done = bounded([sys.executable, "-W", "ignore", "-m", "harness", "inspect", str(ckpt)], 120, cwd=REPO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "expert weight-quantizer amax missing" in done.stdout


RUNS = REPO / "tests" / "data" / "runs"
NO_JOB_CELLS = RUNS / "20261203-004730-density.results.json"  # evidence for neither job


def _results_without_evidence(tmp_path):
    (tmp_path / "results" / "density").mkdir(parents=True)
    (tmp_path / "results" / "density" / "results.json").write_text(NO_JOB_CELLS.read_text())
    return tmp_path / "results"


@pytest.mark.parametrize("target, script, lines, word", [
    pytest.param("verdict", "tools/verdict.sh", 1, "NO EVIDENCE", marks=pytest.mark.slow),
    pytest.param("gate", "tools/unquarantine-gate.sh", 4, "INCOMPLETE -> exit 4", marks=pytest.mark.slow)])
def test_no_evidence_exits_4_through_the_script_and_fails_make(tmp_path, target, script, lines, word):
    """Nothing decides: 4 for the plain verdict (NO EVIDENCE; it exited 0) as for the gate (whose
    line names what would decide); make fails with GNU make's own 2 for any failed recipe, its
    "Error 4" line naming the code."""
    results = _results_without_evidence(tmp_path)
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(results)}
    done = bounded(["bash", script], 300, cwd=REPO, env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout.count(word) == max(1, lines // 2), done.stdout  # one per job
    assert len(done.stdout.splitlines()) == lines, done.stdout  # the gate: a header per job too
    made = bounded(["make", "-s", target, f"PY={sys.executable}", f"RESULTS={results}"], 300,
                   cwd=REPO)
    assert made.returncode == 2, made.stdout + made.stderr
    assert "Error 4" in made.stderr


def test_equivalence_of_runs_without_a_cell_in_common_is_an_error():
    witness = str(RUNS / "20261202-122731-witness.results.json")
    for extra in ([], ["--outcomes-only"]):
        done = bounded([sys.executable, "-m", "harness", "equivalence", *extra, witness,
                        str(NO_JOB_CELLS)], 120, cwd=REPO)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert "have no cell in common" in line and NO_JOB_CELLS.name in line
