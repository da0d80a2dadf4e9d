"""The matrix as tables (``python -m harness matrix``): per (modelopt, megatron-core) pair the
outcome counts of each column and the tier they ran on, the 2-D pair table, and what each
committed golden holds after an unpatched load.

Why apart from the runner (harness/run/matrix.py): rows read back from earlier runs
(``--from``) render here without building or running anything.
"""
from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

from harness.records import CellRecord, Expected, Outcome, RunResults, Stage
from harness.scenario import selections

COLUMNS = selections.listed("matrix", "table")
# Which column each scenario's cells count in: scenarios/selections.toml.
SCENARIO_COLUMN = selections.matrix_columns()
GOLDENS = "goldens"  # the column of the committed goldens loaded unpatched (goldens_table)
PAIR_COLUMNS = ("witness", "second-bug", "fix", "goldens")


@dataclass
class TableEntry:
    """One table cell: outcome counts and the tier(s) they came from."""

    counts: dict[str, int] = field(default_factory=dict)
    tiers: list[str] = field(default_factory=list)
    note: str = ""

    def text(self) -> str:
        if not self.counts:
            return self.note or "-"
        body = ", ".join(f"{n} {o}" for o, n in sorted(self.counts.items(), key=lambda x: (-x[1], x[0])))
        if not self.tiers:  # it never ran on a tier: an environment or harness error
            return f"{body}: {self.note}" if self.note else body
        return f"{body} [{'/'.join(self.tiers)}]" + (f" ({self.note})" if self.note else "")


def column_of(record: CellRecord | dict) -> str:
    """Which matrix column a cell record counts in."""
    record = CellRecord.of(record)
    col = SCENARIO_COLUMN.get(record.scenario, record.scenario)
    if col == "witness" and record.load_topology and record.expected in (
            Expected.AMAX_LOST, Expected.PASS) and _holds_several_experts(record):
        return "second-bug"
    return col


@functools.lru_cache(maxsize=None)
def _scenario_sizes() -> dict:
    """Scenario name -> model size, read once (every record of a run asks)."""
    from harness.scenario.scenarios import load_all

    return {s.name: s.size for s in load_all()}


def _holds_several_experts(record: CellRecord) -> bool:
    from harness.topology.topology import Topology

    size = _scenario_sizes().get(record.scenario)
    return bool(size) and size.num_experts // Topology.parse(record.load_topology).ep > 1


def cells_from_results(doc: dict) -> dict[str, TableEntry]:
    """results.json of one ``harness run`` -> a TableEntry per column (skip reasons kept short)."""
    out: dict[str, TableEntry] = {}
    reasons: dict[str, Counter] = {}
    lost: dict[str, list[str]] = {}
    for c in RunResults.of(doc).cells:
        col = column_of(c)
        cell = out.setdefault(col, TableEntry())
        cell.counts[c.outcome] = cell.counts.get(c.outcome, 0) + 1
        if c.tier not in cell.tiers:
            cell.tiers.append(c.tier)
        if c.outcome in (Outcome.SKIPPED, Outcome.BLOCKED) and c.reason:
            reasons.setdefault(col, Counter())[c.reason.split(";")[0][:120]] += 1
        st = c.verified.expert_amax_state
        if col == "second-bug" and st and st.get("saved"):
            lost.setdefault(col, []).append(f"{st['saved'] - st['restored']}/{st['saved']}")
        if c.outcome in (Outcome.BUG_REPRODUCED, Outcome.UNEXPECTED_FAILURE, Outcome.RULE_UNKNOWN) and (
                c.exception_type or c.failing_key):
            # what failed, named exactly (the key with its layer/expert numbers folded)
            key = re.sub(r"\.\d+\.", ".N.", c.failing_key or "")
            exc = (c.exception_type or "error").rsplit(".", 1)[-1]
            reasons.setdefault(col, Counter())[f"{exc}" + (f" on {key}" if key else "")] += 1
    for col, r in reasons.items():
        out[col].note = "; ".join(k for k, _ in r.most_common(2))
    for col, figures in lost.items():
        out[col].note = "expert amax lost per load: " + ", ".join(figures)
    return out


def _held(record: CellRecord) -> str:
    """One line: the load's refusal (exception, key) or what the model holds after it."""
    from harness.check.verify_figures import held_after_load
    from harness.check.keys import failing_key

    if record.verify:
        return held_after_load(record.verify)
    message = record.message or record.reason or ""
    if record.failed_stage != Stage.LOAD:
        return message.splitlines()[0][:160] if message else ""
    exc = (record.exception_type or "error").rsplit(".", 1)[-1]
    key = record.failing_key or failing_key(message)
    first = message.strip().splitlines()[0][:120] if message.strip() else ""
    return f"load refused: {exc}" + (f" on `{key}`" if key else f": {first}")


def goldens_table(rows: dict[str, list[dict]]) -> str:
    """Version x golden x load: outcome and what the model holds after loading."""
    lines = ["| modelopt | golden -> load | outcome | what the model holds after the load |",
             "| --- | --- | --- | --- |"]
    for v, cells in rows.items():
        for c in map(CellRecord.of, cells):
            if column_of(c) != GOLDENS:
                continue
            head = c.cell_id.split("[", 1)[1].rstrip("]").replace("golden=", "")
            lines.append(f"| {v} | {head} | {c.outcome} (expected {c.expected}) | "
                         f"{_held(c)} |")
    return "\n".join(lines)


def _short(entry: TableEntry | None) -> str:
    if entry is None or not entry.counts:
        return (entry.note if entry else "") or "-"
    body = ", ".join(f"{n} {o}" for o, n in sorted(entry.counts.items(), key=lambda x: (-x[1], x[0])))
    return body + (f" ({entry.note[:110]})" if entry.note else "")  # the failing key, named


def render_pair_table(rows: dict[str, dict[str, TableEntry]], pairs: dict[str, tuple[str, str]]) -> str:
    """The 2-D table: modelopt x megatron-core -> witness / second bug / fix / goldens."""
    mos = list(dict.fromkeys(mo for mo, _ in pairs.values()))
    mcs = list(dict.fromkeys(mc for _, mc in pairs.values()))
    lines = ["| modelopt \\ megatron-core | " + " | ".join(mcs) + " |",
             "| --- |" + " --- |" * len(mcs)]
    for mo in mos:
        cells = []
        for mc in mcs:
            label = next((k for k, p in pairs.items() if p == (mo, mc)), None)
            row = rows.get(label) if label else None
            if row is None:
                cells.append("not run")
            elif "witness" not in row and "import" in row and not row["import"].counts.get(Outcome.PASS):
                cells.append(f"no env/import: {row['import'].note or '-'}")
            else:
                cells.append(" / ".join(_short(row.get(c)) for c in PAIR_COLUMNS))
        lines.append(f"| {mo} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n(each cell: " + " / ".join(PAIR_COLUMNS) + ")"


def render_table(rows: dict[str, dict[str, TableEntry]], columns=COLUMNS) -> str:
    """Markdown table, version x scenario -> outcome counts [tier]."""
    head = "| modelopt + megatron-core | " + " | ".join(columns) + " |"
    sep = "| --- |" + " --- |" * len(columns)
    lines = [head, sep]
    for v, cells in rows.items():
        lines.append(f"| {v} | " + " | ".join(cells.get(c, TableEntry()).text() for c in columns) + " |")
    return "\n".join(lines)


def first_problem(cells: dict[str, TableEntry]) -> str:
    """The first table cell of a row that failed or could not run, as text."""
    for name, cell in cells.items():
        if any(o not in (Outcome.PASS, "passed", Outcome.SKIPPED) for o in cell.counts):
            return f"{name}: {cell.text()}"
    return "failed"
