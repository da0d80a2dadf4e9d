"""``python -m harness matrix [--modelopt V ...]``: the scenarios against several ModelOpt versions.

Why: the report says the failure also hits an older checkpoint, and ModelOpt changed the
grouped-MLP quantizer layout between 0.46.1 (one shared weight quantizer) and 0.47.0 (one per
expert). One table must say, per version, what ran, on which tier, and with what outcome, so a
"pass" on CPU is never mistaken for a GPU result.

Per version: ``tools/matrix-env.sh V`` gives an environment (.venv-modelopt-V, layered on .venv);
in it the matrix runs
  * ``import``: does this modelopt import next to megatron-core on this machine (tier cpu);
  * ``gpu-witness`` / ``gpu-fix``: ``python -m harness run`` of both scenarios (skipped with the
    runner's reason without a GPU), plus one ``cpu-reshard`` cell (ModelOpt NVFP4 on megatron's
    local-spec SequentialMLP, saved on 2 gloo ranks and reloaded on 1: exercises the version's
    quantize + sharded save + restore on CPU, not TEGroupedMLP);
  * ``oracle``: the oracle-vs-real-validation test for world 2 (megatron-core only; it builds the
    amax ShardedTensors itself, so it does NOT exercise modelopt: a control that the env works).
Every step runs in its own process session with a timeout and is killed with its children.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VERSIONS = ("0.46.1", "0.47.0")
COLUMNS = ("import", "gpu-witness", "gpu-fix", "cpu-reshard", "oracle")
RUN_SCENARIOS = ("gpu-witness", "gpu-fix", "cpu-reshard")
CPU_CELL = "cpu-reshard[save=tp1-etp1-ep2-pp1,load=tp1-etp1-ep1-pp1]"
IMPORT_PROBE = (
    "import warnings; warnings.filterwarnings('ignore');"
    "import torch, megatron.core, modelopt, modelopt.torch.quantization;"
    "from modelopt.torch.opt.plugins.mcore_dist_checkpointing import save_sharded_modelopt_state;"
    "print('modelopt', modelopt.__version__, 'megatron-core', megatron.core.__version__,"
    " 'torch', torch.__version__)"
)
TIMEOUTS = {"env": 900, "import": 300, "run": 900, "oracle": 600}


@dataclass
class Cell:
    """One table cell: outcome counts and the tier(s) they came from."""

    counts: dict[str, int] = field(default_factory=dict)
    tiers: list[str] = field(default_factory=list)
    note: str = ""

    def text(self) -> str:
        if not self.counts:
            return self.note or "-"
        body = ", ".join(f"{n} {o}" for o, n in sorted(self.counts.items(), key=lambda x: (-x[1], x[0])))
        tier = "/".join(self.tiers) if self.tiers else "?"
        return f"{body} [{tier}]" + (f" ({self.note})" if self.note else "")


def versions_from(args) -> list[str]:
    """``--modelopt`` values in order, duplicates dropped; the defaults when none given."""
    vs = list(dict.fromkeys(getattr(args, "modelopt", None) or DEFAULT_VERSIONS))
    for v in vs:
        if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._+-]*", v):
            raise ValueError(f"--modelopt {v!r}: not a version or git ref")
    return vs


def cells_from_results(doc: dict) -> dict[str, Cell]:
    """results.json of one ``harness run`` -> a Cell per scenario (skip reasons kept short)."""
    out: dict[str, Cell] = {}
    reasons: dict[str, Counter] = {}
    for c in doc.get("cells", []):
        cell = out.setdefault(c["scenario"], Cell())
        cell.counts[c["outcome"]] = cell.counts.get(c["outcome"], 0) + 1
        if c["tier"] not in cell.tiers:
            cell.tiers.append(c["tier"])
        if c["outcome"] in ("skipped", "blocked") and c.get("reason"):
            reasons.setdefault(c["scenario"], Counter())[c["reason"].split(";")[0]] += 1
    for s, r in reasons.items():
        out[s].note = r.most_common(1)[0][0]
    return out


def cell_from_pytest(rc: int | None, output: str) -> Cell:
    """A pytest summary line ("2 passed, 1 skipped in 9s") -> a Cell on tier cpu."""
    counts = {m[1]: int(m[0]) for m in re.findall(r"(\d+) (passed|failed|skipped|error|errors)\b", output)}
    if not counts:
        return Cell(note=f"pytest gave no summary (exit {rc})")
    return Cell(counts, ["cpu"], "megatron-core only, modelopt not exercised")


def render_table(rows: dict[str, dict[str, Cell]], columns=COLUMNS) -> str:
    """Markdown table, version x scenario -> outcome counts [tier]."""
    head = "| modelopt | " + " | ".join(columns) + " |"
    sep = "| --- |" + " --- |" * len(columns)
    lines = [head, sep]
    for v, cells in rows.items():
        lines.append(f"| {v} | " + " | ".join(cells.get(c, Cell()).text() for c in columns) + " |")
    return "\n".join(lines)


def _run(cmd: list[str], timeout_s: float, log: Path, env: dict | None = None) -> tuple[int | None, str]:
    """Run in a new session; on timeout kill the whole session. Returns (rc or None, output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                             env=full_env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def run_version(v: str, root: Path) -> dict[str, Cell]:
    """Environment, import probe, scenario run and oracle probe for one ModelOpt version."""
    logs = root / v
    rc, out = _run(["bash", "tools/matrix-env.sh", v], TIMEOUTS["env"], logs / "env.log")
    if rc != 0:
        why = "timed out" if rc is None else _last_line(out)
        return {"import": Cell(note=f"no env: {why}")}
    py = out.strip().splitlines()[-1]
    cells: dict[str, Cell] = {}
    rc, out = _run([py, "-c", IMPORT_PROBE], TIMEOUTS["import"], logs / "import.log")
    if rc != 0:
        why = "timed out" if rc is None else _last_line(out)
        cells["import"] = Cell({"fail": 1}, ["cpu"], why)
        return cells  # nothing else can run in this env
    cells["import"] = Cell({"pass": 1}, ["cpu"], _last_line(out).replace("modelopt ", "", 1))
    cmd = [py, "-m", "harness", "--results-root", str(logs / "results"), "run", "--label",
           f"matrix-{v}", "--cells", "gpu-*", "--cells", CPU_CELL]
    for s in RUN_SCENARIOS:
        cmd += ["--scenario", s]
    rc, out = _run(cmd, TIMEOUTS["run"], logs / "run.log")
    found = sorted((logs / "results").glob("*/results.json"))
    if found:
        cells.update(cells_from_results(json.loads(found[-1].read_text())))
    else:
        why = "timed out" if rc is None else f"exit {rc}: {_last_line(out)}"
        cells.update({s: Cell(note=f"no results ({why})") for s in RUN_SCENARIOS})
    rc, out = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                    "tests/test_oracle_vs_megatron.py", "-k", "real_validation and 2"],
                   TIMEOUTS["oracle"], logs / "oracle.log")
    cells["oracle"] = cell_from_pytest(rc, out) if rc is not None else Cell(note="timed out")
    return cells


def main(args) -> int:
    try:
        versions = versions_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = Path(getattr(args, "results_root", "results")) / f"matrix-{time.strftime('%Y%m%d-%H%M%S')}"
    jobs = int(os.environ.get("MATRIX_JOBS", len(versions)))
    print(f"matrix: modelopt {', '.join(versions)} -> {root} (logs per version; {jobs} at a time)",
          file=sys.stderr)
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = dict(zip(versions, pool.map(lambda v: run_version(v, root), versions)))
    table = render_table(rows)
    root.mkdir(parents=True, exist_ok=True)
    (root / "matrix.md").write_text(table + "\n")
    (root / "matrix.json").write_text(json.dumps(
        {v: {c: vars(cell) for c, cell in cells.items()} for v, cells in rows.items()}, indent=1))
    print(table)
    print(f"\n[tier] = where the cell ran; gpu tiers are skipped without a GPU. "
          f"{time.time() - t0:.0f} s; {root}/matrix.md")
    bad = any(n for cells in rows.values() for c in cells.values()
              for o, n in c.counts.items() if o in ("fail", "failed", "error", "errors",
                                                     "unexpected-failure", "unexpected-pass"))
    return 1 if bad else 0
