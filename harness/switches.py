"""The values environment and make variables accept, in one place: yes/no switches and numbers.

Why: a switch that reads any other word as "off" flips silently on a typo (``GATE_PATCHED=yes``
once meant unpatched). Every switch takes the words ``MOE_CKPT_FIX`` takes and refuses any other
value in one line naming the variable and the words, which live with the fix's own switch
(moe_ckpt_fix/autoload.py: the fix imports nothing of the harness, so the harness imports them).

Numbers: every numeric variable the harness reads is in ``NUMBERS``, with its default and bounds.
``check_numbers`` refuses a bad one at start-up (``python -m harness`` calls it before any
command), in one line naming the variable: not as "could not convert string to float" in every
rank of every cell a minute later. The ranks read their values through ``number``.

Shell scripts ask here too: ``python -m harness.switches NAME [on|off]`` prints 1 or 0, or the
refusal on stderr with exit 2.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping

from moe_ckpt_fix.autoload import OFF, ON  # unset or empty: the switch's default
EXIT_BAD_VALUE = 2


class SwitchError(ValueError):
    """A switch or number set to a value it does not accept; the message is one line."""


@dataclass(frozen=True)
class Number:
    """A numeric variable: its default (unset or empty), its bounds, whole or not."""

    default: float
    low: float
    high: float
    whole: bool = False
    meaning: str = ""


# Every numeric variable the harness reads (the stage's own HARNESS_STAGE_TIMEOUT_S and
# HARNESS_POOL_OWNER are the controller's, written per stage, not a user's).
NUMBERS = {
    "HARNESS_PG_TIMEOUT_S": Number(60, 0.1, 86400, meaning="the ranks' process-group timeout, s"),
    "HARNESS_FORK_SIBLING_WAIT_S": Number(20, 0.01, 3600,
                                          meaning="a forked rank's wait for its siblings, s"),
    "MATRIX_RUN_TIMEOUT_S": Number(900, 1, 7 * 86400, whole=True,
                                   meaning="bound of one matrix pair's run, s"),
    "MATRIX_JOBS": Number(1, 1, 64, whole=True, meaning="matrix pairs at once"),
    "MATRIX_RUN_JOBS": Number(4, 1, 64, whole=True, meaning="cells at once in a matrix pair's run"),
}


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


def number(name: str, environ: Mapping[str, str] = os.environ, default: float | None = None):
    """The value of the numeric variable ``name`` (``NUMBERS``): its default when unset or empty
    (``default`` overrides it), else the number it holds within its bounds (an int if whole)."""
    spec = NUMBERS[name]
    raw = environ.get(name, "")
    if not raw.strip():
        value = spec.default if default is None else default
        return int(value) if spec.whole else float(value)
    kind = "a whole number" if spec.whole else "a number"
    try:
        value = int(raw.strip()) if spec.whole else float(raw.strip())
    except ValueError:
        value = None
    if value is None or not spec.low <= value <= spec.high:  # NaN is outside every range
        raise SwitchError(f"{name}={raw!r} is not {kind} in {spec.low:g}..{spec.high:g} "
                          f"({spec.meaning}; unset or empty means {spec.default:g})")
    return value


def check_numbers(environ: Mapping[str, str] = os.environ) -> None:
    """Raise ``SwitchError`` for the first numeric variable set to a value it does not accept."""
    for name in NUMBERS:
        number(name, environ)


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
