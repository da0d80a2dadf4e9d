"""Packages a rank refuses to import: ``HARNESS_RANK_TRIM=transformers,torchvision,numba``.

Why: on the GPU host ModelOpt's optional plugins (``modelopt.torch.utils.import_plugin``, which
skips a plugin on ModuleNotFoundError) pull in packages no stage uses, about 3 of a rank's
25 s of imports (docs/benchmarks.md, "Imports, GPU"); with 24 ranks importing at once on 16
cores that is on make repro's critical path. A refused package raises ModuleNotFoundError, as
if it were not installed, the way ``bench/import_profile.py --block`` measures it. Opt-in: unset
or empty refuses nothing; the variable is part of a warm pool's key (HARNESS_ prefix).
"""
from __future__ import annotations

import os
import sys

VAR = "HARNESS_RANK_TRIM"


class _Refuse:
    """A meta-path finder that makes the named top-level packages look absent."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} refused by {VAR} (harness/rank/trim.py)", name=name)
        return None


# Packages every rank imports: refusing one leaves no stage that can run.
NEEDED = ("torch", "numpy", "megatron", "modelopt", "harness", "moe_ckpt_fix")


def _names(environ=os.environ) -> set[str]:
    return {n.strip() for n in environ.get(VAR, "").split(",") if n.strip()}


def problem(environ=os.environ) -> str | None:
    """One line when HARNESS_RANK_TRIM refuses a package every rank needs (the controller checks
    at start-up: each stage would die before its launcher's log, every cell failing), else None."""
    needed = sorted(_names(environ) & set(NEEDED))
    if not needed:
        return None
    return (f"{VAR}={environ.get(VAR)!r} refuses {', '.join(needed)}, which every rank imports: "
            f"no stage could run (it is for optional plugins: transformers,torchvision,numba)")


def install() -> set[str]:
    """Refuse the packages named in HARNESS_RANK_TRIM in this process (once); returns them."""
    names = _names()
    if names and not any(isinstance(f, _Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refuse(names))
    return names
