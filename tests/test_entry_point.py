"""``python -m harness`` as the README types it: an interpreter without the stack runs the
command in the project's ``.venv`` and says so; ``HARNESS_PYTHON=system`` keeps its own."""
from __future__ import annotations

import os
import sys

import pytest

from harness.paths import REPO_ROOT
from tests.helpers import bounded

BASE = getattr(sys, "_base_executable", "")  # the interpreter this venv was made from


def _stackless() -> str:
    if not BASE or os.path.realpath(sys.prefix) == os.path.realpath(sys.base_prefix):
        pytest.skip("not run from a venv: no interpreter without the project's environment here")
    has_torch = bounded([BASE, "-c", "import importlib.util as u; print(bool(u.find_spec('torch')))"],
                        60).stdout.strip()
    if has_torch != "False":
        pytest.skip(f"{BASE} has torch itself: nothing to hand over")
    return BASE


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_PYTHON", "PYTHONPATH")}
    return {**env, **extra}


def test_a_stackless_python_runs_the_command_in_the_project_environment():
    python = _stackless()
    done = bounded([python, "-m", "harness", "verdict", "--job", "no-such-job", "--gate",
                    "--modelopt", "0.47.0"], 120, cwd=REPO_ROOT, env=_env())
    assert "running in the project's environment, .venv/bin/python" in done.stderr, done.stderr
    # the command itself ran there: the gate's own usage line, not "megatron-core is not installed"
    assert "not installed" not in done.stderr and "no-such-job" in done.stderr, done.stderr
    assert done.returncode == 2


def test_harness_python_system_keeps_the_interpreter():
    python = _stackless()
    done = bounded([python, "-m", "harness", "verdict", "--job", "no-such-job"], 120,
                   cwd=REPO_ROOT, env=_env(HARNESS_PYTHON="system"))
    assert "running in the project's environment" not in done.stderr
    assert "megatron-core is not installed" in done.stderr and done.returncode != 0
