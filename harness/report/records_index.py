"""Every committed record, indexed by the (nvidia-modelopt, megatron-core) pair its ranks imported.

Why: the gate (``verdict --job ID --gate --modelopt V [--mcore V]``) and the evidence page
(``python -m harness evidence``, docs/evidence.md) find every committed record of a pair by
themselves. The pair is read from the records, never from a file name: each cell names the
versions its ranks imported (``modelopt``, ``mcore``: harness/records.py); a cell older than
those fields takes its run's ``versions`` (harness/report/verdict.py ``doc_records``). A run
named ``...-mc0.16.1`` that ran on megatron-core 0.19.2 is indexed under 0.19.2.

The records are the results.json of each committed run and the cells each matrix.json keeps per
version (``python -m harness matrix``; the only record of some pairs, 0.46.1's). Computed on the
fly: reading them all takes a fraction of a second, so there is no index file to keep in sync.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.paths import COMMITTED_RUNS, shown_path
from harness.records import RunResults

RESULTS_GLOB, MATRIX_GLOB = "*.results.json", "*.matrix.json"


@dataclass(frozen=True, order=True)
class Pair:
    modelopt: str
    mcore: str

    def __str__(self) -> str:
        return f"nvidia-modelopt {self.modelopt} + megatron-core {self.mcore}"

    @property
    def sort_key(self) -> tuple:
        return (_version_key(self.modelopt), _version_key(self.mcore))


def _version_key(v: str) -> tuple:
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


@dataclass(frozen=True)
class Entry:
    """One committed record file (or one version's part of a matrix.json) and its cells, each
    naming its pair."""

    label: str  # the file as a reader finds it; a matrix.json part adds its version in brackets
    run: RunResults

    @property
    def pairs(self) -> tuple[Pair, ...]:
        return tuple(sorted({Pair(c.modelopt, c.mcore) for c in self.run.cells},
                            key=lambda p: p.sort_key))

    def of_pair(self, pair: Pair) -> "Entry":
        """This entry with only the cells of ``pair``."""
        cells = [c for c in self.run.cells if (c.modelopt, c.mcore) == (pair.modelopt, pair.mcore)]
        return Entry(self.label, replace(self.run, cells=cells))


def _with_pairs(run: RunResults) -> RunResults:
    from harness.report.verdict import doc_records

    return replace(run, cells=list(doc_records(run).values()))


def _stamp(name: str) -> str:
    """``20261204-0203-pairs.matrix.json`` -> ``2026-12-04T02:03:00Z``: a matrix.json keeps no
    ``created``; its name's stamp orders it among the runs (newer runs win for the same cell)."""
    m = re.match(r"(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})(\d{2})?", name)
    if not m:
        return "unknown"
    y, mo, d, h, mi, s = m.groups()
    return f"{y}-{mo}-{d}T{h}:{mi}:{s or '00'}Z"


def _matrix_entries(path: Path) -> list[Entry]:
    doc = json.loads(path.read_text())
    out = []
    for version, part in doc.items():
        cells = part.get("cells") or [] if isinstance(part, dict) else []
        if not cells:
            continue
        label = f"{shown_path(path)} [{version}]"
        run = RunResults.from_json({"run_id": f"{path.name.split('.')[0]} [{version}]",
                                    "created": _stamp(path.name), "versions": {}, "cells": cells})
        out.append(Entry(label, _with_pairs(run)))
    return out


def read_index(runs_dir: Path = COMMITTED_RUNS) -> list[Entry]:
    """Every committed record under ``runs_dir``, oldest first."""
    from harness.check.results_file import read_results

    entries = [Entry(shown_path(p), _with_pairs(RunResults.of(read_results(p))))
               for p in sorted(runs_dir.glob(RESULTS_GLOB))]
    for p in sorted(runs_dir.glob(MATRIX_GLOB)):
        entries += _matrix_entries(p)
    return sorted(entries, key=lambda e: (str(e.run.created), str(e.run.run_id)))


def pairs(entries: list[Entry]) -> list[Pair]:
    """Every pair the records hold, by version."""
    return sorted({p for e in entries for p in e.pairs}, key=lambda p: p.sort_key)


def of_pair(entries: list[Entry], pair: Pair) -> list[Entry]:
    """The entries holding cells of ``pair``, each with only those cells."""
    return [e.of_pair(pair) for e in entries if pair in e.pairs]
