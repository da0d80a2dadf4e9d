"""Human-readable views of a results.json: a Markdown table, a save x load grid picture, and a
one-line progress counter.

Why: CI keeps results.json for machines; a person opening a nightly pipeline wants to see at a
glance which save/load topology pairs pass, which reproduce the known bug as expected, and which
fail in a new way. Records are read as CellRecords (harness/records.py ``from_json``), so this
module works on any results.json without importing the controller.
"""
from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.check.results_file import INCOMPLETE_LINE, ResultsFileError, read_results
from harness.paths import RESULTS_DIR, RunDir
from harness.records import (UNEXPECTED_OUTCOMES, CellRecord, Expected, Outcome, Patch,
                             ProbeRecord, ProbeRule, RunResults)

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
    ((Outcome.NOT_QUANTIZABLE,), "not quantizable: ModelOpt refuses the recipe on this model", "NO QUANT", "#17becf"),
    ((Outcome.SKIPPED,), Outcome.SKIPPED, "SKIP", "#c7c7c7"),
    ((Outcome.PASS,), Outcome.PASS, "PASS", "#2ca02c"),
)
SAVE_ONLY = "(save only)"
# How the probe panel and table name a probe's rule: whose replica ids the amax were built with.
PROBE_RULES = {ProbeRule.BUGGY: "ModelOpt 0.47.0", ProbeRule.FIXED: "the fix"}
WITNESSES_SHOWN = 4  # in the picture's caption and the summary's list; the table has them all
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


def _short_type(exception_type: str | None) -> str:
    return (exception_type or "").rsplit(".", 1)[-1]


def _replicas(r: ProbeRecord) -> str:
    """The failing key's count of main replicas, which validation needs to be exactly 1."""
    return "" if r.main_replicas is None else f", main replicas {r.main_replicas}, not 1"


def probe_cause(r: ProbeRecord) -> str:
    """What megatron-core's validation said in one probe: ``valid``, or the error's type, how
    many keys it names, the first, and that key's count of main replicas."""
    if not r.exception_type:
        return "valid"
    return (f"{_short_type(r.exception_type)} on {r.failing_keys} key(s), first "
            f"`{r.failing_key}`{_replicas(r)}")


@dataclass(frozen=True)
class Witness:
    """Where a run reproduced the bug: a cell whose outcome says so, or (tier cpu, whose cells
    cannot collide) a validation probe of the real megatron-core on amax built as 0.47.0 does."""

    number: int  # the [n] the picture draws in its square and the summary lists
    where: str  # the cell id, or the probe's topology and ranks
    context: str
    event: str
    key: str | None
    ref: tuple  # ("cell", cell id) or ("probe", topology, rule): the record it is


def witnesses(results: Mapping[str, Any] | RunResults) -> list[Witness]:
    """Every witness of the run, numbered: cells (the collision's before the second bug's, each
    by id), then probes in their run order."""
    run = RunResults.of(results)
    out = []
    collision = (Expected.FAIL_SAVE, Expected.FAIL_LOAD)
    for r in sorted(run.cells, key=lambda r: (r.expected not in collision, r.cell_id)):
        if r.outcome != Outcome.BUG_REPRODUCED:
            continue
        what = _short_type(r.exception_type) or _first_line(r.message, 90)
        rank = "" if r.first_failure_rank is None else f" (rank {r.first_failure_rank})"
        out.append(Witness(len(out) + 1, r.cell_id, f"tier {r.tier}, patch {r.patch}",
                           f"{r.failed_stage} failed as expected ({r.expected}): {what}{rank}",
                           r.failing_key, ("cell", r.cell_id)))
    for p in run.probes:
        if p.outcome != Outcome.BUG_REPRODUCED:
            continue
        out.append(Witness(
            len(out) + 1, f"real validation at {p.topology}, {p.world} gloo ranks",
            f"per-expert amax as {PROBE_RULES.get(p.rule, p.rule)} builds it",
            f"megatron-core's validate_sharding_integrity raised {_short_type(p.exception_type)} "
            f"on {p.failing_keys} key(s){_replicas(p)}", p.failing_key, ("probe", p.topology, p.rule)))
    return out


def witness_lines(w: Witness) -> list[str]:
    """The witness in two lines of plain text, the key on its own line (it is long)."""
    return [f"[{w.number}] {w.where} ({w.context}): {w.event}",
            f"     key {w.key or '(none named)'}"]


def _witness_section(found: list[Witness]) -> list[str]:
    if not found:
        return []
    shown = found[:WITNESSES_SHOWN]
    more = len(found) - len(shown)
    return ["", f"## The bug, reproduced: {len(found)} witness(es)", "",
            *(f"- [{w.number}] `{_md(w.where)}` ({_md(w.context)}): {_md(w.event)}; "
              f"key `{_md(w.key or '(none named)')}`" for w in shown),
            *([f"- and {more} more: the rows marked bug-reproduced below"] if more else [])]


def _probe_lines(probes: list[ProbeRecord]) -> list[str]:
    """The probes' table: each topology under ModelOpt 0.47.0's replica ids and the fix's."""
    if not probes:
        return []
    worlds = sorted({p.world for p in probes})
    out = ["", f"Real validation (megatron-core `validate_sharding_integrity` on "
               f"{'/'.join(map(str, worlds))} gloo ranks, per-expert `weight_quantizer._amax` only, no "
               "model), the amax built with the replica ids of ModelOpt 0.47.0 and of the fix:", "",
           "| topology | amax built as | outcome | validation says |", "| --- | --- | --- | --- |"]
    out += [f"| {_md(p.topology)} | {_md(PROBE_RULES.get(p.rule, p.rule))} | {_md(p.outcome)} | "
            f"{_md(probe_cause(p))} |" for p in probes]
    return out


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
    probe_counts: dict[str, int] = {}
    for p in run.probes:
        probe_counts[p.outcome] = probe_counts.get(p.outcome, 0) + 1
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
        *([f"- validation probes: {len(run.probes)} ("
           + ", ".join(f"{n} {o}" for o, n in sorted(probe_counts.items())) + ")"]
          if run.probes else []),
        *_witness_section(witnesses(run)),
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
    return "\n".join(lines + _probe_lines(run.probes) + _topology_lines(order)
                     + _disagreement_lines(order)) + "\n"


def _disagreement_lines(cells: list[CellRecord]) -> list[str]:
    """Cells whose save recorded other amax kinds than the recipe's forecast: judged by what was
    recorded, and said here so the forecast (harness/check/recipes.py) gets corrected."""
    off = [r for r in cells if r.forecast_disagreement]
    if not off:
        return []
    return ["", f"Forecast disagreements (judged by the kinds the save recorded): {len(off)}", "",
            *(f"- {_md(r.cell_id)}: {_md(r.forecast_disagreement)}" for r in off)]


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
