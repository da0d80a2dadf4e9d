"""Where ModelOpt's CUDA extensions are built: one directory per ModelOpt version.

Why: torch builds an extension by its name (``modelopt_cuda_ext_fp8``, which the MSE recipes
need) in one directory under ``TORCH_EXTENSIONS_DIR`` and takes a lock file there while it
builds. Two ModelOpt versions on one host (a matrix run: 0.47.0 beside 0.48.0rc1) rebuild each
other's copy on every first load, their ranks waiting on that lock, and a build killed mid-way (a
cell's timeout) leaves the lock behind, so every later load waits on it forever. Seen on the
H100, 2026-12-06 (docs/runs/20261206-1003-device-session.md): ranks "Loaded extension
modelopt_cuda_ext_fp8 in 68.5 seconds", two cells cut while waiting, then a precompile that
waited 12 minutes on a stale lock.

``python -m harness.model.extensions`` builds the FP8 extension into the stage's directory
once, before any cell, so no stage pays the build inside its timeout.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from harness.machine import version

# torch.utils.cpp_extension.get_default_build_root() on Linux: the user cache's torch_extensions
_TORCH_DEFAULT_ROOT = ("XDG_CACHE_HOME", Path.home() / ".cache", "torch_extensions")


def extensions_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The ``TORCH_EXTENSIONS_DIR`` for stages of this ModelOpt version: a subdirectory named
    after it, under the user's ``TORCH_EXTENSIONS_DIR`` when set, else under torch's default
    root. Idempotent: a directory already named for this version is kept."""
    name = f"nvidia-modelopt-{version('nvidia-modelopt') or 'absent'}"
    var, home_cache, leaf = _TORCH_DEFAULT_ROOT
    root = environ.get("TORCH_EXTENSIONS_DIR") or str(Path(environ.get(var) or home_cache) / leaf)
    return root if Path(root).name == name else str(Path(root) / name)


def precompile_fp8() -> int:
    """Build (or find) ModelOpt's FP8 extension in this version's directory; 0 when it loads."""
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    from modelopt.torch.quantization.extensions import get_cuda_ext_fp8

    start = time.monotonic()
    ok = get_cuda_ext_fp8(raise_if_failed=False) is not None
    print(f"modelopt_cuda_ext_fp8 in {os.environ['TORCH_EXTENSIONS_DIR']}: "
          f"{'loaded' if ok else 'NOT available'} after {time.monotonic() - start:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(precompile_fp8())
