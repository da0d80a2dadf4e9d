"""Rank entry point: ``torchrun ... -m harness.rank <stage-spec.json>``.

The ``__main__`` guard matters: the torch_dist save starts a spawn multiprocessing Manager,
which re-imports the main module.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from harness.rank import trim

    trim.install()  # before anything imports the stack
    from harness.rank.guard import rank_main
    from harness.rank.spec import StageSpec
    from harness.rank.stages import STAGES, configure_warnings

    configure_warnings()
    spec = StageSpec.read(argv[0])
    rank_main(spec.stage, lambda: STAGES[spec.stage](spec))


if __name__ == "__main__":
    main(sys.argv[1:])
