"""Bad inputs that reach the stages or the scenario files: a schema-valid stage timeout too short
for any stage, a HARNESS_RANK_TRIM no rank survives, two scenario files of one name.

Why: a forked stage that died before its torchrun.log existed crashed the controller with a
FileNotFoundError and left a run folder without results.json; a trim of torch failed every cell
after the probe; a new file reusing a shipped scenario's name replaced the shipped grid silently.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT, SCENARIO_DIR
from harness.scenario import scenarios
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

SHIPPED = SCENARIO_DIR / "cpu_reshard.toml"
TINY = ('name = "tiny-timeout"\ntier = "cpu"\nbackend = "local"\npatch = "none"\nexpect = "pass"\n'
        'saves = ["tp1-etp1-ep2"]\nloads = ["tp1-etp1-ep1"]\nstage_timeout_s = 0.001\n')


def _cli_with_scenarios(directory: Path, *args: str, env: dict | None = None):
    """``python -m harness ARGS`` in a child whose scenario directory is ``directory``."""
    code = ("import sys; from pathlib import Path; from harness.scenario import scenarios; "
            f"scenarios.SCENARIO_DIR = Path({str(directory)!r}); from harness.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    return bounded([sys.executable, "-W", "ignore", "-c", code, *args], 300, cwd=REPO_ROOT,
                   env={**os.environ, **(env or {})})


def test_a_stage_timeout_too_short_for_any_stage_fails_its_cells_with_a_reason(tmp_path):
    """stage_timeout_s = 0.001: the forked stage ends before its torchrun.log exists; each cell
    fails naming the timeout, and the run folder holds its results.json."""
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "tiny.toml").write_text(TINY)
    root = tmp_path / "results"
    done = _cli_with_scenarios(d, "--results-root", str(root), "run", "--scenario", "tiny-timeout")
    assert "Traceback" not in done.stderr and "FileNotFoundError" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr  # a cell unexpected
    [results] = list(root.glob("*/results.json"))
    cells = json.loads(results.read_text())["cells"]
    assert len(cells) == 2 and {c["outcome"] for c in cells} == {"unexpected-failure"}, cells
    assert all("timed out" in json.dumps(c).lower() for c in cells), cells


def test_a_rank_trim_of_what_every_rank_imports_is_one_line(tmp_path):
    root = tmp_path / "results"
    done = bounded([sys.executable, "-W", "ignore", "-m", "harness", "--results-root", str(root),
                    "repro"], 120, cwd=REPO_ROOT, env={**os.environ, "HARNESS_RANK_TRIM": "torch"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "HARNESS_RANK_TRIM='torch'" in lines[0] and "refuses torch" in lines[0], lines
    assert not root.exists()


def test_an_optional_rank_trim_passes_the_check():
    from harness.rank import trim

    assert trim.problem({trim.VAR: "transformers, torchvision,numba"}) is None
    assert "megatron" in trim.problem({trim.VAR: "numba,megatron"})


# --- two scenario files of one name ------------------------------------------------------------

@pytest.fixture
def shadowed(tmp_path) -> Path:
    """The shipped cpu-reshard file beside a new one that reuses its name (sorted first)."""
    d = tmp_path / "scenarios"
    d.mkdir()
    shutil.copy(SHIPPED, d / SHIPPED.name)
    (d / "a_shadow.toml").write_text(TINY.replace("tiny-timeout", "cpu-reshard"))
    return d


def test_a_reused_scenario_name_makes_both_files_bad_each_naming_the_other(shadowed):
    good, bad = scenarios.load_all_with_errors(shadowed)
    assert good == []  # neither grid stands in for the other
    lines = sorted(str(e) for e in bad)
    assert len(lines) == 2 and all("'cpu-reshard'" in line for line in lines), lines
    assert "a_shadow.toml" in lines[0] and lines[0].endswith("cpu_reshard.toml"), lines
    assert "cpu_reshard.toml" in lines[1] and lines[1].endswith("a_shadow.toml"), lines


def test_repro_refuses_a_reused_scenario_name_naming_both_files(shadowed, tmp_path):
    root = tmp_path / "results"
    done = _cli_with_scenarios(shadowed, "--results-root", str(root), "repro")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "'cpu-reshard'" in lines[0], lines
    assert str(shadowed / "a_shadow.toml") in lines[0] and str(shadowed / SHIPPED.name) in lines[0]
    assert not root.exists()


def test_the_shipped_scenarios_have_no_name_clash():
    assert scenarios.name_clashes() == []
