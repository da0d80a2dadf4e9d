"""The fix through the environment, from a checkout of this repository (no wheel installed):

    MOE_CKPT_FIX=1 PYTHONPATH=<repo>/harness/fix/autoload:$PYTHONPATH torchrun ... pretrain_gpt.py ...

A job that has no checkout installs the wheel instead (``make fix-wheel``; README "Using the fix"):
its ``moe_ckpt_fix.pth`` does what this file does. Python imports the first
``sitecustomize`` on its path at start-up; this one
1. when ``MOE_CKPT_FIX`` is set, reads the switch (``moe_ckpt_fix/autoload.py``: a value it does
   not accept stops the process here, with one line);
2. chains to the next ``sitecustomize`` on ``sys.path`` (a distro's or a venv's), so nothing that
   was already customised is lost;
3. when the switch is on, arms the hook that applies the fix after ``modelopt.torch`` imports.

With ``MOE_CKPT_FIX`` unset or empty it only chains. Otherwise the repository root (three
levels up) is appended to ``sys.path`` so ``moe_ckpt_fix`` imports.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def _chain_next_sitecustomize():
    """Execute the next sitecustomize on sys.path, which this file shadows."""
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_moe_ckpt_fix_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_autoload = None
if os.environ.get("MOE_CKPT_FIX", "").strip():
    if _REPO not in sys.path:
        sys.path.append(_REPO)
    from moe_ckpt_fix import autoload as _autoload
_wanted = _autoload is not None and _autoload.switch()
try:
    _chain_next_sitecustomize()
finally:
    if _wanted:
        _autoload.arm()
