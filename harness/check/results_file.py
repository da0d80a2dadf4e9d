"""Read a results.json and refuse, in one line naming the file, anything that is not one.

Why: ``report`` and ``verdict`` used to print a traceback for an empty or truncated file and
silently judged ``{}`` as a run with no cells. The keys every reader relies on are checked
here, then every field present against its type (harness/records.py, docs/records.schema.json);
a field an older record lacks is not required, so older committed runs stay readable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.records import OUTCOMES, RecordError, RunResults

REQUIRED_KEYS = ("cells", "run_id", "versions")
REQUIRED_CELL_KEYS = ("cell_id", "outcome", "tier")


class ResultsFileError(ValueError):
    """One line: the file and what is wrong with it."""


def read_results(path: Path | str) -> dict[str, Any]:
    """The results doc at ``path``; ResultsFileError if missing, not JSON or not a results doc."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"{p}: no such file") from None
    except UnicodeDecodeError:
        raise ResultsFileError(f"{p}: not JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise ResultsFileError(f"{p}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if not text.strip():
        raise ResultsFileError(f"{p}: empty file, not a results.json")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(
            f"{p}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; truncated?)"
        ) from None
    problem = results_problem(doc)
    if problem:
        raise ResultsFileError(f"{p}: {problem}")
    try:
        RunResults.from_json(doc, source=str(p))  # every field of its type (harness/records.py)
    except RecordError as exc:
        raise ResultsFileError(str(exc)) from None
    return doc


def results_problem(doc: Any) -> str:
    """What makes ``doc`` not a results doc ('' when it is one)."""
    if not isinstance(doc, dict):
        return f"not a results.json (a JSON {type(doc).__name__}, not an object)"
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        return f"not a results.json (missing {', '.join(f'`{k}`' for k in missing)})"
    if not isinstance(doc["cells"], list):
        return "`cells` is not a list"
    if not isinstance(doc["versions"], dict):
        return "`versions` is not an object"
    if not isinstance(doc.get("incomplete", False), bool):
        return "`incomplete` is not true/false"
    for i, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict):
            return f"cells[{i}] is not an object"
        name = cell.get("cell_id", f"cells[{i}]")
        # A cell may leave its tier to the run's (hand-made docs do).
        need = [k for k in REQUIRED_CELL_KEYS if k not in cell and not (k == "tier" and "tier" in doc)]
        if need:
            return f"cell {name} lacks {', '.join(f'`{k}`' for k in need)}"
        if cell["outcome"] not in OUTCOMES:
            return f"cell {name} has unknown outcome {cell['outcome']!r} (known: {', '.join(OUTCOMES)})"
    return ""


INCOMPLETE_LINE = "incomplete run: interrupted before every cell finished"


def is_incomplete(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("incomplete") is True
