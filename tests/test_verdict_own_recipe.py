"""A job owner's own recipe file: ``verdict --quarantine FILE`` with a job whose
recipe is ``file:...`` decides from the amax kinds the file makes, like any shipped recipe.

The job here is the shipped Ultra job (scenarios/quarantine.toml: its shapes, reload grid and
scenarios) with its recipe replaced by a file in the repository. The committed records of its
scenarios ran the shipped Ultra recipe, whose routed experts are static NVFP4 (kind
``static-block``); a file that makes the same kinds must get the shipped job's decision, and a
file whose kinds no committed record made (INT8 per channel) must not borrow the static
records' outcomes: undecided (exit 4), naming the scenario run that would decide. Expectations come
from the shipped job's own verdict and the rules' table, not from the file job's output.
"""
from __future__ import annotations

import os
import sys
import tomllib

import pytest

from harness.paths import QUARANTINE_FILE, REPO_ROOT
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

ULTRA = "ultra-550b-a55b-nvfp4-ptq"
SAME_KINDS = "file:tests/data/recipes/nvfp4_static_experts.yaml"  # static NVFP4 experts only
OTHER_KINDS = "file:tests/data/recipes/int8_per_channel_experts.yaml"  # INT8, axis 0


def _own_job(tmp_path, recipe: str):
    """scenarios/quarantine.toml's Ultra job, alone, as ``mine`` quantizing with ``recipe``."""
    text = QUARANTINE_FILE.read_text()
    block = text[text.index(f'[[jobs]]\nid = "{ULTRA}"'):]
    shipped = tomllib.loads(block)["jobs"][0]["profile"]["recipe"]
    path = tmp_path / "mine.toml"
    path.write_text(block.replace(f'id = "{ULTRA}"', 'id = "mine"').replace(shipped, recipe))
    return path


def _gate(*args) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("HARNESS_QUARANTINE", None)
    done = bounded([sys.executable, "-m", "harness", "verdict", "--gate", *args], 600,
                   cwd=REPO_ROOT, env=env)
    assert not done.timed_out
    last = [line for line in done.stdout.splitlines() if line.startswith("gate ")]
    assert last, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done.returncode, last[-1]


def _word(line: str) -> str:
    """``gate JOB: WORD -> exit N: ...`` -> WORD."""
    return line.split(": ", 1)[1].split(" -> ", 1)[0]


@pytest.mark.parametrize("flags", [("--modelopt", "0.48.0rc1"),
                                   pytest.param(("--modelopt", "0.47.0"), marks=pytest.mark.slow)])
def test_a_recipe_file_with_the_shipped_kinds_gets_the_shipped_jobs_decision(tmp_path, flags):
    quarantine = _own_job(tmp_path, SAME_KINDS)
    shipped_code, shipped = _gate("--job", ULTRA, *flags)
    code, mine = _gate("--quarantine", str(quarantine), "--job", "mine", *flags)
    assert _word(shipped) in ("SAFE", "SAFE WITH PATCH", "BLOCKED"), shipped  # it decides
    assert (code, _word(mine)) == (shipped_code, _word(shipped)), (mine, shipped)


@pytest.mark.slow  # a second real survey; the own recipe's decision stays
def test_a_recipe_file_whose_kinds_no_record_made_is_undecided(tmp_path):
    """Per-channel experts have rules (read from the sources, harness/check/versions.py), but no
    committed record of the job's cells saved that kind: nothing decides, and the line names what
    would."""
    quarantine = _own_job(tmp_path, OTHER_KINDS)
    code, line = _gate("--quarantine", str(quarantine), "--job", "mine", "--modelopt", "0.48.0rc1")
    assert code == 4 and _word(line) in ("INCOMPLETE", "NO EVIDENCE", "RULE UNKNOWN"), line
    assert "what would decide: python -m harness run --scenario " in line or "'per-channel'" in line, line
