"""Human-readable views of a results.json: a Markdown table, a save x load grid picture, and a
one-line progress counter.

Why: CI keeps results.json for machines; a person opening a nightly pipeline wants to see at a
glance which save/load topology pairs pass, which reproduce the known bug as expected, and which
fail in a new way. Records are read as CellRecords (harness/records.py ``from_json``), so this
module works on any results.json without importing the controller.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.check.results_file import INCOMPLETE_LINE, ResultsFileError, read_results
from harness.paths import RESULTS_DIR, RunDir
from harness.records import UNEXPECTED_OUTCOMES, CellRecord, Outcome, Patch, RunResults

Record = CellRecord | Mapping[str, Any]

# The categories of the grid, worst first (a grid square holding several records shows
# the worst). Each: (outcomes mapped to it, label, short text drawn in the square, colour).
CATEGORIES = (
    (UNEXPECTED_OUTCOMES, "unexpected failure (or pass)", "FAIL", "#d62728"),
    ((Outcome.BLOCKED,), Outcome.BLOCKED, "BLOCK", "#7f7f7f"),
    ((Outcome.RULE_UNKNOWN,), "rule unknown for the (modelopt, megatron-core) pair", "RULE?", "#8c564b"),
    ((Outcome.INTERRUPTED,), "interrupted (run stopped, not a result)", "INTR", "#9467bd"),
    ((Outcome.BUG_REPRODUCED,), "bug reproduced as expected", "BUG", "#ff9f1c"),
    ((Outcome.KNOWN_REFUSAL,), "known refusal, not the collision (docs/findings.md)", "REFUSED", "#e6c229"),
    ((Outcome.SKIPPED,), Outcome.SKIPPED, "SKIP", "#c7c7c7"),
    ((Outcome.PASS,), Outcome.PASS, "PASS", "#2ca02c"),
)
SAVE_ONLY = "(save only)"
# Outcomes that share a category but deserve their own word in the square.
_WORDS = {Outcome.UNEXPECTED_PASS: "UNEXP.\nPASS"}


def category(outcome: str) -> int:
    """Index into CATEGORIES; an unknown outcome counts as an unexpected failure."""
    for i, (outcomes, *_rest) in enumerate(CATEGORIES):
        if outcome in outcomes:
            return i
    return 0


def cell_seconds(record: Record) -> float:
    """Wall seconds of a cell: its save and load stages, else the sum of what was measured."""
    d = CellRecord.of(record).durations
    stages = [d[k] for k in ("save_stage", "load_stage") if isinstance(d.get(k), (int, float))]
    if stages:
        return float(sum(stages))
    return float(sum(v for v in d.values() if isinstance(v, (int, float))))


def _first_line(text: Any, limit: int = 120) -> str:
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def cause(record: Record) -> str:
    """One short phrase saying why a cell ended as it did (empty for a plain pass)."""
    r = CellRecord.of(record)
    if r.outcome in (Outcome.BLOCKED, Outcome.SKIPPED):
        return _first_line(r.reason)
    if r.outcome == Outcome.UNEXPECTED_PASS:
        return f"expected {r.expected or None}, passed"
    if not r.exception_type and not r.message:
        return ""
    parts = []
    if r.failed_stage:
        parts.append(f"{r.failed_stage}:")
    head = r.exception_type or ""
    msg = _first_line(r.message, 100)
    parts.append(f"{head}: {msg}" if head and msg else head or msg)
    if r.failing_key:
        parts.append(f"key `{r.failing_key}`")
    if r.first_failure_rank is not None:
        parts.append(f"(rank {r.first_failure_rank})")
    return " ".join(parts)


def _md(text: Any) -> str:
    """A Markdown table cell: no pipes or newlines may break the row."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _versions_line(versions: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "unknown"


def markdown_summary(results: Mapping[str, Any]) -> str:
    """A Markdown report: header (run, date, versions, tier), counts, then one row per cell."""
    run = RunResults.of(results)
    cells = run.cells
    counts: dict[str, int] = {}
    for r in cells:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    total = sum(cell_seconds(r) for r in cells)
    lines = [
        f"# moe-ckpt-harness run `{run.run_id}`",
        "",
        *([f"**{INCOMPLETE_LINE}**", ""] if run.incomplete else []),
        f"- date: {run.created}",
        f"- versions: {_versions_line(run.versions)}",
        f"- tier: {run.tier or 'unknown'}",
        f"- recipes: {', '.join(sorted({r.recipe_ref for r in cells})) or 'none'}",
        *[f"- {mode}" for mode in sorted({r.nccl_mode for r in cells if r.nccl_mode})],
        f"- cells: {len(cells)} ("
        + (", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "none")
        + f"), {total:.1f} s of cell time",
        "",
        "| save topology | load topology | tier | patch | recipe | outcome | cause | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | ---: |",
    ]
    order = sorted(cells, key=lambda r: (category(r.outcome), r.cell_id))
    for r in order:
        lines.append(
            "| "
            + " | ".join(
                _md(x)
                for x in (
                    r.save_topology or "",
                    r.load_topology or SAVE_ONLY,
                    r.tier or "",
                    r.patch,
                    recipe_label(r),
                    r.outcome,
                    cause(r),
                    f"{cell_seconds(r):.1f}",
                )
            )
            + " |"
        )
    return "\n".join(lines + _topology_lines(order)) + "\n"


def _topology_lines(cells: list[CellRecord]) -> list[str]:
    """The load cells' logits figures (harness/check/logits.py): asserted at the load topology,
    reported across topologies against their noise floor, and any forward finding."""
    rows = [(r, r.verified) for r in cells if r.verified.cross_topology]
    if not rows:
        return []

    def num(x):
        return "-" if x is None else f"{x:.3g}"

    out = ["", "Logits: asserted at the load topology (exact); across topologies reported against "
           "the noise floor (bf16 vs fp32 of the same state at both topologies).", "",
           "| cell | at load topology | cross-topology | flips | noise floor | fp32 cross | beyond |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r, v in rows:
        ct = v.cross_topology
        out.append(f"| {_md(r.cell_id)} | {num(v.logits_rel_diff)} | "
                   f"{num(ct.get('rel_diff'))} | {ct.get('routing_flips', '-')} | "
                   f"{num(ct.get('noise_floor'))} | {num(ct.get('fp32_cross_topology_rel_diff'))} | "
                   f"{ct.get('beyond_noise_floor', '-')} |")
    findings = [r for r in cells if r.finding]
    if findings:
        out += ["", f"Findings (the product, not the checkpoint): {len(findings)}", ""]
        out += [f"- {_md(r.cell_id)}: {_md(r.finding)}" for r in findings]
    return out


def recipe_label(r: CellRecord) -> str:
    """The recipe's short name (harness/model/recipes.py), as every table shows it."""
    from harness.model.recipes import Recipe, RecipeError

    try:
        return Recipe.parse(r.recipe_ref).label
    except RecipeError:
        return r.recipe_ref


def _panels(cells: Iterable[CellRecord]) -> dict[tuple[str, str, str], list[CellRecord]]:
    """Records grouped by (tier, patch, recipe): the fix and the unpatched run are read side by
    side, and two recipes never share a square."""
    out: dict[tuple[str, str, str], list[CellRecord]] = {}
    for r in cells:
        out.setdefault((str(r.tier or "?"), str(r.patch or Patch.NONE), recipe_label(r)), []).append(r)
    return dict(sorted(out.items()))


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
    """Heatmap, rows = save topology, columns = load topology, one panel per (tier, patch, recipe).

    Each square is coloured by its category and also carries a word (PASS, BUG, FAIL, BLOCK,
    SKIP), so it reads in grey print and for colour-blind readers; a square with several records
    shows the worst and how many there are.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    run = RunResults.of(results)
    cells = run.cells
    saves = sorted({str(r.save_topology or "?") for r in cells}) or ["-"]
    loads = sorted({str(r.load_topology) for r in cells if r.load_topology})
    if any(not r.load_topology for r in cells) or not loads:
        loads.append(SAVE_ONLY)
    panels = _panels(cells) or {("-", "-", "-"): []}
    colours = [c[3] for c in CATEGORIES] + ["#f2f2f2"]  # last: no cell there
    empty = len(CATEGORIES)
    cmap = ListedColormap(colours)

    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    w = max(4.5, 1.0 * len(loads) + 2.6)
    h = max(2.8, 0.5 * len(saves) + 2.2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + 0.8), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    for ax, ((tier, patch, recipe), recs) in zip(flat, panels.items()):
        grid = [[empty] * len(loads) for _ in saves]
        count = [[0] * len(loads) for _ in saves]
        word = [[""] * len(loads) for _ in saves]
        for r in recs:
            i = saves.index(str(r.save_topology or "?"))
            j = loads.index(str(r.load_topology) if r.load_topology else SAVE_ONLY)
            if category(r.outcome) <= grid[i][j]:
                word[i][j] = _WORDS.get(r.outcome, CATEGORIES[category(r.outcome)][2])
            grid[i][j] = min(grid[i][j], category(r.outcome))
            count[i][j] += 1
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=empty + 0.5, aspect="auto")
        for i in range(len(saves)):
            for j in range(len(loads)):
                if grid[i][j] == empty:
                    continue
                text = word[i][j] + (f" ×{count[i][j]}" if count[i][j] > 1 else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=8, fontweight="bold",
                        color="white" if grid[i][j] in (0, 1, 4) else "black")
        ax.set_xticks(range(len(loads)), loads, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(len(saves)), saves, fontsize=8)
        ax.set_xticks([x - 0.5 for x in range(1, len(loads))], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(saves))], minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("load topology")
        ax.set_ylabel("save topology")
        ax.set_title(f"tier {tier}, patch {patch}\nrecipe {recipe}", fontsize=10)
    import textwrap

    versions = _versions_line(run.versions)
    width_in = fig.get_size_inches()[0]
    # about 12 characters an inch at 9 pt: the title wraps instead of running off both sides
    title = textwrap.fill(f"run {run.run_id}  ({versions})", width=int(width_in * 12))
    fig.suptitle(title, fontsize=9)
    ncol = max(1, min(len(CATEGORIES), int(width_in // 4.5)))  # a legend entry is ~4 in wide
    fig.legend(handles=[Patch(color=c[3], label=c[1]) for c in CATEGORIES], loc="lower center",
               ncol=ncol, fontsize=8, frameon=False)
    legend_rows = -(-len(CATEGORIES) // ncol)
    title_lines = title.count("\n") + 1
    fig.set_size_inches(width_in, fig.get_size_inches()[1] + 0.18 * (legend_rows + title_lines))
    height_in = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.2 * legend_rows + 0.1) / height_in, 1,
                           1 - (0.17 * title_lines + 0.1) / height_in))
    return fig


def _clock(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def progress_line(done: int, total: int, failures: int, elapsed: float) -> str:
    """``[ 12/40  30%] 2 failed, 1m05s elapsed, ~2m32s left`` (the estimate assumes equal cells)."""
    width = len(str(total))
    pct = int(100 * done / total) if total else 100
    left = f"~{_clock(elapsed / done * (total - done))} left" if 0 < done < total else (
        "done" if done >= total else "estimating"
    )
    return f"[{done:>{width}}/{total} {pct:3d}%] {failures} failed, {_clock(elapsed)} elapsed, {left}"


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
