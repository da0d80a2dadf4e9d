"""Apply the fix in any Python process, with no code change: ``MOE_CKPT_FIX=1`` in the environment.

Started at interpreter start-up, by the wheel's ``moe_ckpt_fix.pth`` (site-packages runs it) or
by the repository's ``harness/fix/autoload/sitecustomize.py``; both call ``install()`` only when
``MOE_CKPT_FIX`` is set to something, so with it unset this module is not even imported.

``install()`` reads the switch and, when it is on, arms a one-shot import hook that calls
``moe_ckpt_fix.apply()`` right after the ``modelopt.torch`` package has finished importing (its
``__init__`` imports every subpackage, quantization plugins included). Deferring it keeps
processes that never import modelopt (torchrun's launcher, pip, ...) free of the
torch/megatron import cost and of any failure. It fires on ``modelopt.torch``, the outermost
modelopt import, on purpose: modelopt imports its plugins inside ``import_plugin(...)``, which
turns every exception into a warning (measured: a refusal raised after
``modelopt.torch.quantization.plugins`` was swallowed by ``distill/plugins``). A refusal (wrong
modelopt or megatron-core version, no Transformer Engine) must stop the run, not vanish.

The switch fails closed: ``MOE_CKPT_FIX`` is on for ``1``/``true``/``yes``, off when unset, empty
or ``0``/``false``/``no`` (case-insensitive, surrounding blanks ignored). Any other value stops
the process at start-up with one line on stderr and exit code 2: a typo must not leave a job
silently unpatched. A refusal of ``apply()`` stops it with one line and exit code 3. Both stop
through ``os._exit``: a ``SystemExit`` raised at start-up is a fatal error with a traceback
while ``site`` runs, and an exception raised from the import can be caught by the importer.
Set ``MOE_CKPT_FIX_VERBOSE=1`` to print what was patched (global rank 0 only).
"""
import importlib.abc
import importlib.machinery
import os
import sys

_TRIGGER = "modelopt.torch"
VAR = "MOE_CKPT_FIX"
# The words of a yes/no switch, case-insensitive (every switch of the harness takes these:
# harness/switches.py imports them); unset or empty is off.
ON = ("1", "true", "yes")
OFF = ("0", "false", "no")
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


def switch() -> bool:
    """Whether ``MOE_CKPT_FIX`` asks for the fix; any value outside the accepted ones stops."""
    raw = os.environ.get(VAR, "")
    value = raw.strip().lower()
    if value in ON:
        return True
    if not value or value in OFF:
        return False
    _stop(EXIT_BAD_VALUE,
          f"[{VAR}] refusing {VAR}={raw!r}: accepted values are {'/'.join(ON)} (apply the fix) "
          f"or unset/empty/{'/'.join(OFF)} (do not), case-insensitive")


def _apply_fix():
    from . import Refused, apply

    try:
        description = apply()
    except Refused as err:
        _stop(EXIT_REFUSED, f"[{VAR}] {type(err).__name__}: {err}")
    if os.environ.get("MOE_CKPT_FIX_VERBOSE") == "1" and os.environ.get("RANK", "0") == "0":
        print(f"[{VAR}] {description}", file=sys.stderr, flush=True)


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


def arm():
    """Apply the fix after ``modelopt.torch`` imports (now, if it already has); once."""
    if _TRIGGER in sys.modules:
        _apply_fix()
    elif not any(isinstance(f, _ApplyAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ApplyAfterImport())


def install():
    """The start-up entry point: arm the hook when ``MOE_CKPT_FIX`` is on (see ``switch``)."""
    if switch():
        arm()
