"""Bad inputs caught at start-up, before any stage runs: numeric variables, an empty or unusable
--results-root, make's empty RESULTS. Each gets one line naming the variable or value, exit 2
(the "usage" code of every command's --help), no traceback and no run folder left behind.

Why: a bad value that is only read inside the ranks costs a minute and fails every cell without
naming the variable; an empty root puts a run folder in the checkout.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import psutil
import pytest

from harness import switches
from harness.paths import REPO_ROOT
from tests.helpers import bounded, harness_cli, one_error_line

pytestmark = pytest.mark.cpu

RUN_FOLDER = re.compile(r"\d{8}-\d{6}-")  # results/<run-id>: a run's folder


def _run_folders(where: Path) -> set[str]:
    return {p.name for p in where.iterdir() if RUN_FOLDER.match(p.name)} if where.is_dir() else set()


# --- numeric variables: checked once, at start-up, naming the variable -------------------------

@pytest.mark.parametrize("name", ["HARNESS_PG_TIMEOUT_S", "HARNESS_FORK_SIBLING_WAIT_S"])
def test_a_bad_numeric_variable_stops_repro_at_once(tmp_path, name):
    done = harness_cli("--results-root", str(tmp_path / "r"), "repro", env={name: "abc"})
    one_error_line(done, f"{name}='abc'", "not a number", code=2)
    assert not (tmp_path / "r").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "nan", "1e9"])
def test_numbers_refuse_what_is_not_one_in_range(raw):
    with pytest.raises(switches.SwitchError) as err:
        switches.number("HARNESS_PG_TIMEOUT_S", environ={"HARNESS_PG_TIMEOUT_S": raw})
    assert "\n" not in str(err.value) and f"HARNESS_PG_TIMEOUT_S={raw!r}" in str(err.value)


def test_numbers_read_their_value_or_default():
    assert switches.number("HARNESS_PG_TIMEOUT_S", environ={}) == 60.0
    assert switches.number("HARNESS_PG_TIMEOUT_S", environ={"HARNESS_PG_TIMEOUT_S": " 7.5 "}) == 7.5
    assert switches.number("MATRIX_JOBS", environ={"MATRIX_JOBS": ""}, default=3) == 3
    with pytest.raises(switches.SwitchError, match="whole number"):
        switches.number("MATRIX_JOBS", environ={"MATRIX_JOBS": "2.5"})


def _numeric_env_reads(path: Path) -> list[str]:
    """``int(os.environ...)`` / ``float(os.environ...)`` calls in ``path`` of HARNESS_/MATRIX_
    variables: a number read past harness/switches.py."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("int", "float") and node.args):
            text = ast.unparse(node.args[0])
            if "environ" in text and re.search(r"HARNESS_|MATRIX_|_ENV\b", text):
                found.append(f"{path.name}: {ast.unparse(node)}")
    return found


def test_every_numeric_variable_is_read_through_switches(tmp_path):
    """One place: no module converts a HARNESS_/MATRIX_ variable itself (the controller's own
    per-stage HARNESS_STAGE_TIMEOUT_S and HARNESS_POOL_OWNER aside)."""
    internal = ("HARNESS_STAGE_TIMEOUT_S", "HARNESS_POOL_OWNER")
    found = [f for p in (REPO_ROOT / "harness").rglob("*.py") for f in _numeric_env_reads(p)
             if not any(name in f for name in internal)]
    assert not found, found
    probe = tmp_path / "reader.py"  # the checker sees such a read where there is one
    probe.write_text('import os\nx = float(os.environ.get("HARNESS_PG_TIMEOUT_S", "60"))\n')
    assert _numeric_env_reads(probe)


# --- --results-root: empty, or where no directory can be made ----------------------------------

def test_an_empty_results_root_is_refused_not_read_as_the_checkout():
    before = _run_folders(REPO_ROOT)
    done = harness_cli("--results-root", "", "repro")
    one_error_line(done, "--results-root is empty", code=2)
    assert _run_folders(REPO_ROOT) == before


def _proc_mount() -> Path:
    mounts = [p.mountpoint for p in psutil.disk_partitions(all=True) if p.fstype == "proc"]
    if not mounts:
        pytest.skip("no proc filesystem mounted here")
    return Path(mounts[0])


def test_a_results_root_where_nothing_can_be_made_is_one_line():
    """Root may write anywhere by its permissions, yet the proc filesystem takes no directory."""
    root = _proc_mount() / "harness-results"
    done = harness_cli("--results-root", str(root), "repro")
    one_error_line(done, f"--results-root {root}", "no directory can be made", code=2)


def test_make_repro_with_an_empty_results_is_refused_naming_it():
    """``make repro RESULTS=``: the empty value once ate the next word (argparse then asked for
    a command); now the harness names it."""
    before = _run_folders(REPO_ROOT)
    done = bounded(["make", "--no-print-directory", "repro", "RESULTS="], 120, cwd=REPO_ROOT,
                   env={**os.environ, "PY": sys.executable})
    assert done.returncode == 2, done.stdout + done.stderr  # make's code for a failed recipe
    assert "--results-root is empty" in done.stderr and "Traceback" not in done.stderr
    assert "required: cmd" not in done.stderr
    assert _run_folders(REPO_ROOT) == before


def test_make_repro_with_results_under_proc_is_one_line():
    root = _proc_mount() / "harness-results"
    done = bounded(["make", "--no-print-directory", "repro", f"RESULTS={root}"], 120,
                   cwd=REPO_ROOT, env=dict(os.environ))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no directory can be made" in done.stderr and "Traceback" not in done.stderr
