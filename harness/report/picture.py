"""The grid picture of a run (grid.png) and the ``report`` command that writes it with the
summary (harness/report/summary.py, the text) beside a results.json."""
from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.check.results_file import ResultsFileError, read_results
from harness.paths import RESULTS_DIR, RunDir
from harness.records import CellRecord, Outcome, Patch, ProbeRecord, RunResults
from harness.report.summary import (CATEGORIES, PROBE_RULES, SAVE_ONLY, WITNESSES_SHOWN, Witness,
                                    _versions_line, category, markdown_summary, recipe_label,
                                    witness_lines, witnesses)

_WORDS = {Outcome.UNEXPECTED_PASS: "UNEXP.\nPASS"}


@dataclass
class _Panel:
    """One heatmap of the picture: its axes, and per square (row, column) the outcomes of the
    records there, each with its witness number where it is one the caption lists."""

    title: str
    rows: list[str]
    cols: list[str]
    ylabel: str
    xlabel: str
    squares: dict[tuple[int, int], list[tuple[str, int | None]]]


def _cell_panels(cells: list[CellRecord], marks: dict) -> list[_Panel]:
    """One panel per (tier, patch, recipe): the fix and the unpatched run are read side by side,
    and two recipes never share a square. Every panel has the run's saves and loads as axes."""
    saves = sorted({str(r.save_topology or "?") for r in cells}) or ["-"]
    loads = sorted({str(r.load_topology) for r in cells if r.load_topology})
    if any(not r.load_topology for r in cells) or not loads:
        loads.append(SAVE_ONLY)
    groups: dict[tuple[str, str, str], list[CellRecord]] = {}
    for r in cells:
        groups.setdefault((str(r.tier or "?"), str(r.patch or Patch.NONE), recipe_label(r)), []).append(r)
    panels = []
    for (tier, patch, recipe), recs in sorted(groups.items()):
        squares: dict[tuple[int, int], list[tuple[str, int | None]]] = {}
        for r in recs:
            square = (saves.index(str(r.save_topology or "?")),
                      loads.index(str(r.load_topology) if r.load_topology else SAVE_ONLY))
            squares.setdefault(square, []).append((r.outcome, marks.get(("cell", r.cell_id))))
        panels.append(_Panel(f"tier {tier}, patch {patch}\nrecipe {recipe}", saves, loads,
                             "save topology", "load topology", squares))
    return panels or [_Panel("-", saves, loads, "save topology", "load topology", {})]


def _probe_panel(probes: list[ProbeRecord], marks: dict) -> list[_Panel]:
    """The validation probes (cpu repro): a topology per row, the amax's replica ids per column."""
    if not probes:
        return []
    topologies = list(dict.fromkeys(p.topology for p in probes))
    rules = [r for r in PROBE_RULES if any(p.rule == r for p in probes)]
    rules += sorted({p.rule for p in probes} - set(rules))
    squares: dict[tuple[int, int], list[tuple[str, int | None]]] = {}
    for p in probes:
        squares.setdefault((topologies.index(p.topology), rules.index(p.rule)), []).append(
            (p.outcome, marks.get(("probe", p.topology, p.rule))))
    worlds = "/".join(str(w) for w in sorted({p.world for p in probes}))
    return [_Panel(f"real megatron-core validation, {worlds} gloo ranks on CPU\n"
                   "per-expert amax only, no model", topologies,
                   [f"built as {PROBE_RULES.get(r, r)}" for r in rules], "topology",
                   "per-expert amax replica ids", squares)]


def write_grid_png(results: Mapping[str, Any], path: str) -> None:
    """The grid picture (``grid_figure``) as a PNG."""
    import matplotlib.pyplot as plt

    fig = grid_figure(results)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def outside_figure(fig) -> list[str]:
    """Every visible text of the figure that does not lie inside it (clipped in the PNG)."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append(t.get_text())
    return out


def grid_figure(results: Mapping[str, Any]):
    """Heatmap, rows = save topology, columns = load topology, one panel per (tier, patch, recipe),
    and a panel of the validation probes where the run has them (the cpu repro).

    Each square is coloured by its category and also carries a word (PASS, BUG, FAIL, BLOCK,
    SKIP), so it reads in grey print and for colour-blind readers; a square with several records
    shows the worst and how many there are. A witness of the bug carries its number, [n], and the
    caption under the panels names it and its failing key (``witnesses``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch as LegendPatch

    run = RunResults.of(results)
    found = witnesses(run)
    marks = {w.ref: w.number for w in found[:WITNESSES_SHOWN]}
    panels = _cell_panels(run.cells, marks) + _probe_panel(run.probes, marks)
    colours = [c[3] for c in CATEGORIES] + ["#f2f2f2"]  # last: no record there
    empty = len(CATEGORIES)
    cmap = ListedColormap(colours)

    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    w = max(4.5, 1.0 * max(len(p.cols) for p in panels) + 2.6)
    h = max(2.8, 0.5 * max(len(p.rows) for p in panels) + 2.2)
    caption = _caption(found, w * ncols)
    width_in = max(w * ncols, _CAPTION_IN_PER_CHAR * max(map(len, caption), default=0) + 0.4)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, h * nrows + 0.8), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(flat, panels):
        grid = [[empty] * len(panel.cols) for _ in panel.rows]
        for (i, j), entries in panel.squares.items():
            worst = min(category(o) for o, _ in entries)
            outcome = [o for o, _ in entries if category(o) == worst][-1]
            grid[i][j] = worst
            numbers = sorted(n for _, n in entries if n is not None)
            text = (_WORDS.get(outcome, CATEGORIES[worst][2])
                    + (f" ×{len(entries)}" if len(entries) > 1 else "")
                    + ("\n" + " ".join(f"[{n}]" for n in numbers) if numbers else ""))
            ax.text(j, i, text, ha="center", va="center", fontsize=8, fontweight="bold",
                    color="white" if worst in (0, 1, 4) else "black")
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=empty + 0.5, aspect="auto")
        ax.set_xticks(range(len(panel.cols)), panel.cols, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(len(panel.rows)), panel.rows, fontsize=8)
        ax.set_xticks([x - 0.5 for x in range(1, len(panel.cols))], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(panel.rows))], minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=10)

    versions = _versions_line(run.versions)
    # about 12 characters an inch at 9 pt: the title wraps instead of running off both sides
    title = textwrap.fill(f"run {run.run_id}  ({versions})", width=int(width_in * 12))
    fig.suptitle(title, fontsize=9)
    ncol = max(1, min(len(CATEGORIES), int(width_in // 4.5)))  # a legend entry is ~4 in wide
    fig.legend(handles=[LegendPatch(color=c[3], label=c[1]) for c in CATEGORIES],
               loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    legend_rows = -(-len(CATEGORIES) // ncol)
    title_lines = title.count("\n") + 1
    legend_in = 0.2 * legend_rows + 0.1
    caption_in = _CAPTION_IN_PER_LINE * len(caption) + (0.25 if caption else 0.0)
    fig.set_size_inches(width_in, fig.get_size_inches()[1] + 0.18 * (legend_rows + title_lines)
                        + caption_in)
    height_in = fig.get_size_inches()[1]
    if caption:
        fig.text(0.2 / width_in, (legend_in + 0.1) / height_in, "\n".join(caption), ha="left",
                 va="bottom", fontsize=8, family="monospace", linespacing=1.3)
    fig.tight_layout(rect=(0, (legend_in + caption_in) / height_in, 1,
                           1 - (0.17 * title_lines + 0.1) / height_in))
    return fig


# The caption's monospace at 8 pt: 0.6 em a character (0.067 in), 1.3 lines a line (0.144 in).
_CAPTION_IN_PER_CHAR = 0.07
_CAPTION_IN_PER_LINE = 0.16


def _caption(found: list[Witness], width_in: float) -> list[str]:
    """The witnesses the picture numbers, wrapped to ``width_in``; a key is never broken (the
    figure widens for it instead)."""
    if not found:
        return []
    chars = max(40, int((width_in - 0.4) / _CAPTION_IN_PER_CHAR))
    lines = ["THE BUG, REPRODUCED ([n] in the squares above):"]
    for w in found[:WITNESSES_SHOWN]:
        head, key = witness_lines(w)
        lines += textwrap.wrap(head, chars, subsequent_indent="     ", break_long_words=False)
        lines.append(key)
    if len(found) > WITNESSES_SHOWN:
        lines.append(f"... and {len(found) - WITNESSES_SHOWN} more bug-reproduced: summary.md")
    return lines


# ``python -m harness report [results.json]``: write summary.md and grid.png next to a results.json
# (default: the newest ``<results-root>/*/results.json``) and print the Markdown.


def newest_results(root: Path) -> Path | None:
    found = sorted(RunDir.results_files(root), key=lambda p: (p.stat().st_mtime, str(p)))
    return found[-1] if found else None


def write_report(results: Path, summary: Path | None = None, grid: Path | None = None) -> str:
    """Write the summary and grid picture (default names beside ``results``); return the text."""
    doc = read_results(results)
    text = markdown_summary(doc)
    beside = RunDir(results.parent)
    (summary or beside.summary).write_text(text)
    write_grid_png(doc, str(grid or beside.grid))
    return text


def main(args) -> int:
    given = getattr(args, "results", None)
    root = Path(getattr(args, "results_root", None) or RESULTS_DIR)
    path = Path(given) if given else newest_results(root)
    if path is None:
        print(f"error: no {root}/*/results.json; run `python -m harness run` first "
              "or name a results.json", file=sys.stderr)
        return 2
    try:
        text = write_report(path)
    except ResultsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the report goes beside the results: a read-only run directory
        print(f"error: {exc.filename}: cannot write the report beside {path} "
              f"({type(exc).__name__}: {exc.strerror})", file=sys.stderr)
        return 2
    print(text)
    print(f"wrote {RunDir(path.parent).summary} and {RunDir(path.parent).grid}", file=sys.stderr)
    return 0
