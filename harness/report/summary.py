"""Human-readable views of a results.json: a Markdown table, a save x load grid picture, and a
one-line progress counter.

Why: CI keeps results.json for machines; a person opening a nightly pipeline wants to see at a
glance which save/load topology pairs pass, which reproduce the known bug as expected, and which
fail in a new way. Records are read as CellRecords (harness/records.py ``from_json``), so this
module works on any results.json without importing the controller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.check.results_file import INCOMPLETE_LINE
from harness.records import (UNEXPECTED_OUTCOMES, CellRecord, Expected, Outcome,
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


def recipe_label(r: CellRecord) -> str:
    """The recipe's short name (harness/model/recipes.py), as every table shows it."""
    from harness.model.recipes import Recipe, RecipeError

    try:
        return Recipe.parse(r.recipe_ref).label
    except RecipeError:
        return r.recipe_ref


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
