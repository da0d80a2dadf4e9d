"""Which cells each command runs (scenarios/selections.toml): repro, matrix, bench.

Why: a scenario's name is data; the commands that run chosen cells read the choice from the
file beside the scenarios, so renaming or regrouping scenarios touches no code.
"""
from __future__ import annotations

import functools
import tomllib

from harness.paths import SELECTIONS_FILE


@functools.lru_cache(maxsize=None)
def _doc() -> dict:
    return tomllib.loads(SELECTIONS_FILE.read_text(encoding="utf-8"))


def listed(command: str, name: str) -> tuple[str, ...]:
    """What ``[command] name`` lists (cell-id globs, or the matrix's columns)."""
    return tuple(_doc()[command][name])


def matrix_columns() -> dict[str, str]:
    """Scenario name -> the matrix column its cells count in."""
    return dict(_doc()["matrix"]["columns"])


def bench_choice(bench: str) -> str:
    """The scenario or cell a bench script runs by default."""
    return _doc()["bench"][bench]
