"""``python -m harness upstream CELL --results R`` (harness/report/upstream.py): the skeleton of a
standalone reproducer of a failing cell names the cell's save and load topologies, its recipe and
the versions it was recorded on, is valid Python, and imports nothing of this repository; a bad
cell id or a missing results file is one line and exit 2."""
from __future__ import annotations

import ast
import os
import sys

import pytest

from harness.paths import REPO_ROOT
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

RESULTS = REPO_ROOT / "tests/data/runs/20261206-215127-recipes-0.48.0rc1-none.results.json"
CELL = "gpu-super-modules-pp-learned-witness[save=tp2-etp1-ep2-pp1,load=tp2-etp1-ep2-pp2]"
STANDALONE = {"argparse", "copy", "datetime", "os", "re", "sys", "traceback", "torch",
              "megatron", "modelopt", "transformer_engine"}


def _cli(*args: str):
    return bounded([sys.executable, "-W", "ignore", "-m", "harness", "upstream", *args], 120,
                   cwd=REPO_ROOT, env=dict(os.environ))


def test_the_skeleton_of_a_failing_cell_names_its_topologies_recipe_and_versions(tmp_path):
    out = tmp_path / "repro.py"
    done = _cli(CELL, "--results", str(RESULTS), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    tree = ast.parse(compile(text, str(out), "exec", flags=ast.PyCF_ONLY_AST))
    doc = ast.get_docstring(tree)
    assert CELL in doc and RESULTS.name in doc
    assert "Save topology: tp2-etp1-ep2-pp1 (2 ranks)" in doc
    assert "Load topology: tp2-etp1-ep2-pp2 (4 ranks)" in doc
    for version in ("megatron-core 0.19.2", "nvidia-modelopt 0.48.0rc1", "torch 2.11.0",
                    "transformer-engine 2.20.2"):
        assert version in doc, version
    assert "key embedding.position_embeddings.weight" in doc
    consts = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    assert consts["RECIPE"] == "modelopt:models/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16/ptq/nvfp4-mse"
    assert consts["SAVE"] == {"tp": 2, "etp": 1, "ep": 2, "pp": 1}
    assert consts["LOAD"] == {"tp": 2, "etp": 1, "ep": 2, "pp": 2}
    assert consts["MODEL"]["mtp_num_layers"] == 1 and consts["MODEL"]["hidden_size"] == 256
    assert consts["FAILED_STAGE"] == "load"
    assert consts["EXCEPTION"].endswith("CheckpointingException")
    imported = {(a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert imported <= STANDALONE, imported - STANDALONE


def test_without_out_the_skeleton_goes_to_stdout():
    done = _cli(CELL, "--results", str(RESULTS))
    assert done.returncode == 0, done.stderr
    compile(done.stdout, "repro.py", "exec")
    assert "tp2-etp1-ep2-pp2" in done.stdout


@pytest.mark.parametrize("cell_id, results, words", [
    ("no-such-cell", RESULTS, ["no cell 'no-such-cell'", "failing cells there include"]),
    (CELL, REPO_ROOT / "tests/data/runs/no-such.results.json", ["no such results file"]),
    # a passing cell: nothing to reproduce
    ("gpu-super-modules-pp-learned-witness[save=tp2-etp1-ep2-pp1,save-only]",
     RESULTS, None),
])
def test_a_bad_cell_or_results_file_is_one_line_and_exit_2(cell_id, results, words):
    done = _cli(cell_id, "--results", str(results))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert done.stdout == ""
    for w in words or []:
        assert w in lines[0], lines[0]
