"""``python -m harness``, run by the project's environment.

Why: the README and ``make repro`` print commands as ``python -m harness ...``; the stack
(torch, megatron-core, ModelOpt) lives in the project's ``.venv``, which ``make`` bootstraps
(tools/python.sh). Started by an interpreter without it, the same command runs again with
``.venv``'s Python, saying so in one line on stderr. ``HARNESS_PYTHON=system`` (a GPU host or
image with its own stack) keeps the interpreter it was started with.
"""
import importlib.util
import os
import sys

from .paths import REPO_ROOT


def _project_python() -> str | None:
    """``.venv``'s Python when this interpreter lacks the stack and that one exists."""
    if os.environ.get("HARNESS_PYTHON") == "system":
        return None
    if all(importlib.util.find_spec(name) for name in ("torch", "megatron")):
        return None
    venv = REPO_ROOT / ".venv"
    python = venv / "bin" / "python"
    if not python.is_file() or os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return None  # no project environment, or this is it
    return str(python)


if __name__ == "__main__":
    project = _project_python()
    if project:
        print(f"python -m harness: {sys.executable} lacks torch/megatron-core; running in the "
              f"project's environment, {os.path.relpath(project)}", file=sys.stderr)
        sys.stdout.flush()
        os.execv(project, [project, "-m", "harness", *sys.argv[1:]])
    from .cli import main

    raise SystemExit(main())
