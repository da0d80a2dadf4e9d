"""Where ModelOpt's CUDA extensions are built: one directory per ModelOpt version.

Why: torch builds an extension by its name (``modelopt_cuda_ext_fp8``, which the MSE recipes
need) in one directory under ``TORCH_EXTENSIONS_DIR`` and takes a lock file there while it
builds. Two ModelOpt versions on one host (a matrix run: 0.47.0 beside 0.48.0rc1) rebuild each
other's copy on every first load, their ranks waiting on that lock, and a build killed mid-way (a
cell's timeout) leaves the lock behind, so every later load waits on it forever. Seen on the
H100, 2026-12-06 (docs/runs/20261206-1003-device-session.md): ranks "Loaded extension
modelopt_cuda_ext_fp8 in 68.5 seconds", two cells cut while waiting, then a precompile that
waited 12 minutes on a stale lock.

``python -m harness.launch.extensions`` builds the FP8 extension into the stages' directory;
``harness run`` does it once, bounded, before GPU cells of a recipe that may need it
(``warm_up``), so no stage pays the build (41-73 s on the H100) inside its timeout.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from harness import bounded
from harness.machine import version
from harness.model.recipes import DEFAULT_RECIPE

WARM_UP_TIMEOUT_S = 300  # a first build took 73 s on the H100; a stale lock waits forever


def extensions_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The ``TORCH_EXTENSIONS_DIR`` for stages of this ModelOpt version: a subdirectory named
    after it, under the user's ``TORCH_EXTENSIONS_DIR`` when set, else under torch's default
    root. The name also carries the Python and torch versions, as torch's default root carries
    its Python and CUDA tags: a build for another torch must not be loaded. Idempotent: a
    directory already so named is kept."""
    name = (f"nvidia-modelopt-{version('nvidia-modelopt') or 'absent'}"
            f"-py{sys.version_info[0]}{sys.version_info[1]}-torch{version('torch') or 'absent'}")
    # torch's default root on Linux (cpp_extension.get_default_build_root): the user cache's
    root = environ.get("TORCH_EXTENSIONS_DIR") or str(
        Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions")
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


def may_need_fp8_extension(recipes_on_cuda: set[str]) -> bool:
    """Do cells on CUDA with these recipes possibly build the FP8 extension? The default recipe
    (dynamic NVFP4, max calibration) uses ModelOpt's Triton kernel and builds none; MSE
    calibration and FP8 quantizers do, and which a recipe uses is read from it only at
    calibration, so any other recipe counts."""
    return any(r != DEFAULT_RECIPE for r in recipes_on_cuda)


def warm_up(timeout_s: float = WARM_UP_TIMEOUT_S) -> str:
    """Build the FP8 extension in a child, bounded (its group killed past ``timeout_s``);
    returns the line to print. A failure is not fatal: a stage then builds it itself."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": extensions_dir()}
    done = bounded.run([sys.executable, "-m", "harness.launch.extensions"], timeout_s, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    last = ((done.stdout or "").strip().splitlines() or [""])[-1][:200]
    if done.timed_out:
        return (f"ModelOpt FP8 extension: not built within {timeout_s:.0f} s (killed); a stage "
                f"that needs it builds it, or waits on a stale 'lock' in {env['TORCH_EXTENSIONS_DIR']}")
    return last if done.returncode == 0 else f"ModelOpt FP8 extension: not available ({last})"


# Other ModelOpt extensions a recipe may build at its first fake quant, by the name
# PRECOMPILE_VAR gives them (comma-separated; default none): per-channel / per-block integer
# recipes (INT8, INT4 blockwise) use modelopt_cuda_ext (tensor_quant.py fake_quant_impl), MX
# formats other than FP4 use modelopt_cuda_ext_mx (the integer and MX recipes' scenarios).
PRECOMPILE_VAR = "HARNESS_PRECOMPILE_EXTENSIONS"
EXTRA_EXTENSIONS = {"base": "get_cuda_ext", "mx": "get_cuda_ext_mx"}


def extra_names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The extra extensions PRECOMPILE_VAR asks for, in order; an unknown name is refused."""
    names = [n.strip() for n in environ.get(PRECOMPILE_VAR, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in EXTRA_EXTENSIONS]
    if unknown:
        raise SystemExit(f"{PRECOMPILE_VAR}: unknown extension(s) {unknown}; "
                         f"known: {', '.join(EXTRA_EXTENSIONS)}")
    return names


def precompile_extra(names: list[str]) -> int:
    """Build (or find) the extra extensions in this version's directory; 0 when all load."""
    import modelopt.torch.quantization.extensions as ext

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    failed = 0
    for name in names:
        start = time.monotonic()
        ok = getattr(ext, EXTRA_EXTENSIONS[name])(raise_if_failed=False) is not None
        print(f"modelopt extension {name} in {os.environ['TORCH_EXTENSIONS_DIR']}: "
              f"{'loaded' if ok else 'NOT available'} after {time.monotonic() - start:.1f} s")
        failed += not ok
    return 1 if failed else 0


def main() -> int:
    extra = extra_names()
    return precompile_extra(extra) | precompile_fp8()  # fp8 last: its line is the one printed


if __name__ == "__main__":
    raise SystemExit(main())
