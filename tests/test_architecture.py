"""The import rules of docs/ARCHITECTURE.md, checked on the source (no harness module is imported).

Why: the controller/rank boundary and "judging starts no process" are what make the harness
readable and its teardown bounded; an import that crosses them is caught here, not in review.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent.parent / "harness"
PACKAGES = ("topology", "scenario", "model", "rank", "launch", "check", "golden", "run", "report", "fix")
# package -> harness packages it must never import (directly, at any depth of a function)
FORBIDDEN = {
    "topology": set(PACKAGES) - {"topology"},
    "model": set(PACKAGES) - {"model", "topology"},
    "check": {"launch", "run", "report", "rank"},
    "rank": {"run", "report", "launch"},
    "launch": {"run", "report"},
    "report": {"launch"},
    "fix": set(PACKAGES) - {"fix"},
}
# Modules that start processes; pure judging never imports them.
PROCESS_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures"}

pytestmark = pytest.mark.cpu


def _package(path: Path) -> str:
    """harness/<pkg>/x.py -> pkg; a top-level module (cli, paths, records, ...) -> its own name."""
    rel = path.relative_to(HARNESS)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path, pkg: str | None = None) -> set[str]:
    """Every module named by an import statement in ``path`` (function bodies included),
    relative ones resolved against ``pkg`` (default: the package the file sits in)."""
    out = set()
    pkg = pkg or ".".join(("harness", *path.relative_to(HARNESS).parent.parts))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def _graph() -> dict[str, dict[str, set[str]]]:
    """package -> imported harness package -> the files that import it."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in HARNESS.rglob("*.py"):
        src = _package(path)
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "harness" and len(parts) > 1 and parts[1] != src:
                graph[src][parts[1]].add(str(path.relative_to(HARNESS.parent)))
    return graph


def test_every_module_sits_in_a_package_or_is_a_known_top_level_module():
    top = {p.stem for p in HARNESS.glob("*.py")}
    assert top == {"__init__", "__main__", "cli", "commands", "machine", "paths", "jsonfile", "records", "tiers", "switches", "bounded", "outcomes"}, top
    assert {p.name for p in HARNESS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(PACKAGES)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_rules(package):
    used = _graph()[package]
    broken = {dep: sorted(files) for dep, files in used.items() if dep in FORBIDDEN[package]}
    assert not broken, f"harness/{package}/ must not import {sorted(broken)}: {broken}"


def test_judging_starts_no_process():
    offenders = {str(p.relative_to(HARNESS.parent)): sorted(_imports(p) & PROCESS_MODULES)
                 for p in (HARNESS / "check").rglob("*.py") if _imports(p) & PROCESS_MODULES}
    assert not offenders, offenders


def test_no_import_cycle_between_packages():
    graph = {src: set(deps) for src, deps in _graph().items()}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            visit(dep)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    detail = {f"{a} -> {b}": sorted(_graph()[a][b]) for c in cycles for a, b in zip(c, c[1:])}
    assert not cycles, f"import cycles {[' -> '.join(c) for c in cycles]}; edges: {detail}"


def test_the_rule_checker_sees_what_it_must_refuse(tmp_path):
    """The checker can fail: a lazy relative import from check/ into launch/ and a process
    module are both resolved and named."""
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from ..launch import torchrun\n    import subprocess\n")
    mods = _imports(src, pkg="harness.check")
    assert {"harness.launch", "harness.launch.torchrun", "subprocess"} <= mods
    assert "launch" in FORBIDDEN["check"] and mods & PROCESS_MODULES


FIX_PACKAGE = HARNESS.parent / "moe_ckpt_fix"


def test_the_fix_package_imports_nothing_of_the_harness():
    """moe_ckpt_fix is installed alone, as the moe-ckpt-fix wheel (docs/fix.md)."""
    found = {str(p.relative_to(HARNESS.parent)): sorted(m for m in _imports(p, pkg="moe_ckpt_fix")
                                                         if m.split(".")[0] == "harness")
             for p in FIX_PACKAGE.rglob("*.py")}
    assert FIX_PACKAGE.joinpath("__init__.py").is_file()
    offenders = {k: v for k, v in found.items() if v}
    assert not offenders, offenders


def _module_imports(path: Path) -> set[str]:
    """Modules imported as modules (``import a.b``, ``from a.b import c``): not the names taken."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
    return out


def test_the_fix_submodules_are_imported_by_their_own_name():
    """``harness.fix`` is the module object ``moe_ckpt_fix``; ``import harness.fix.<sub>`` would
    load a second copy of ``<sub>`` (its own ``_applied`` state), so it is ``moe_ckpt_fix.<sub>``."""
    root = HARNESS.parent
    files = [p for d in ("harness", "tests", "tools", "bench") for p in (root / d).rglob("*.py")]
    found = {str(p.relative_to(root)): sorted(m for m in _module_imports(p)
                                              if m.startswith("harness.fix."))
             for p in [*files, root / "conftest.py"]}
    offenders = {k: v for k, v in found.items() if v}
    assert not offenders, offenders


RELEASES = FIX_PACKAGE / "releases.py"
# A release or a band of releases spelled as a value: "0.47.0", "0.48.0rc1", "==0.15.*", "<0.47.0",
# "==0.16.* || ==0.19.2". Prose that cites a release's source lines is not a value.
_RELEASE = r"\s*([<>=!~]=?=?\s*)?\d+\.\d+\.(\d+(rc\d+)?|\*|x)\s*"
RELEASE_VALUE = re.compile(rf"{_RELEASE}(\|\|{_RELEASE})*")


def test_a_release_is_spelled_only_in_the_release_table():
    """moe_ckpt_fix/releases.py is the one place a release version is a value; everything else
    imports its names."""
    found = []
    for path in [*HARNESS.rglob("*.py"), *FIX_PACKAGE.rglob("*.py")]:
        if path == RELEASES:
            continue
        tree = ast.parse(path.read_text())
        own = {id(n.value) for n in ast.walk(tree)  # ``__version__ = ...``: the wheel's own version
               if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in n.targets)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and RELEASE_VALUE.fullmatch(node.value) and id(node) not in own):
                found.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno} {node.value!r}")
    assert not found, found


def _module_name(path: Path) -> str:
    rel = path.relative_to(HARNESS.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _module_graph() -> dict[str, set[str]]:
    """module -> the modules of harness/ and moe_ckpt_fix/ it imports (function bodies included):
    ``from a import b`` names the module a.b where it is one, else a; a package's __init__ is the
    package's own node, and ``harness.fix`` is ``moe_ckpt_fix``."""
    files = [*HARNESS.rglob("*.py"), *FIX_PACKAGE.rglob("*.py")]
    known = {_module_name(p) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = _module_name(path)
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for t in targets:
                t = "moe_ckpt_fix" + t[len("harness.fix"):] if t.split(".")[:2] == ["harness", "fix"] else t
                while t and t not in known:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    """No module reaches itself through imports, counting imports inside functions: a lazy import
    that closes a circle is still a circle a reader has to hold in mind."""
    cycles = _cycles(_module_graph())
    assert not cycles, cycles


def test_the_module_cycle_checker_sees_a_lazy_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "harness.check.decision" in _module_graph()["harness.run.cell"]


MAX_LINES = 400


def test_no_module_is_over_400_lines():
    sizes = {str(p.relative_to(HARNESS.parent)): len(p.read_text().splitlines())
             for p in [*HARNESS.rglob("*.py"), *FIX_PACKAGE.rglob("*.py")]}
    over = {k: v for k, v in sorted(sizes.items()) if v > MAX_LINES}
    assert not over, over


ROOT = HARNESS.parent
# A tracker number in code or a test's name says which ticket made a thing, not what it is: the
# word issue with a number after it (a space, "-", "_" or nothing between), or a bare hash and
# number, unless that names an upstream project's issue or pull request (Megatron-LM, NVIDIA/
# Model-Optimizer, a PR) or is a colour. The examples below are split so this file passes itself.
TRACKER = re.compile(r"(?<![a-z])issues?[ _-]?\d+|(?<![\w/#])#\d{2,}\b(?![0-9a-f])", re.IGNORECASE)
UPSTREAM = re.compile(r"(Model-Optimizer|Megatron-LM|TransformerEngine|pytorch|PR)( issue)? ?#\d+|/#\d+"
                      r"|Model-Optimizer#\d+", re.IGNORECASE)


def _tracker_numbers(text: str) -> list[str]:
    return [m[0] for m in TRACKER.finditer(UPSTREAM.sub("", text))]


def test_no_tracker_number_in_code_or_test_names():
    files = [p for d in ("harness", "moe_ckpt_fix", "tests") for p in (ROOT / d).rglob("*.py")]
    found = {}
    for path in [*files, ROOT / "conftest.py"]:
        rel = str(path.relative_to(ROOT))
        hits = _tracker_numbers(rel) + [f"{n}: {hit}" for n, line in enumerate(path.read_text().splitlines(), 1)
                                        for hit in _tracker_numbers(line)]
        if hits:
            found[rel] = hits
    assert not found, found


def test_the_tracker_check_tells_ours_from_upstream():
    ours = ["(iss" "ue 52 item 3)", "Iss" "ue 25's figure", "queues/next-iss" "ue54.txt",
            "test_kinds_iss" "ue52.py", "see #" "63"]
    upstream = ["NVIDIA/Model-Optimizer#2209", "Model-Optimizer issue #2209", "Megatron-LM #2053/#2506",
                "candidate fix PR #2319", '"#9467bd"', "Megatron-LM #6324"]
    assert all(_tracker_numbers(t) for t in ours), [t for t in ours if not _tracker_numbers(t)]
    assert not any(_tracker_numbers(t) for t in upstream), [t for t in upstream if _tracker_numbers(t)]
