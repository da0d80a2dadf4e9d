"""Apply harness.fix in any Python process, with no code change: the environment route.

    MOE_CKPT_FIX=1 PYTHONPATH=<repo>/harness/fix/autoload:$PYTHONPATH torchrun ... pretrain_gpt.py ...

Python imports the first ``sitecustomize`` on its path at start-up; this one
1. chains to the next ``sitecustomize`` on ``sys.path`` (a distro's or a venv's), so nothing that
   was already customised is lost;
2. when ``MOE_CKPT_FIX`` is on (below), arms a one-shot import hook that calls
   ``harness.fix.apply()`` right after the ``modelopt.torch`` package has finished importing
   (its ``__init__`` imports every subpackage, quantization plugins included). Deferring it
   keeps processes that never import modelopt (torchrun's launcher, pip, ...) free of the
   torch/megatron import cost and of any failure. It fires on ``modelopt.torch``, the outermost
   modelopt import, on purpose: modelopt imports its plugins inside ``import_plugin(...)``,
   which turns every exception into a warning (measured: a refusal raised after
   ``modelopt.torch.quantization.plugins`` was swallowed by ``distill/plugins``). A refusal
   (wrong modelopt version, no Transformer Engine) must stop the run, not vanish.

The switch fails closed: ``MOE_CKPT_FIX`` is on for ``1``/``true``/``yes``, off when unset, empty
or ``0``/``false``/``no`` (case-insensitive, surrounding blanks ignored). Any other value stops
the process at start-up with one line on stderr and exit code 2: a typo must not leave a job
silently unpatched. A refusal of ``harness.fix.apply()`` stops it with one line and exit code 3.
Both stop through ``os._exit``: a ``SystemExit`` raised here is a fatal error with a traceback
while ``site`` runs, and an exception raised from the import can be caught by the importer.

The repository root (three levels up) is appended to ``sys.path`` so ``harness.fix`` imports.
Set ``MOE_CKPT_FIX_VERBOSE=1`` to print what was patched (global rank 0 only).
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
_TRIGGER = "modelopt.torch"
_VAR = "MOE_CKPT_FIX"
_ON = ("1", "true", "yes")
_OFF = ("", "0", "false", "no")
EXIT_BAD_VALUE = 2
EXIT_REFUSED = 3


def _stop(code: int, line: str):
    """One line on stderr, then end the process with ``code`` (no traceback, nothing to catch)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.write(2, (" ".join(line.split()) + "\n").encode("utf-8", "replace"))
    os._exit(code)


def _switch() -> bool:
    """Whether ``MOE_CKPT_FIX`` asks for the fix; any value outside the accepted ones stops."""
    raw = os.environ.get(_VAR, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    _stop(EXIT_BAD_VALUE,
          f"[{_VAR}] refusing {_VAR}={raw!r}: accepted values are {'/'.join(_ON)} (apply the fix) "
          f"or unset/empty/{'/'.join(_OFF[1:])} (do not), case-insensitive")


def _chain_next_sitecustomize():
    """Execute the next sitecustomize on sys.path, which this file shadows."""
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_moe_ckpt_fix_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _apply_fix():
    if _REPO not in sys.path:
        sys.path.append(_REPO)
    import harness.fix

    try:
        description = harness.fix.apply()
    except harness.fix.Refused as err:
        _stop(EXIT_REFUSED, f"[{_VAR}] {type(err).__name__}: {err}")
    if os.environ.get("MOE_CKPT_FIX_VERBOSE") == "1" and os.environ.get("RANK", "0") == "0":
        print(f"[MOE_CKPT_FIX] {description}", file=sys.stderr, flush=True)


class _LoaderThenFix(importlib.abc.Loader):
    """Delegate to the real loader, then apply the fix once the module body has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _apply_fix()


class _ApplyAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from recursing
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderThenFix(spec.loader)
        return spec


_wanted = _switch()
try:
    _chain_next_sitecustomize()
finally:
    if _wanted:
        if _TRIGGER in sys.modules:  # imported by the chained sitecustomize already
            _apply_fix()
        else:
            sys.meta_path.insert(0, _ApplyAfterImport())
