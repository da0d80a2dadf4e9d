"""Run one cell: a save torchrun (shared by every cell with the same save), then a load torchrun;
turn what happened into a CellRecord with an outcome judged against the expectation.
"""
from __future__ import annotations

import json
import re
import threading
from collections import defaultdict
from pathlib import Path

from harness.launch.torchrun import run_stage
from harness.run.results import CellRecord, write_record
from harness.scenario.scenarios import Cell
from harness.rank.spec import StageSpec

BUG_EXCEPTION = "CheckpointingException"
BUG_TEXT = "Invalid access pattern"
BUG_KEY = re.compile(r"weight_quantizer\._amax$")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def _spec(cell: Cell, stage: str, topo, save_dir: Path) -> StageSpec:
    s = cell.scenario
    return StageSpec(
        stage=stage, topology=topo.id, tier=s.tier, backend=s.backend,
        ckpt_dir=str(save_dir / "ckpt"), reference_dir=str(save_dir / "reference"),
        patch=s.patch, size=s.size.as_dict(),
        singleton_local_shards=s.singleton_local_shards, strict_load=s.strict_load,
    )


_save_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)


def run_save(cell: Cell, run_dir: Path):
    """The save stage for ``cell.save_id``; reused when an earlier cell already ran it.

    Golden cells have no save-only cell to run first, so concurrent loads of one golden
    serialize here on its preparation.
    """
    save_dir = run_dir / "saves" / _safe(cell.save_id)
    with _save_locks[str(save_dir)]:
        return _run_save_once(cell, save_dir)


def _run_save_once(cell: Cell, save_dir: Path):
    done = save_dir / "stage.json"
    if done.exists():
        return json.loads(done.read_text())
    if cell.golden:
        outcome = prepare_golden(cell.golden, save_dir)
    else:
        outcome = _launch(_spec(cell, "save", cell.save, save_dir), save_dir, cell)
    done.write_text(json.dumps(outcome, indent=2))
    return outcome


def prepare_golden(name: str, save_dir: Path) -> dict:
    """Stand-in for a save stage: a verified copy of the golden and its expected state.

    The copy (harness.golden.manifest.copy_to_temp) keeps the committed bytes out of every load's reach;
    the layout comes from the checkpoint's metadata before anything loads it.
    """
    import shutil
    import time

    from harness.golden.manifest import copy_to_temp
    from harness.check.expect import expected_state, read_checkpoint_tensors, write_reference
    from harness.golden.inspect import inspect_checkpoint
    from harness.scenario.scenarios import GOLDEN_DIR, golden_topology

    start = time.monotonic()
    save_dir.mkdir(parents=True, exist_ok=True)
    copy = copy_to_temp(GOLDEN_DIR / name, into=save_dir)
    shutil.move(str(copy / "ckpt"), str(save_dir / "ckpt"))
    shutil.rmtree(copy.parent)
    layout = inspect_checkpoint(save_dir / "ckpt")
    exp = expected_state(read_checkpoint_tensors(save_dir / "ckpt"), _runtime_layout())
    write_reference(exp, save_dir / "reference", golden_topology(name).id)
    summary = (f"golden {name}: layout {layout.kind}, "
               f"{sum(len(v) for v in layout.missing.values())} expert amax missing; "
               f"expected state {exp.summary()}")
    return {"stage": "golden", "ok": True, "wall_s": round(time.monotonic() - start, 2),
            "timed_out": False, "teardown_s": None, "leftovers": [], "cause": None,
            "secondaries": [], "summary": summary,
            "rank_results": {"0": {"layout": layout.as_json(), "expected": exp.summary()}}}


def _runtime_layout() -> str:
    """The quantizer layout of the modelopt the load ranks import (this interpreter's)."""
    from harness.check.versions import behaviour_for, installed_modelopt

    return behaviour_for(installed_modelopt()).layout


def _launch(spec: StageSpec, stage_dir: Path, cell: Cell) -> dict:
    spec_path = spec.write(stage_dir / "spec.json")
    run = run_stage(
        spec.stage, stage_dir, spec.topo.world_size, [str(spec_path)],
        timeout_s=cell.scenario.stage_timeout_s, env=_tier_env(spec.tier),
    )
    cause = run.cause
    return {
        "stage": spec.stage,
        "ok": run.ok,
        "environment": _ranks_environment(stage_dir),
        "wall_s": round(run.wall_s, 2),
        "timed_out": run.timed_out,
        "teardown_s": run.teardown_s,
        "leftovers": run.leftovers,
        "cause": None if cause is None else {
            "rank": cause.rank, "kind": cause.kind, "exc_type": cause.exc_type,
            "message": cause.message, "key": cause.key,
        },
        "secondaries": [
            f"rank {f.rank}: {f.exc_type or f.kind}: {f.first_line()}" for f in run.secondaries
        ],
        "rank_results": {str(k): v for k, v in run.rank_results.items()},
        "summary": run.summary(),
    }


def _ranks_environment(stage_dir: Path) -> dict:
    """Package versions the ranks imported (stages.record_environment), {} if none got there."""
    path = stage_dir / "environment.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _tier_env(tier: str) -> dict:
    env = {}
    if tier == "gpu":
        from harness.rank.guard import nccl_env

        env.update(nccl_env())
    return env


def _is_bug(cause: dict | None) -> bool:
    return bool(
        cause
        and (cause.get("exc_type") or "").endswith(BUG_EXCEPTION)
        and BUG_TEXT in (cause.get("message") or "")
        and BUG_KEY.search(cause.get("key") or "")
    )


def _fill_failure(rec: CellRecord, stage: dict) -> None:
    cause = stage["cause"] or {}
    rec.failed_stage = stage["stage"]
    rec.exception_type = cause.get("exc_type") or cause.get("kind")
    rec.message = (cause.get("message") or stage.get("summary") or "")[:2000]
    rec.failing_key = cause.get("key")
    rec.first_failure_rank = cause.get("rank")
    rec.secondary_errors = stage["secondaries"]
    rec.teardown_s = stage.get("teardown_s")


def _judge_failure(rec: CellRecord, stage: dict, expected_stage: str) -> None:
    _fill_failure(rec, stage)
    if rec.expected == expected_stage and _is_bug(stage["cause"]):
        rec.outcome = "bug-reproduced"
    else:
        rec.outcome = "unexpected-failure"
        if stage.get("timed_out"):
            rec.reason = f"{stage['stage']} stage timed out"


def _rank0(stage: dict) -> dict:
    return stage["rank_results"].get("0", {})


def _verify_problems(verify: dict, known_gaps) -> list[str]:
    problems = []
    if verify.get("mismatch_count"):
        first = verify["mismatches"][0]
        problems.append(f"{verify['mismatch_count']} tensor(s) differ, first {first['key']}")
    missing = [k for k in verify.get("missing_keys", [])
               if not any(g.matches(k) for g in known_gaps)]
    if missing:
        problems.append(f"{len(missing)} saved key(s) absent after load, first {missing[0]}")
    if verify.get("unexpected_keys"):
        problems.append(f"keys not in the saved model: {verify['unexpected_keys'][0]}")
    if verify.get("logits_ok") is False:
        from harness.rank.logits import logits_problems

        problems += logits_problems(verify)
    return problems


def version_skip_reason(cell: Cell, behaviour, modelopt: str | None) -> str | None:
    """Why the installed nvidia-modelopt cannot run this cell meaningfully, or None."""
    s = cell.scenario
    if s.patch == "fix" and not behaviour.fix_applies:
        from harness.fix import SUPPORTED_MODELOPT_VERSION

        return (f"harness.fix is written for nvidia-modelopt {SUPPORTED_MODELOPT_VERSION} only; "
                f"{modelopt} is installed (a fixed release needs no patch: see the unpatched "
                "scenarios)")
    if s.tier == "cpu" and (behaviour.plugin_needs_te or not behaviour.known):
        from harness.check.versions import plugin_problem

        return plugin_problem()
    return None


def _judge_under_version(rec: CellRecord, cell: Cell, stage: dict | None) -> None:
    """Expectations of the nvidia-modelopt the stage's ranks imported (the controller's until a
    stage has reported)."""
    from harness.check.versions import behaviour_for

    ran = ((stage or {}).get("environment") or {}).get("nvidia-modelopt")
    rec.modelopt = ran or rec.modelopt
    behaviour = behaviour_for(rec.modelopt)
    rec.expectations = behaviour.label
    rec.notice = behaviour.notice(rec.modelopt)
    rec.expected = cell.expected_under(behaviour)


def new_record(cell: Cell) -> CellRecord:
    from harness.check.versions import installed_modelopt

    s = cell.scenario
    rec = CellRecord(
        scenario=s.name, cell_id=cell.id, tier=s.tier, backend=s.backend,
        save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
        patch=s.patch, expected="", modelopt=installed_modelopt(),
    )
    _judge_under_version(rec, cell, None)
    return rec


def run_cell(cell: Cell, run_dir: Path) -> CellRecord:
    from harness.check.versions import behaviour_for

    s = cell.scenario
    rec = new_record(cell)
    skip = version_skip_reason(cell, behaviour_for(rec.modelopt), rec.modelopt)
    if skip:
        rec.outcome, rec.reason = "skipped", skip
        return _finish(rec, cell, run_dir)
    save = run_save(cell, run_dir)
    _judge_under_version(rec, cell, save)
    rec.durations["save_stage"] = save["wall_s"]
    rec.durations.update({f"save.{k}": v for k, v in _rank0(save).get("durations", {}).items()})
    if cell.load is None:
        if not save["ok"]:
            _judge_failure(rec, save, "fail-save")
        elif rec.expected == "fail-save":
            rec.outcome = "unexpected-pass"
            rec.reason = bug_gone_message(rec)
        else:
            rec.outcome = "pass"
        return _finish(rec, cell, run_dir)
    if not save["ok"]:
        rec.outcome = "blocked"
        rec.reason = f"blocked by the save at {cell.save.id}, which failed; not run"
        if rec.expected != "fail-save":
            rec.outcome = "unexpected-failure"
            _fill_failure(rec, save)
        return _finish(rec, cell, run_dir)

    load_dir = run_dir / "cells" / _safe(cell.id) / "load"
    load = _launch(_spec(cell, "load", cell.load, run_dir / "saves" / _safe(cell.save_id)),
                   load_dir, cell)
    _judge_under_version(rec, cell, load)
    rec.durations["load_stage"] = load["wall_s"]
    rec.durations.update({f"load.{k}": v for k, v in _rank0(load).get("durations", {}).items()})
    if not load["ok"]:
        _judge_failure(rec, load, "fail-load")
        if rec.expected == "not-restored" and not load.get("timed_out"):
            rec.outcome = "bug-reproduced"  # any clean refusal to load counts; the cause says which
        return _finish(rec, cell, run_dir)
    rec.verify = _rank0(load).get("verify", {})
    problems = _verify_problems(rec.verify, s.known_gaps)
    if rec.expected == "not-restored":
        if problems:
            rec.outcome, rec.failed_stage = "bug-reproduced", "verify"
            rec.message = "; ".join(problems + [held_after_load(rec.verify)])
        else:
            rec.outcome = "unexpected-pass"
            rec.reason = ("expected unpatched modelopt to fail restoring this golden checkpoint, "
                          "but every tensor matched: older checkpoints now load without the fix")
    elif rec.expected == "amax-lost":
        _judge_amax_lost(rec, s.known_gaps, problems)
    elif rec.expected in ("fail-load", "fail-save"):
        rec.outcome, rec.reason = "unexpected-pass", bug_gone_message(rec)
    elif problems:
        rec.outcome, rec.failed_stage = "unexpected-failure", "verify"
        rec.message = "; ".join(problems)
    else:
        rec.outcome = "pass"
    return _finish(rec, cell, run_dir)


def _judge_amax_lost(rec: CellRecord, known_gaps, problems: list[str]) -> None:
    """The second bug is reproduced when exactly per-expert weight-quantizer amax went missing."""
    from harness.check.compare import is_expert_amax

    missing = [k for k in rec.verify.get("missing_keys", [])
               if not any(g.matches(k) for g in known_gaps)]
    rec.failing_key = missing[0] if missing else None
    if missing and all(is_expert_amax(k) for k in missing) and not rec.verify.get("mismatch_count"):
        rec.outcome, rec.failed_stage = "bug-reproduced", "verify"
        rec.message = (f"{len(missing)} per-expert weight_quantizer amax absent after "
                       "load_state_dict (post-restore re-calibration through expert 0); "
                       + held_after_load(rec.verify))
    elif not problems:
        rec.outcome = "unexpected-pass"
        rec.reason = ("expected per-expert amax to be lost after load_state_dict (second bug) "
                      "but every amax survived: that bug is gone in this modelopt")
    else:
        rec.outcome, rec.failed_stage = "unexpected-failure", "verify"
        rec.message = "; ".join(problems)


def held_after_load(verify: dict) -> str:
    """One line: what the loaded model holds for the saved per-expert amax, and its effect."""
    st = verify.get("expert_amax_state") or {}
    if not st.get("saved"):
        return "no per-expert amax in the checkpoint"
    from harness.check.compare import AMAX_STATES

    parts = [f"{st[k]} {k}" for k in reversed(AMAX_STATES) if st.get(k)]
    text = f"expert amax after load: {', '.join(parts)} (of {st['saved']} saved)"
    eff = verify.get("logits_effect")
    if eff:
        text += (f"; NVFP4 logits vs the checkpoint's amax: {eff['nonfinite_loaded']} of "
                 f"{eff['logits']} non-finite, rel max-abs {eff['nvfp4_rel_max_abs']}")
    return text


def bug_gone_message(rec: CellRecord) -> str:
    return (
        f"expected the per-expert _amax collision ({rec.expected}) but the cell passed: the bug "
        f"no longer reproduces with nvidia-modelopt {rec.modelopt}; the "
        "quarantined Nemotron-3 jobs are candidates for un-quarantine (see `make verdict`)"
    )


def _finish(rec: CellRecord, cell: Cell, run_dir: Path) -> CellRecord:
    write_record(rec, run_dir / "cells" / _safe(cell.id) / "record.json")
    return rec
