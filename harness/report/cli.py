"""``python -m harness report [results.json]``: write ``summary.md`` and ``grid.png`` next to a
results.json (default: the newest ``<results-root>/*/results.json``) and print the Markdown."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.paths import RESULTS_DIR

from harness.report.summary import markdown_summary, write_grid_png


def newest_results(root: Path) -> Path | None:
    found = sorted(root.glob("*/results.json"), key=lambda p: (p.stat().st_mtime, str(p)))
    return found[-1] if found else None


def write_report(results: Path, summary: Path | None = None, grid: Path | None = None) -> str:
    """Write the summary and grid picture (default names beside ``results``); return the text."""
    doc = json.loads(results.read_text())
    text = markdown_summary(doc)
    (summary or results.parent / "summary.md").write_text(text)
    write_grid_png(doc, str(grid or results.parent / "grid.png"))
    return text


def main(args) -> int:
    given = getattr(args, "results", None)
    root = Path(getattr(args, "results_root", None) or RESULTS_DIR)
    path = Path(given) if given else newest_results(root)
    if path is None:
        print(f"error: no {root}/*/results.json; run `python -m harness run` first "
              "or name a results.json", file=sys.stderr)
        return 2
    if not path.is_file():
        print(f"error: {path} does not exist", file=sys.stderr)
        return 2
    print(write_report(path))
    print(f"wrote {path.parent / 'summary.md'} and {path.parent / 'grid.png'}", file=sys.stderr)
    return 0
