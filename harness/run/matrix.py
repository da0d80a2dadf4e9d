"""``python -m harness matrix [--modelopt V ...]``: the scenarios against several ModelOpt versions.

Why: users must know, per nvidia-modelopt release, what is broken, what is fixed and what
happens to the checkpoints they already have. One table says, per version, what ran, on which
tier, and with what outcome, so a "pass" on CPU is never mistaken for a GPU result. Every cell
is judged by the expectations of the version its ranks imported (harness/check/versions.py).

``V`` is a release (``0.48.0rc1``), a local wheel (``path/nvidia_modelopt-V-*.whl``) or, inside
the docker image, a git ref (``git:<ref>``). Per version, ``tools/matrix-env.sh V`` gives an
environment; in it the matrix runs
  * ``import``: this modelopt next to megatron-core (and whether its megatron plugin imports);
  * one ``python -m harness run`` of the decisive cells (``MATRIX_CELLS``): ``witness`` (unpatched,
    the report's and the two jobs' shapes), ``second-bug`` (its loads where a rank holds several
    experts: how many expert amax the model lost), ``fix`` (patched; only where harness.fix
    applies), ``goldens`` (every committed golden loaded unpatched: what the model holds after),
    ``cpu-reshard`` (ModelOpt NVFP4 on megatron's local-spec SequentialMLP, cpu tier; skipped
    with the reason where the version's plugin needs TE). GPU cells skip without a GPU.
  * ``oracle``: the oracle-vs-real-validation test for world 2 (megatron-core only: a control).
Every step runs in its own process session with a timeout and is killed with its children
(harness/bounded.py); the tables are harness/report/matrix_table.py.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import bounded
from harness.paths import REPO_ROOT, RESULTS_DIR, RunDir
from harness.switches import number
from harness.records import UNEXPECTED_OUTCOMES, Outcome, RunResults
from harness.report.matrix_table import (COLUMNS, TableEntry, cells_from_results, first_problem,
                                         goldens_table, render_pair_table, render_table)
from harness.scenario import selections
from harness.tiers import Tier
from moe_ckpt_fix.releases import REFERENCE_MCORE

# Which cells run: scenarios/selections.toml.
MATRIX_CELLS = selections.listed("matrix", "cells")
PAIR_CELLS = selections.listed("matrix", "pair_cells")


def cell_set() -> tuple[str, ...]:
    return PAIR_CELLS if os.environ.get("MATRIX_CELLS_SET") == "pairs" else MATRIX_CELLS


IMPORT_PROBE = (
    "import warnings; warnings.filterwarnings('ignore');"
    "import torch, megatron.core, modelopt, modelopt.torch.quantization;"
    "from modelopt.torch.opt.plugins.mcore_dist_checkpointing import save_sharded_modelopt_state;"
    "from harness.check.versions import plugin_problem, rules_for;"
    "b = rules_for(modelopt.__version__, megatron.core.__version__);"
    "print('modelopt', modelopt.__version__, 'megatron-core', megatron.core.__version__,"
    " 'torch', torch.__version__, '| rule', b.label, '|', plugin_problem() or 'plugin ok')"
)
TIMEOUTS = {"env": 900, "import": 300, "oracle": 600}  # the run's: MATRIX_RUN_TIMEOUT_S
TERM_GRACE_S = 30  # after SIGTERM, before SIGKILL of the whole session


def _is_release(v: str) -> bool:
    """Whether ``v`` is a version pip could install (PEP 440: 0.47.0, 0.48.0rc1)."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(v)
    except InvalidVersion:
        return False
    return True


def versions_from(args) -> list[str]:
    """``--modelopt`` values in order, duplicates dropped; the defaults when none given."""
    from moe_ckpt_fix.releases import DEFAULT_MATRIX

    vs = list(dict.fromkeys(getattr(args, "modelopt", None) or DEFAULT_MATRIX))
    for v in vs:
        if v.endswith(".whl"):
            if not Path(v).is_file():
                raise ValueError(f"--modelopt {v!r}: no such wheel file")
        elif not re.fullmatch(r"(git:)?[0-9A-Za-z][0-9A-Za-z._+/-]*", v) or not (
                v.startswith("git:") or _is_release(v)):  # before any environment is made for it
            raise ValueError(f"--modelopt {v!r}: not a version, a wheel file or git:<ref> "
                             "(a release such as 0.48.0rc1)")
    return vs


def mcores_from(args) -> list[str]:
    """``--mcore`` values in order, a series (0.15.x) resolved to its newest tested patch;
    ValueError (one line) for a value that is not a release or a tested series."""
    from moe_ckpt_fix.releases import DEFAULT_MCORE_MATRIX
    from moe_ckpt_fix.releases import SUPPORTED_MCORE

    out = []
    for v in getattr(args, "mcore", None) or DEFAULT_MCORE_MATRIX:
        if v.endswith(".x"):
            series = [m for m in SUPPORTED_MCORE if m.startswith(v[:-1])]
            if not series:
                raise ValueError(f"--mcore {v!r}: no tested megatron-core in that series "
                                 f"(tested: {', '.join(SUPPORTED_MCORE)})")
            v = series[-1]
        elif not re.fullmatch(r"\d+\.\d+\.\d+[0-9a-z.]*", v):
            raise ValueError(f"--mcore {v!r}: not a megatron-core release (e.g. 0.16.1) or series (0.16.x)")
        out.append(v)
    return list(dict.fromkeys(out))


def pair_label(modelopt: str, mcore: str) -> str:
    return f"modelopt {modelopt} + mcore {mcore}"


def cell_from_pytest(rc: int | None, output: str) -> TableEntry:
    """A pytest summary line ("2 passed, 1 skipped in 9s") -> a TableEntry on tier cpu."""
    counts = {m[1]: int(m[0]) for m in re.findall(r"(\d+) (passed|failed|skipped|error|errors)\b", output)}
    if not counts:
        return TableEntry(note=f"pytest gave no summary (exit {rc})")
    return TableEntry(counts, [Tier.CPU], "megatron-core only, modelopt not exercised")


def _run(cmd: list[str], timeout_s: float, log: Path, env: dict | None = None) -> tuple[int | None, str]:
    """``cmd`` bounded (harness/bounded.py), its output in ``log``: (rc, or None when it
    timed out and its session was killed, SIGTERM first; the output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # The repository first, the host's own entries kept (a GPU host's stack lives on PYTHONPATH).
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    with open(log, "wb") as f:
        # SIGTERM first: a `harness run` then writes its results marked incomplete
        done = bounded.run(cmd, timeout_s, term_grace_s=TERM_GRACE_S, stdout=f,
                           stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=full_env)
    return (None if done.timed_out else done.returncode), log.read_text(errors="replace")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def _env_name(v: str) -> str:
    """Directory-safe name of a version argument (a wheel path or git ref included)."""
    return re.sub(r"[^0-9A-Za-z._+-]+", "_", Path(v).name if v.endswith(".whl") else v)


PAIRS_ORACLE_NOTE = "not run in pairs mode (cpu tier checks it per mcore)"  # six pairs share one host


def imported(probe_line: str) -> TableEntry:
    """The import column of a pair whose import probe passed, from the probe's last line."""
    return TableEntry({Outcome.PASS: 1}, [Tier.CPU], probe_line.replace("modelopt ", "", 1))


def run_version(v: str, root: Path, mcore: str | None = None) -> tuple[dict[str, TableEntry], list[dict]]:
    """Environment, import probe, scenario run and oracle probe for one (ModelOpt, megatron-core)
    pair; returns the table cells and the run's cell records (each naming both versions)."""
    logs = root / (_env_name(v) + (f"-mc{mcore}" if mcore else ""))
    # the reference megatron-core is the base environment's own: no layer for it
    mc_env = {"MATRIX_MCORE": mcore if mcore and mcore != REFERENCE_MCORE else ""}
    rc, out = _run(["bash", "tools/matrix-env.sh", v], TIMEOUTS["env"], logs / "env.log", mc_env)
    if rc != 0:
        why = "timed out" if rc is None else _last_line(out)
        return {"import": TableEntry({"error": 1}, [], f"no env: {why}")}, []
    py = out.strip().splitlines()[-1]
    cells: dict[str, TableEntry] = {}
    rc, out = _run([py, "-c", IMPORT_PROBE], TIMEOUTS["import"], logs / "import.log")
    if rc != 0:
        why = "timed out" if rc is None else _last_line(out)
        cells["import"] = TableEntry({"fail": 1}, [Tier.CPU], why)
        return cells, []  # nothing else can run in this env
    cells["import"] = imported(_last_line(out))
    cmd = [py, "-m", "harness", "--results-root", str(logs / RESULTS_DIR), "run", "--label",
           f"matrix-{logs.name}", "--jobs", str(number("MATRIX_RUN_JOBS"))]
    for s in dict.fromkeys(c.split("[", 1)[0].rstrip("*") for c in cell_set()):
        cmd += ["--scenario", s]
    for c in cell_set():
        cmd += ["--cells", c]
    rc, out = _run(cmd, number("MATRIX_RUN_TIMEOUT_S"), logs / "run.log")
    found = RunDir.results_files(logs / RESULTS_DIR)
    records: list[dict] = []
    if found:
        records = json.loads(found[-1].read_text()).get("cells", [])
        cells.update(cells_from_results({"cells": records}))
    else:
        why = "timed out" if rc is None else f"exit {rc}: {_last_line(out)}"
        cells.update({c: TableEntry({"error": 1}, [], f"no results ({why})") for c in COLUMNS[1:-1]})
    if os.environ.get("MATRIX_CELLS_SET") == "pairs":  # cells only
        cells["oracle"] = TableEntry(note=PAIRS_ORACLE_NOTE)
        return cells, records
    rc, out = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                    "tests/test_oracle_vs_megatron.py", "-k", "real_validation and 2"],
                   TIMEOUTS["oracle"], logs / "oracle.log")
    cells["oracle"] = cell_from_pytest(rc, out) if rc is not None else TableEntry({"error": 1}, [], "timed out")
    return cells, records


def pair_results(root: Path) -> list[tuple[Path, Path]]:
    """(pair directory, results.json) of every run under a matrix run ``root``: each pair's
    runs are <root>/<pair>/results/<run id>/, beside the pair's logs (import.log, run.log)."""
    return [(pair, f) for pair in sorted(root.glob("*/")) for f in RunDir.results_files(pair / RESULTS_DIR)]


def rows_of_cut_off_run(root: Path) -> dict[str, tuple[dict[str, TableEntry], list[dict]]]:
    """Rows of a matrix run stopped before it wrote its table (e.g. a GPU call's time limit):
    each pair's records as written, judged again under today's rules the way the verdict reads
    them (report/equivalence.rejudged_doc), and its import probe's last line."""
    from harness.report.equivalence import rejudged_doc

    done = {}
    for pair, found in pair_results(root):
        doc = rejudged_doc(json.loads(found.read_text()))
        run = RunResults.of(doc)
        label = pair_label(run.version("nvidia-modelopt") or "?", run.version("megatron-core"))
        imp = pair / "import.log"
        note = _last_line(imp.read_text(errors="replace")) if imp.exists() else ""
        cells = {"import": imported(note), **cells_from_results(doc)}
        cells["oracle"] = TableEntry(note=PAIRS_ORACLE_NOTE)
        done[label] = (cells, doc["cells"])
    return done


def from_files(dirs: list[str]) -> dict[str, tuple[dict[str, TableEntry], list[dict]]]:
    """Rows of earlier matrix runs (their matrix.json), later files winning per version: a
    matrix spread over several GPU sessions renders as one table."""
    done: dict = {}
    for d in dirs:
        path = Path(d) / "matrix.json" if Path(d).is_dir() else Path(d)
        if Path(d).is_dir() and not path.exists() and pair_results(Path(d)):
            done.update(rows_of_cut_off_run(Path(d)))
            continue
        try:
            doc = json.loads(path.read_text())
            for v, row in doc.items():
                done[v] = ({c: TableEntry(**cell) for c, cell in row["columns"].items()}, row["cells"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"--from {path}: not a matrix.json of `harness matrix` ({exc})") from None
    return done


def main(args) -> int:
    try:
        versions = versions_from(args)
        mcores = mcores_from(args)
        earlier = from_files(getattr(args, "from_runs", None) or [])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if earlier and not getattr(args, "modelopt", None):
        versions = []  # render only
    pairs = {pair_label(v, mc): (v, mc) for v in versions for mc in mcores}
    root = Path(getattr(args, "results_root", "results")) / f"matrix-{time.strftime('%Y%m%d-%H%M%S')}"
    jobs = number("MATRIX_JOBS", default=len(pairs) or 1)
    print(f"matrix: {', '.join(pairs)} -> {root} (logs per pair; {jobs} at a time)",
          file=sys.stderr)
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        ran = pool.map(lambda p: run_version(p[0], root, p[1]), pairs.values())
        done = {**earlier, **dict(zip(pairs, ran))}
    for label in done:  # rows read back from files name their pair in their label
        m = re.fullmatch(r"modelopt (\S+) \+ mcore (\S+)", label)
        if label not in pairs:  # rows of runs before pairs: the reference megatron-core
            pairs[label] = (m[1], m[2]) if m else (label, REFERENCE_MCORE)
    rows = {v: cells for v, (cells, _) in done.items()}
    table = render_pair_table(rows, pairs) + "\n\n" + render_table(rows)
    goldens = goldens_table({v: recs for v, (_, recs) in done.items()})
    root.mkdir(parents=True, exist_ok=True)
    (root / "matrix.md").write_text(f"{table}\n\nGoldens, loaded unpatched:\n\n{goldens}\n")
    (root / "matrix.json").write_text(json.dumps(
        {v: {"columns": {c: vars(cell) for c, cell in cells.items()}, "cells": recs}
         for v, (cells, recs) in done.items()}, indent=1))
    print(table)
    print(f"\nGoldens, loaded unpatched:\n{goldens}")
    print(f"\n[tier] = where the cell ran; gpu tiers are skipped without a GPU. "
          f"{time.time() - t0:.0f} s; {root}/matrix.md")
    bad = [v for v, cells in rows.items() if any(
        n for c in cells.values() for o, n in c.counts.items()
        if o in ("fail", "failed", "error", "errors", Outcome.RULE_UNKNOWN, *UNEXPECTED_OUTCOMES))]
    for v in bad:  # one line each: a nightly job goes red on a typo, a broken or an unruled pair
        print(f"matrix: error: {v}: {first_problem(rows[v])}", file=sys.stderr)
    return 1 if bad else 0
