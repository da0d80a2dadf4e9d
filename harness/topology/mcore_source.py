"""Pure-Python definitions of the installed megatron-core, taken from its source files without
importing megatron.core.

Why: importing megatron.core costs 3-6 s on the 2-core machine (torch, its compiled fusions,
the Transformer Engine probe), and the controller's read-only commands (``verdict``, the gate)
need only two pure-Python pieces of it: the rank layout of ``parallel_state.RankGenerator``
(coords.py) and the values of ``dist_checkpointing.validation.StrictHandling``
(model/checkpoint.py). This module runs exactly those top-level definitions of the installed
file, after the file's own standard-library imports, so they are megatron-core's code of the
installed version, not a copy that could drift. Where a file or a definition is not there, or
it does not run that way, it gives None and the caller imports megatron-core as before; tests
(tests/test_mcore_source.py) compare both ways.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path


def source_file(module: str) -> Path | None:
    """The installed ``megatron/core/<module>.py`` (``module``: dotted, below megatron.core), or
    None. ``find_spec("megatron.core")`` imports only the namespace package ``megatron``."""
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def _stdlib_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names)
    return (isinstance(node, ast.ImportFrom) and not node.level and node.module is not None
            and node.module.split(".")[0] in sys.stdlib_module_names)


@functools.cache
def definitions(module: str, names: tuple[str, ...]) -> dict[str, object] | None:
    """``names`` (top-level functions and classes of ``megatron.core.<module>``) run from the
    installed source in a namespace of their own, or None (not found, or failed to run)."""
    path = source_file(module)
    if path is None:
        return None
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    wanted = [n for n in tree.body
              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    if sorted(n.name for n in wanted) != sorted(names):
        return None
    body = [n for n in tree.body if _stdlib_import(n)] + wanted
    namespace: dict[str, object] = {"__name__": f"megatron.core.{module} (source)"}
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    except Exception:  # noqa: BLE001 - the caller imports megatron-core instead
        return None
    return {name: namespace[name] for name in names}
