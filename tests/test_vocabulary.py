"""The harness's words have one home: outcome and expectation words in harness/records.py, tier
and backend words in harness/tiers.py, scenario names in scenarios/. Checked on the source
(an AST scan, nothing imported), like the import rules (tests/test_architecture.py).

Why: a word typed as a literal in a second place drifts from its home unseen; here a new
literal fails with the file and line, and the mend is to import the enum.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from harness.records import Expected, Outcome
from harness.tiers import MARKS, Backend, Tier

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "harness").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])
HOMES = {
    "outcome or expectation": ({w.value for w in (*Outcome, *Expected)}, {"harness/records.py"}),
    "tier or backend": ({w.value for w in (*Tier, *Backend)}, {"harness/tiers.py"}),
}
# Literals that spell such a word but mean another thing: (file, word) -> what it means.
NOT_THE_WORD = {
    ("harness/model/cpu_shims.py", "cpu"): "torch's device name",
    ("harness/rank/setup.py", "cpu"): "torch's device name",
    ("harness/scenario/machine.py", "gpu"): "the versions record's key for the GPU's name",
    ("harness/run/repro.py", "gpu"): "the versions record's key for the GPU's name",
    ("harness/report/verdict_text.py", "gpu"): "the versions record's key for the GPU's name",
    ("bench/junit_times.py", "skipped"): "pytest's JUnit element and result word",
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


def literals(path: Path, words: set[str] | None) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` that is one of ``words`` (None: all)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | _torch_devices(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (words is None or n.value in words)
            and id(n) not in skip]


@pytest.mark.parametrize("kind", sorted(HOMES))
def test_no_vocabulary_literal_outside_its_module(kind):
    words, homes = HOMES[kind]
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel in homes:
            continue
        found += [f"{rel}:{line}: {word!r}" for line, word in literals(path, words)
                  if (rel, word) not in NOT_THE_WORD]
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
    docstring and a torch device are not."""
    src = tmp_path / "x.py"
    src.write_text('"""pass"""\ndef f(r, tier="gpu"):\n    x.to("cpu")\n    return r.outcome == "pass"\n')
    assert sorted(literals(src, {"pass", "gpu", "cpu"})) == [(2, "gpu"), (4, "pass")]
