"""Bad inputs to single commands that once succeeded silently, failed late or named the wrong
option: each now gets one line naming the value, exit 2 (the command's --help "usage" code),
no traceback and nothing left behind.

Why: an exit 0 over an empty table or over skipped cells turns a CI step green with nothing
checked; a refusal that names an option not given sends the reader to the wrong flag.
"""
from __future__ import annotations

import sys

import pytest

from harness.machine import gpu_count
from harness.paths import REPO_ROOT
from tests.helpers import harness_cli, one_error_line

pytestmark = pytest.mark.cpu


def test_verdict_mcore_alone_names_mcore():
    line = one_error_line(harness_cli("verdict", "--mcore", "0.19.2", timeout=180),
                          "--mcore needs --modelopt", code=2)
    assert not line.startswith("error: --modelopt"), line


@pytest.mark.parametrize("ref, words", [
    ("mtq:NOPE", ["recipe mtq:NOPE", "_CFG"]),
    ("file:{tmp}/nonexistent.yaml", ["nonexistent.yaml", "not loadable"]),
])
@pytest.mark.slow  # a real survey per bad name
def test_recipes_refuses_a_recipe_that_is_none(tmp_path, ref, words):
    ref = ref.format(tmp=tmp_path)
    done = harness_cli("recipes", ref, timeout=180)
    one_error_line(done, *words, code=2)
    assert "Recipes of" not in done.stdout  # no table of 0


def test_matrix_refuses_a_modelopt_that_is_no_version_before_any_environment(tmp_path):
    root = tmp_path / "results"
    done = harness_cli("--results-root", str(root), "matrix", "--modelopt", "notaversion", timeout=180)
    one_error_line(done, "--modelopt 'notaversion'", "not a version", code=2)
    assert not root.exists()  # no matrix-* run folder
    assert not (REPO_ROOT / ".venv-modelopt-notaversion").exists()


@pytest.mark.skipif(gpu_count() > 0, reason="a GPU host can run the gpu tiers")
def test_a_run_of_cells_none_of_which_can_run_here_is_refused(tmp_path):
    root = tmp_path / "results"
    done = harness_cli("--results-root", str(root), "run", "--scenario", "gpu-witness", "--cells",
                       "*save=tp2-etp1-ep2*", timeout=180)
    one_error_line(done, "none of the 8 cells can run here", "needs a CUDA GPU", code=2)
    assert not root.exists()


@pytest.mark.skipif(gpu_count() > 0, reason="a GPU host can make a golden")
def test_golden_make_without_a_gpu_is_refused_up_front(tmp_path):
    out = tmp_path / "gm"
    done = harness_cli("golden", "make", str(out), "--topology", "tp1-etp1-ep1", timeout=180)
    one_error_line(done, "golden make --tier gpu-shared", "needs a CUDA GPU", "nothing written", code=2)
    assert not out.exists()


def test_another_python_without_megatron_is_sent_to_the_projects_environment(monkeypatch, tmp_path):
    """``python3 -m harness`` (the README's form, a Python outside .venv): the line names the
    project's environment, not advice (``make test``) that changes nothing."""
    from harness import machine

    if not (REPO_ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no project environment (.venv) in this checkout")
    monkeypatch.setattr(machine, "version", lambda dist: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # another Python's prefix
    line = machine.version_problem().line
    assert "not installed in this Python" in line and "`.venv/bin/python -m harness" in line
    monkeypatch.setattr(sys, "prefix", str(REPO_ROOT / ".venv"))  # the project's own: no loop
    assert ".venv/bin/python" not in machine.version_problem().line
