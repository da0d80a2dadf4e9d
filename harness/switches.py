"""Yes/no switches (environment and make variables): the words they accept, in one place.

Why: a switch that reads any other word as "off" flips silently on a typo (``GATE_PATCHED=yes``
once meant unpatched). Every switch takes the words ``MOE_CKPT_FIX`` takes and refuses any other
value in one line naming the variable and the words, which live with the fix's own switch
(moe_ckpt_fix/autoload.py: the fix imports nothing of the harness, so the harness imports them).

Shell scripts ask here too: ``python -m harness.switches NAME [on|off]`` prints 1 or 0, or the
refusal on stderr with exit 2.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from moe_ckpt_fix.autoload import OFF, ON  # unset or empty: the switch's default
EXIT_BAD_VALUE = 2


class SwitchError(ValueError):
    """A switch set to a word it does not accept; the message is one line."""


def switch(name: str, default: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the switch ``name`` is on (case-insensitive, blanks around ignored)."""
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON or value in OFF:
        return value in ON
    raise SwitchError(f"{name}={raw!r} is not a yes/no value: accepted are {'/'.join(ON)} (on) or "
                      f"{'/'.join(OFF)} (off), case-insensitive; unset or empty means "
                      f"{'on' if default else 'off'}")


def main(argv: list[str]) -> int:
    """``python -m harness.switches NAME [on|off]``: 1 or 0 on stdout (a shell script's switch)."""
    if len(argv) not in (1, 2) or argv[1:] not in ([], ["on"], ["off"]):
        print("usage: python -m harness.switches NAME [on|off]  (on/off: the default when unset)",
              file=sys.stderr)
        return EXIT_BAD_VALUE
    try:
        print(int(switch(argv[0], default=argv[1:] == ["on"])))
    except SwitchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_VALUE
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
