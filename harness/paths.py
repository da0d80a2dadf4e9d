"""Where things live in this repository: the one place each path is written down."""
from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = REPO_ROOT / "scenarios"
QUARANTINE_FILE = SCENARIO_DIR / "quarantine.toml"
SELECTIONS_FILE = SCENARIO_DIR / "selections.toml"
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
RESULTS_DIR = Path("results")  # relative to the working directory, like every CLI default


def shown_path(path: Path) -> str:
    """The file as a reader finds it: relative to the repository when inside it."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def safe_name(name: str) -> str:
    """A cell or save id as one directory name (ids hold '[', '=', ',')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
