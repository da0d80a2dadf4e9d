"""What several test modules share, so no test module imports another (an import runs that
module's top level, its skips and probes, inside the importing one, and ties the two together).

Processes run through harness/bounded.py; what is test-only is that a timeout fails the
test, and the facts of the interrupt tests and of tools/gitlab-ci-local.sh.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import bounded as bounded_process
from harness.launch.pool import processes_where
from harness.paths import REPO_ROOT

# tools/gitlab-ci-local.sh: the pin is its default unless GITLAB_CI_LOCAL_VERSION overrides it
GITLAB_CI_LOCAL = REPO_ROOT / "tools" / "gitlab-ci-local.sh"
GITLAB_CI_LOCAL_VERSION = os.environ.get("GITLAB_CI_LOCAL_VERSION") or re.search(
    r"GITLAB_CI_LOCAL_VERSION:-([0-9][^}]*)\}", GITLAB_CI_LOCAL.read_text()).group(1)
MISSING_PREREQUISITE = 127  # the script's exit status when node, npm, ... is missing

# A cpu save-only cell: the interrupt tests hang its ranks (HARNESS_INJECT) until a signal comes.
CPU_SAVE_ONLY_CELL = "cpu-reshard[save=tp1-etp1-ep2-pp1,save-only]"
TEARDOWN_LIMIT_S = 15.0  # signal -> controller gone, every rank with it


def bounded(cmd: list[str], timeout: float, **popen_kw) -> bounded_process.Finished:
    """``cmd`` to its end, text on pipes; running past ``timeout`` (its whole group then
    killed) fails the test with the tail of its stderr."""
    done = bounded_process.run(cmd, timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, **popen_kw)
    if done.timed_out:
        raise AssertionError(f"{cmd[:3]} ran past {timeout} s\n--- stderr\n{done.stderr[-4000:]}")
    return done


def start_cli(root: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``python -m harness --results-root ROOT ARGS`` in a session of its own, output on a pipe."""
    return bounded_process.start(
        [sys.executable, "-m", "harness", "--results-root", str(root), *args],
        cwd=REPO_ROOT, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stage_processes(root: Path) -> list[int]:
    """Processes whose stage or warm pool directory lies under ``root`` (ranks and torchrun;
    pool ranks get their stage directory per job, so they are found by their pool's), and
    those of the warm parents this worker keeps (``kept_parent_stages``)."""
    under = [p.pid for p in processes_where(
        lambda env: any(str(root) in env.get(k, "") for k in ("HARNESS_STAGE_DIR", "HARNESS_POOL_DIR")),
        zombies=True)]
    return under + kept_parent_stages()


def pool_processes(root: Path) -> list[int]:
    """Live processes of any pool under ``root`` (the pool dir is in their environment), and
    those of the warm parents this worker keeps (``kept_parent_stages``)."""
    under = processes_where(lambda env: str(root) in env.get("HARNESS_POOL_DIR", ""))
    return [p.pid for p in under] + kept_parent_stages()


def kept_parent_stages() -> list[int]:
    """The stage agents and ranks of the warm parents kept across this worker's runs (conftest.py
    ``warm_parents_per_worker``), the parents themselves left out: a forked rank shows its
    parent's environment, whose directory lies outside any test's, so a run's leftover rank
    would hide there; between stages a kept parent runs none."""
    from harness.launch import pool
    from harness.launch.warm import WARM

    return [p.pid for parent in WARM.kept() for p in pool.pool_processes(parent.dir)
            if parent.proc is None or p.pid != parent.proc.pid]


def wait_for(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def interrupt_a_hung_stage(root: Path, sig: signal.Signals) -> tuple[subprocess.Popen, str, float]:
    """Start a cell whose ranks all hang after building the model (only a signal ends it) and
    interrupt it with ``sig`` (``interrupt_once_staged``)."""
    proc = start_cli(root, "run", "--cells", CPU_SAVE_ONLY_CELL, "--label", "interrupt",
                     env={"HARNESS_INJECT": "hang:*:after_build"})
    return interrupt_once_staged(proc, root, sig)


def interrupt_once_staged(proc: subprocess.Popen, root: Path, sig: signal.Signals) -> tuple[subprocess.Popen, str, float]:
    """Once a stage under ``root`` runs (torchrun and two ranks), send ``proc`` ``sig`` as a
    terminal (SIGINT to its process group) or CI (SIGTERM) does; returns ``proc``, its output
    and the seconds from the signal to its exit. ``proc`` is killed with its group at the end."""
    try:
        assert wait_for(lambda: len(stage_processes(root)) >= 3, 120), "stage never started"
        time.sleep(1.0)
        sent = time.monotonic()
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
        out = bounded_process.finish(proc, 60).raise_if_timed_out().stdout
        return proc, out, time.monotonic() - sent
    finally:
        bounded_process.kill_group(proc)


# --- torch_dist checkpoints from the GPU recordings, written by ONE make-ckpt torchrun --------
# tests/test_golden.py and tests/test_inspect_ckpt.py each need a few small checkpoints that one
# world-1 rank writes with megatron-core's real torch_dist save (tests/rank_programs/make_ckpt.py).
# Most of such a run is the rank's imports, so every checkpoint of both files is written by one
# run (conftest.py ``made_checkpoints``, session-scoped; both files share an xdist group).
RECORDED = Path(__file__).parent / "data" / "recorded"
INSPECT_SOURCE = RECORDED / "tp1-etp1-ep8-fix.json"
# (layer, linear) -> global experts whose amax the inspector's "missing" variant drops
INSPECT_DROPPED = {(0, "linear_fc1"): [1, 3], (1, "linear_fc2"): [5]}
GOLDEN_RECORDING = RECORDED / "tp2-etp2-ep4-fix.json"
MAKE_CKPT_GROUP = "make-ckpt"  # the xdist group of the files that use made_checkpoints


def recorded_tensors(path: Path) -> list[dict]:
    """Unique keys of a recording (all ranks), with global shape: a world-1 save of them."""
    import json

    seen: dict[str, dict] = {}
    for e in json.loads(path.read_text())["entries"]:
        seen.setdefault(e["key"], {"key": e["key"], "dtype": e["dtype"], "shape": e["global_shape"]})
    return list(seen.values())


def as_shared(tensors: list[dict]) -> list[dict]:
    """Fold per-expert weight-quantizer amax into ModelOpt 0.46.1's single key per grouped linear."""
    from harness.check.keys import PER_EXPERT_WEIGHT_AMAX as PER_EXPERT

    out, done = [], set()
    for t in tensors:
        m = PER_EXPERT.match(t["key"])
        if not m:
            out.append(t)
            continue
        legacy = re.sub(r"\.experts\.experts\.\d+\.", ".experts.", t["key"])
        if legacy not in done:
            done.add(legacy)
            out.append({**t, "key": legacy})
    return out


def without(tensors: list[dict], dropped: dict) -> list[dict]:
    """``tensors`` without the per-expert weight amax of the experts ``dropped`` names."""
    from harness.check.keys import PER_EXPERT_WEIGHT_AMAX as PER_EXPERT

    def keep(t):
        m = PER_EXPERT.match(t["key"])
        return not (m and int(m["expert"]) in dropped.get((int(m["layer"]), m["linear"]), []))

    return [t for t in tensors if keep(t)]


def made_checkpoint_specs() -> dict[str, dict]:
    """name -> {seed, tensors} of every checkpoint the two files use. ``golden/tiny-per-expert``:
    the keys of one layer of a tp2-etp2-ep4 recording (test_golden.py adds its manifest);
    ``inspect/<variant>``: the per-expert layout as recorded, the pre-0.47 shared layout, some
    experts' amax missing, and no quantizer state at all (test_inspect_ckpt.py)."""
    import json

    layer0: dict[str, dict] = {}
    for e in json.loads(GOLDEN_RECORDING.read_text())["entries"]:
        if ".layers.0.mlp." in e["key"]:
            layer0.setdefault(e["key"], {"key": e["key"], "dtype": e["dtype"], "shape": e["global_shape"]})
    base = recorded_tensors(INSPECT_SOURCE)
    specs = {"golden/tiny-per-expert": {"seed": 3, "tensors": list(layer0.values())}}
    variants = {"per-expert": base, "shared": as_shared(base), "missing": without(base, INSPECT_DROPPED),
                "unquantized": [t for t in base if "_quantizer." not in t["key"]]}
    specs.update({f"inspect/{name}": {"seed": 7, "tensors": ts} for name, ts in variants.items()})
    return specs


def make_checkpoints(root: Path, specs: dict[str, dict]) -> dict[str, Path]:
    """Write every checkpoint of ``specs`` under ``root`` in one make-ckpt torchrun (one rank);
    name -> its directory. The golden one is written as ``<name>/ckpt`` (a golden's layout)."""
    import json

    from harness.launch.stages import run_module_stage

    out = {name: root / name / "ckpt" if name.startswith("golden/") else root / name for name in specs}
    spec = {"checkpoints": [{"out": str(out[name]), **s} for name, s in specs.items()]}
    (root / "spec.json").write_text(json.dumps(spec))
    run = run_module_stage("make-ckpt", root / "stage", 1, [str(root / "spec.json")], 180,
                           "tests.rank_programs.make_ckpt")
    assert run.ok, run.summary()
    return out


# --- the committed records, read with plain json (tests of the gate and the evidence page) ----
def committed_cells() -> list[tuple[str, str, list[dict]]]:
    """(file, created, cells) of every committed record under tests/data/runs/, each cell naming
    its pair: its own ``modelopt``/``mcore``, else its run's versions; a run without
    megatron-core ran on the reference (harness/check/versions.py REFERENCE_MCORE). A matrix.json
    keeps cells per version and no ``created``: its name's stamp orders it."""
    import json

    from moe_ckpt_fix.releases import REFERENCE_MCORE
    from harness.paths import COMMITTED_RUNS

    out = []
    for p in sorted(COMMITTED_RUNS.glob("*.results.json")):
        doc = json.loads(p.read_text())
        v = doc.get("versions") or {}
        cells = [{**c, "modelopt": c.get("modelopt") or v.get("nvidia-modelopt"),
                  "mcore": c.get("mcore") or v.get("megatron-core") or REFERENCE_MCORE}
                 for c in doc["cells"]]
        out.append((p.name, doc["created"], cells))
    for p in sorted(COMMITTED_RUNS.glob("*.matrix.json")):
        stamp = p.name[:13]
        created = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}"
        for part in json.loads(p.read_text()).values():
            cells = [{**c, "mcore": c.get("mcore") or REFERENCE_MCORE} for c in part["cells"]]
            out.append((p.name, created, cells))
    return out


def merged_pair(raw, pair) -> dict[str, dict]:
    """The pair's records of ``raw`` (committed_cells) together: the newer run wins for a cell,
    except that a skipped or interrupted cell never hides a result (README: the gate's rule)."""
    out: dict[str, dict] = {}
    for _, _, cells in sorted(raw, key=lambda r: r[1]):
        for c in cells:
            if (c["modelopt"], c["mcore"]) != tuple(pair):
                continue
            if c["outcome"] not in ("skipped", "interrupted") or c["cell_id"] not in out:
                out[c["cell_id"]] = c
    return out


def fix_patches(pair, parts) -> tuple[bool, bool]:
    """(whether the fix's package patches ``pair`` for a scenario needing ``parts``, whether with
    only parts the release lacks), from moe_ckpt_fix's own version lists."""
    import moe_ckpt_fix as fix

    modelopt, mcore = pair
    if mcore not in fix.SUPPORTED_MCORE_VERSIONS:
        return False, False
    if modelopt == fix.SUPPORTED_MODELOPT_VERSION:
        return True, False
    only = fix.PARTS_ONLY_VERSIONS.get(modelopt, ())
    runs = bool(parts) and set(parts) <= set(only)
    return runs, runs


def expected_verdict(raw, job, pair, patched: bool = False) -> str | None:
    """The verdict word the quarantine rules (harness/report/verdict.py's docstring) give the
    pair's records of ``job``'s cells, each re-judged by today's judge (harness/check/rejudge.py);
    None: nothing decides. ``patched``: for a pipeline with the fix where the fix patches the
    pair: judged on the fix cells alone where it has only parts the release lacks, and
    undecided while fix cells are missing."""
    from harness.check.rejudge import rejudge_record
    from harness.report import verdict

    witness, fix = verdict.evidence_cells(job)
    runs, parts_only = fix_patches(pair, fix[0].scenario.fix_parts if fix else ())
    patched = patched and runs
    if patched and parts_only:
        witness = []
    merged = merged_pair(raw, pair)

    def outcomes(cells):
        got = []
        for c in cells:
            rec = merged.get(c.id)
            if rec is None or rec["outcome"] in ("skipped", "interrupted"):
                got.append(None)
            else:
                got.append(rejudge_record(rec, c.plan)["outcome"])
        return got

    w, f = outcomes(witness), outcomes(fix)
    if "unexpected-failure" in w + f:
        return verdict.UNEXPECTED
    if w and None not in w and set(w) <= {"pass", "unexpected-pass", "known-refusal"} \
            and set(w) != {"known-refusal"}:
        return verdict.SAFE
    if f and None not in f and set(f) <= {"pass", "known-refusal"} and set(f) != {"known-refusal"}:
        return verdict.SAFE_WITH_PATCH
    if "bug-reproduced" in w and not (patched and None in f):
        return verdict.BLOCKED
    return None


def own_recipe_job(root: Path, recipe: str, save: str, loads: list[str]):
    """A job owner's profile in files under ``root``: a quarantine file with one job (id
    ``mine``, reloaded first at ``loads[0]``) whose recipe is ``recipe``, and its witness and fix
    scenarios (gpu-shared, te) at ``save`` and ``loads``. -> (Quarantine, [witness, fix])."""
    from harness.report.jobs import load_quarantine
    from harness.scenario.scenarios import load_scenario

    head = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\n'
    grid = "[" + ", ".join(f'"{t}"' for t in loads) + "]"
    for name, patch in (("mine-witness", "none"), ("mine-fix", "fix")):
        (root / f"{name}.toml").write_text(head + f'name = "{name}"\npatch = "{patch}"\n'
                                           f'recipe = "{recipe}"\nsaves = ["{save}"]\nloads = {grid}\n')
    (root / "q.toml").write_text(
        f'[[jobs]]\nid = "mine"\nname = "a job with its own recipe"\npipeline = "p"\nissue = "i"\n'
        f'review_by = "2027-01-01"\nfailing_stage = "load"\nproduction_save = "{save}"\n'
        f'production_load = "{loads[0]}"\nsave = "{save}"\nload = "{loads[0]}"\n'
        f'[jobs.profile]\nrecipe = "{recipe}"\nmodules = "routed experts"\n'
        f'witness_scenario = "mine-witness"\nfix_scenario = "mine-fix"\nloads = {grid}\n')
    scenarios = [load_scenario(root / f"{n}.toml") for n in ("mine-witness", "mine-fix")]
    return load_quarantine(root / "q.toml"), scenarios


def one_rank_store():
    """A TCPStore for a world-1 process group on a port the kernel picks when it binds (port 0):
    no fixed or inherited ``MASTER_PORT``, so no two tests can meet on one address."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, 1, is_master=True)


# --- a 2-rank cpu stage on a pool (tests/test_pool.py, tests/test_fail_closed.py) ---
def pool_spec(root: Path, stage: str, topo: str):
    from harness.model.gpt import CPU_SIZE
    from harness.rank.spec import StageSpec

    return StageSpec(stage, topo, "cpu", "local", str(root / "save" / "ckpt"),
                     str(root / "save" / "reference"), size=CPU_SIZE.as_dict())


def pool_key(root: Path, world: int):
    from harness.launch.pool import PoolKey

    return PoolKey.of(world, "cpu", "none", "local", root)


def harness_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd: Path = REPO_ROOT,
                **popen_kw) -> bounded_process.Finished:
    """``python -m harness ARGS`` in a child to its end, ``env`` over this process's environment;
    past ``timeout`` its group is killed and the test fails (``bounded``)."""
    return bounded([sys.executable, "-W", "ignore", "-m", "harness", *args], timeout, cwd=cwd,
                   env={**os.environ, **(env or {})}, **popen_kw)


def one_error_line(done, *words: str, code: int | None = None) -> str:
    """The command failed (with exit ``code`` when given) with one line on stderr holding every
    word, no traceback; returns the line."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 if code is None else done.returncode == code, \
        (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
