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


def install() -> set[str]:
    """Refuse the packages named in HARNESS_RANK_TRIM in this process (once); returns them."""
    names = {n.strip() for n in os.environ.get(VAR, "").split(",") if n.strip()}
    if names and not any(isinstance(f, _Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refuse(names))
    return names
