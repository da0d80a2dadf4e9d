"""Where things live in this repository and in a run directory: the one place each path is
written down."""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = REPO_ROOT / "scenarios"
QUARANTINE_FILE = SCENARIO_DIR / "quarantine.toml"
SELECTIONS_FILE = SCENARIO_DIR / "selections.toml"
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
RESULTS_DIR = Path("results")  # relative to the working directory, like every CLI default
# The committed GPU records (results.json and matrix.json of runs on lent GPU hosts): what the
# gate finds by itself (harness/report/records_index.py) and docs/evidence.md is generated from.
COMMITTED_RUNS = REPO_ROOT / "tests" / "data" / "runs"
EVIDENCE_PAGE = REPO_ROOT / "docs" / "evidence.md"  # `python -m harness evidence` writes it
# `python -m harness evidence` writes these too, from the record types (harness/report/records_doc.py)
RECORDS_PAGE = REPO_ROOT / "docs" / "records.md"
RECORDS_SCHEMA = REPO_ROOT / "docs" / "records.schema.json"
MANIFEST_SCHEMA = REPO_ROOT / "tests" / "golden" / "manifest.schema.json"
README = REPO_ROOT / "README.md"
# The jobs judged on the harness's first profile (NVFP4_DEFAULT_CFG on the plain GPT, each job's
# save and its one reload): the profile most committed runs were earned with.
BASELINE_QUARANTINE = REPO_ROOT / "tests" / "data" / "quarantine-nvfp4-default.toml"


def shown_path(path: Path) -> str:
    """The file as a reader finds it: relative to the repository when inside it."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def unwritable_dir(path: Path) -> str | None:
    """Why no directory can be made or written under ``path``, in words, or None; leaves nothing.

    Why: a run's first write is deep inside it (a probe, a pool, a stage); a read-only or file
    results root must stop the command before anything runs, in one line. Permissions alone do
    not tell (root may write anywhere, yet the proc filesystem takes no new directory), so a
    directory is made where a ``mkdir -p`` would start and removed at once."""
    base = Path(path)
    while not base.exists() and base.parent != base:  # where a mkdir -p would start
        base = base.parent
    where = "it" if base == Path(path) else str(base)
    if not base.is_dir():
        return f"{where} is a file, not a directory"
    if not os.access(base, os.W_OK | os.X_OK):  # also false on a read-only filesystem
        return f"no permission to write in {where}"
    probe = base / f".harness-write-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"no directory can be made in {where} ({exc.strerror or exc})"
    probe.rmdir()
    return None


def safe_name(name: str) -> str:
    """A cell or save id as one directory name (ids hold '[', '=', ',')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def new_directory(parent: Path, stem: str) -> Path:
    """``parent/stem``, or ``stem-2``, ``stem-3``, ... when it exists: created here, so no other
    process (another run, an xdist worker, a second `make`) gets the same one (mkdir is atomic)."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{parent}: no free directory for {stem}")


RESULTS_FILE = "results.json"  # a run's records, in every run directory
SAVED_KEYS_DIR = "saved-keys"  # a save stage's keys per rank, in its stage directory


@dataclass(frozen=True)
class SaveDir:
    """One save stage's directory: its checkpoint, the topology-independent reference the load
    stages compare against, the stage's files (spec.json, logs/, ranks/, ...) and its result."""

    root: Path

    @property
    def ckpt(self) -> Path:
        return self.root / "ckpt"

    @property
    def reference(self) -> Path:
        return self.root / "reference"

    @property
    def result(self) -> Path:
        """The save's StageResult, written once: a later cell of the same save reuses it."""
        return self.root / "stage.json"

    def saved_keys(self, rank: int) -> Path:
        """The ShardedTensor keys rank ``rank`` handed to the save, one a line (the rank
        writes them into its stage directory, this one: harness/rank/stages.py)."""
        return self.root / SAVED_KEYS_DIR / f"rank{rank}.txt"

    @property
    def lock(self) -> Path:
        """Held (flock) while a process runs or reads this save (harness/run/cell.py)."""
        return self.root / ".lock"


@dataclass(frozen=True)
class RunDir:
    """One run's directory, ``<results-root>/<run-id>/``: the one place its layout is spelled.

    ``saves/<save-id>/`` a save stage (SaveDir; a golden's verified copy stands in for it),
    ``cells/<cell-id>/load/`` a cell's load stage, ``cells/<cell-id>/record.json`` its record,
    ``pools/<name>/`` the warm rank pools, ``probes/<name>/`` a validation probe's stage and
    ``probes.json`` its judged records (cpu repro), ``results.json`` every record
    (harness/run/results.py), ``summary.md`` and ``grid.png`` the report."""

    root: Path

    @classmethod
    def of(cls, run: "RunDir | Path | str") -> "RunDir":
        return run if isinstance(run, RunDir) else cls(Path(run))

    @classmethod
    def new(cls, results_root: Path = RESULTS_DIR, label: str = "run") -> "RunDir":
        """A fresh directory no other run in this checkout can get: runs started in the same
        second (or by two processes at once) get ``-2``, ``-3``, ... (mkdir is atomic)."""
        return cls(new_directory(results_root, f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"))

    @staticmethod
    def results_files(results_root: Path) -> list[Path]:
        """The results.json of every run under ``results_root``."""
        return sorted(results_root.glob(f"*/{RESULTS_FILE}"))

    @property
    def run_id(self) -> str:
        return self.root.name

    def save(self, save_id: str) -> SaveDir:
        return SaveDir(self.root / "saves" / safe_name(save_id))

    def cell(self, cell_id: str) -> Path:
        return self.root / "cells" / safe_name(cell_id)

    def stage(self, cell_id: str, stage: str) -> Path:
        """A stage of the cell's own (its load: ``cells/<cell-id>/load/``); its save is shared."""
        return self.cell(cell_id) / stage

    def record(self, cell_id: str) -> Path:
        return self.cell(cell_id) / "record.json"

    def records(self) -> list[Path]:
        """Every cell's record.json written so far, in cell-directory order."""
        return sorted(self.root.glob("cells/*/record.json"))

    def pool(self, name: str) -> Path:
        return self.root / "pools" / name

    def new_pool(self, stem: str) -> Path:
        """A warm pool's directory, created here and owned by the caller alone: ``stem``, or
        ``stem-2``, ``stem-3``, ... when another process took it first (mkdir is atomic)."""
        return new_directory(self.root / "pools", stem)

    def probe(self, name: str) -> Path:
        return self.root / "probes" / name

    @property
    def probes(self) -> Path:
        return self.root / "probes.json"

    @property
    def results(self) -> Path:
        return self.root / RESULTS_FILE

    @property
    def summary(self) -> Path:
        return self.root / "summary.md"

    @property
    def grid(self) -> Path:
        return self.root / "grid.png"
