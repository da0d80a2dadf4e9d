"""The harness's words have one home: outcome, expectation, stage and patch words in
harness/outcomes.py, tier and backend words in harness/tiers.py, scenario names in scenarios/.
Checked on the source of harness/, bench/, tools/ and conftest.py (an AST scan, nothing
imported), like the import rules (tests/test_architecture.py).

Why: a word typed as a literal in a second place drifts from its home unseen; here a new
literal fails with the file and line, and the mend is to import the enum.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from harness.records import Expected, Outcome, Patch, Stage
from harness.tiers import MARKS, Backend, Tier

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "harness").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
                  *(ROOT / "tools").rglob("*.py"), ROOT / "conftest.py"])
HOMES = {
    "outcome or expectation": ({w.value for w in (*Outcome, *Expected)}, {"harness/outcomes.py"}),
    "stage or patch": ({w.value for w in (*Stage, *Patch)}, {"harness/outcomes.py"}),
    "tier or backend": ({w.value for w in (*Tier, *Backend)}, {"harness/tiers.py"}),
}
# Literals that spell such a word but mean another thing: (file, word) -> what it means, or
# (file, word, text on its line) where the file also uses the word itself.
NOT_THE_WORD = {
    ("harness/model/cpu_shims.py", "cpu"): "torch's device name",
    ("harness/rank/setup.py", "cpu"): "torch's device name",
    ("harness/machine.py", "gpu"): "the versions record's key for the GPU's name",
    ("harness/run/repro.py", "gpu"): "the versions record's key for the GPU's name",
    ("harness/report/verdict_text.py", "gpu"): "the versions record's key for the GPU's name",
    ("harness/report/evidence_page.py", "gpu"): "the versions record's key for the GPU's name",
    ("bench/junit_times.py", "skipped"): "pytest's JUnit element and result word",
    # "none" in words: an empty list shown as text, or a library's own option value
    ("bench/grid.py", "none"): "no cells of any width",
    ("harness/golden/repair_plan.py", "none"): "no other files to copy",
    ("harness/report/summary.py", "none", "or 'none'}"): "no recipe in the run",
    ("harness/report/summary.py", "none", 'or "none")'): "no cells in the run",
    ("harness/model/gpt.py", "none"): "megatron-core's moe_router_load_balancing_type",
    ("harness/model/hybrid.py", "none"): "megatron-core's position_embedding_type",
    ("harness/model/modules.py", "none"): "megatron-core's position_embedding_type",
    # fields and names that spell a stage
    ("harness/check/judge.py", "verify", 'get("verify"'): "the rank result's field of figures",
    ("harness/check/rejudge.py", "verify", '{"verify": rec.verify}'): "the rank result's field of figures",
    ("harness/check/rejudge.py", "verify", 'out["verify"]'): "the cell record's field",
    ("harness/rank/stages.py", "verify", '"verify": verify,'): "the rank result's field of figures",
    ("harness/rank/stages.py", "save", "clock.lap("): "a phase of the stage (`save.save` durations)",
    ("harness/rank/stages.py", "load", "clock.lap("): "a phase of the stage (`load.load` durations)",
    ("harness/rank/stages.py", "verify", "clock.lap("): "a phase of the load (`load.verify`)",
    ("harness/rank/validation_probes.py", "save"): "a validation probe's name (probe_save)",
    ("harness/report/jobs.py", "save"): "a key of scenarios/quarantine.toml's [[jobs]]",
    ("harness/report/jobs.py", "load"): "a key of scenarios/quarantine.toml's [[jobs]]",
    ("harness/cli.py", "dump-metadata"): "a command of `python -m harness`",
    ("harness/cli.py", "golden"): "a command of `python -m harness`",
    ("harness/cli.py", "verify"): "the `golden verify` command",
    ("harness/paths.py", "golden"): "the folder of the committed goldens (tests/golden)",
    ("harness/report/matrix_table.py", "fix"): "the matrix column of the patched cells",
    ("harness/report/verdict_words.py", "fix", 'FIX = "fix"'): "the verdict's role of the patched cells",
}
TORCH_DEVICE_CALLS = {"to", "device", "empty", "zeros", "ones", "tensor"}

pytestmark = pytest.mark.cpu


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _torch_devices(tree: ast.AST) -> set[int]:
    """String constants passed as a torch device: ``.to("cpu")``, ``device="cpu"``."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in TORCH_DEVICE_CALLS:
            out |= {id(a) for a in node.args if isinstance(a, ast.Constant)}
        out |= {id(k.value) for k in node.keywords
                if k.arg in ("device", "map_location") and isinstance(k.value, ast.Constant)}
    return out


def _attribute_names(tree: ast.AST) -> set[int]:
    """The name in ``getattr(x, "load")``: a Python attribute, never a word."""
    return {id(node.args[1]) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr")
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)}


def literals(path: Path, words: set[str] | None) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` that is one of ``words`` (None: all)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | _torch_devices(tree) | _attribute_names(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (words is None or n.value in words)
            and id(n) not in skip]


def not_the_word(rel: str, word: str, line: str) -> bool:
    return (rel, word) in NOT_THE_WORD or any(
        key[:2] == (rel, word) and key[2] in line for key in NOT_THE_WORD if len(key) == 3)


@pytest.mark.parametrize("kind", sorted(HOMES))
def test_no_vocabulary_literal_outside_its_module(kind):
    words, homes = HOMES[kind]
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel in homes:
            continue
        lines = path.read_text().splitlines()
        found += [f"{rel}:{line}: {word!r}" for line, word in literals(path, words)
                  if not not_the_word(rel, word, lines[line - 1])]
    assert not found, (f"{kind} words typed as literals (import them from "
                       f"{', '.join(sorted(homes))}):\n" + "\n".join(found))


def test_no_scenario_name_in_code():
    names = set()
    for p in (ROOT / "scenarios").glob("*.toml"):
        name = tomllib.loads(p.read_text()).get("name")
        if isinstance(name, str):
            names.add(name)
    found = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in SOURCES
             for line, text in literals(p, None) if text.split("[", 1)[0].rstrip("*") in names]
    assert names and not found, "scenario names in code (scenarios/selections.toml holds them):\n" + "\n".join(found)


def test_each_tier_has_its_registered_pytest_mark():
    """conftest.py marks a tier's cells with harness/tiers.py's MARKS; pytest runs with
    --strict-markers, so each must be registered in pyproject.toml."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0].strip() for line in ini["markers"]}
    assert set(MARKS) == set(Tier) and set(MARKS.values()) <= registered, (MARKS, registered)


def test_the_scan_sees_what_it_must_refuse(tmp_path):
    """The scan can fail: a comparison with an outcome and a tier default are found; a
    docstring, a torch device and an attribute name are not."""
    src = tmp_path / "x.py"
    src.write_text('"""pass"""\ndef f(r, tier="gpu"):\n    x.to("cpu")\n    getattr(r, "load")\n'
                   '    return r.outcome == "pass"\n')
    assert sorted(literals(src, {"pass", "gpu", "cpu", "load"})) == [(2, "gpu"), (5, "pass")]
