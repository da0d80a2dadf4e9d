"""Quarantine verdict (harness/report/verdict.py, its text verdict_text.py) on the committed H200 evidence in tests/data/runs/ and on
small hand-made results: BLOCKED, SAFE WITH PATCH, INCOMPLETE, SAFE, and the exit code."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import commands
from harness.report import verdict, verdict_text
from harness.report.jobs import quarantine_path
from harness.machine import SKIP_TEXTS, SkipKind, tier_skip_reason
from harness.topology.topology import Topology

pytestmark = pytest.mark.cpu

RUNS = Path(__file__).resolve().parent / "data" / "runs"
WITNESS = RUNS / "20261202-122731-witness.results.json"
FIX1 = RUNS / "20261202-122357-fix1.results.json"
NANO, ULTRA = "nano-30b-a3b-qad", "ultra-550b-a55b-nvfp4-ptq"


# The committed runs quantized with NVFP4_DEFAULT_CFG on a plain GPT: they are judged on that
# profile (conftest.py baseline_profiles; the jobs' own profiles need the recipe runs).
pytestmark = [pytestmark, pytest.mark.usefixtures("baseline_profiles")]


def _by_job(verdicts) -> dict:
    return {v.job.id: v for v in verdicts}


def _record(cell_id: str, outcome: str, expected: str = "pass", **kw) -> dict:
    return {"cell_id": cell_id, "outcome": outcome, "expected": expected, **kw}


def _evidence_ids(job_id: str) -> tuple[list, list]:
    q = verdict.load_quarantine()
    by_name = {s.name: s for s in verdict.load_all()}
    job = next(j for j in q.jobs if j.id == job_id)
    return (verdict.job_cells(job, by_name[job.profile.witness]),
            verdict.job_cells(job, by_name[job.profile.fix]))


def test_quarantine_file_names_both_jobs_with_shapes():
    q = verdict.load_quarantine()
    assert {j.id for j in q.jobs} == {NANO, ULTRA}
    jobs = {j.id: j for j in q.jobs}
    assert jobs[NANO].load.id == "tp4-etp1-ep8-pp1"          # the report's TP=4 ETP=1 EP=8
    assert jobs[NANO].save.tp == jobs[NANO].save.etp          # "saved fine": TP == ETP at save
    assert jobs[ULTRA].save.tp != jobs[ULTRA].save.etp        # fails at its (assumed) save
    for j in q.jobs:
        assert j.issue and j.pipeline and j.review_by and "ASSUMED" in j.assumption
        witness, fix = _evidence_ids(j.id)
        assert len(witness) == len(fix) == 2                  # save-only + save -> load


def test_witness_run_blocks_both_jobs():
    vds = _by_job(verdict.judge_doc(json.loads(WITNESS.read_text())))
    assert vds[NANO].word == verdict.BLOCKED
    assert vds[ULTRA].word == verdict.BLOCKED
    nano = {e.cell_id: e.outcome for e in vds[NANO].evidence}
    assert nano["gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]"] == "bug-reproduced"
    ultra = {e.cell_id: e.outcome for e in vds[ULTRA].evidence}
    assert ultra["gpu-witness[save=tp4-etp1-ep8-pp1,save-only]"] == "bug-reproduced"
    assert all(v.tier == "gpu-shared" for v in vds.values())


def test_fix_run_patch_where_cells_exist_incomplete_elsewhere():
    doc = json.loads(FIX1.read_text())
    ids = {c["cell_id"] for c in doc["cells"]}
    vds = _by_job(verdict.judge_doc(doc))
    # fix1 saved at tp2-etp1-ep2 and tp4-etp1-ep8 only: Ultra's cells are there, Nano's are not.
    assert "gpu-fix[save=tp4-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]" in ids
    assert not any("save=tp1-etp1-ep8" in i for i in ids)
    assert vds[ULTRA].word == verdict.SAFE_WITH_PATCH
    assert vds[NANO].word == verdict.INCOMPLETE


def test_main_on_committed_evidence_exit_zero(capsys):
    rc = verdict_text.main(verdict.read_docs([WITNESS, FIX1]))
    out = capsys.readouterr().out
    assert rc == 0
    assert "modelopt 0.47.0" in out and "all 2 runs together" in out
    combined = out.split("all 2 runs together")[1]
    assert f"{ULTRA}: SAFE WITH PATCH" in combined and f"{NANO}: BLOCKED" in combined


def _doc(records, modelopt="9.9.9") -> dict:
    return {"run_id": "hand", "tier": "gpu-shared", "versions": {"nvidia-modelopt": modelopt},
            "cells": records}


def _ran(cell) -> dict:
    """What the ranks of the cell's stages report where every rank ran at its topology with
    megatron-core's validation on (harness/check/judge.py stage_evidence)."""
    def at(topo) -> dict:
        return {"ranks": topo.world_size, "topologies": [topo.id], "validated": True}
    out = {"save": {**at(cell.save), "expert_weight_amax_keys": 32}}
    if cell.load:
        out["load"] = at(cell.load)
    return out


def test_safe_when_bug_no_longer_reproduces():
    witness, fix = _evidence_ids(ULTRA)
    recs = [_record(c.id, "unexpected-pass", c.expected, evidence=_ran(c)) for c in witness]
    recs += [_record(c.id, "pass") for c in fix]
    # a pair with a rule (0.47.0 + 0.19.2) whose witness stops failing: the bug is gone. An
    # unknown release is RULE UNKNOWN instead (test_a_pair_without_a_rule_...): never judged
    # by 0.47.0's rule.
    assert _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[ULTRA].word == verdict.SAFE
    # Nano: its save-only witness cell was expected to pass anyway.
    witness, fix = _evidence_ids(NANO)
    recs = [_record(c.id, "unexpected-pass" if c.load else "pass", c.expected, evidence=_ran(c))
            for c in witness]
    assert _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[NANO].word == verdict.SAFE


def test_a_pass_where_the_collision_was_expected_without_evidence_is_not_safe():
    """A save that "passed" with no rank behind it was judged unexpected-pass and the
    jobs candidates for un-quarantine. Without what the ranks reported (every rank, at the
    cell's topology, validation on, expert amax saved) such a pass is a failure of the run."""
    witness, fix = _evidence_ids(ULTRA)
    for evidence in (None, {"save": {"ranks": 0, "topologies": [], "validated": True,
                                     "expert_weight_amax_keys": 0}}):
        recs = [_record(c.id, "unexpected-pass", c.expected, evidence=evidence) for c in witness]
        recs += [_record(c.id, "pass") for c in fix]
        vd = _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[ULTRA]
        assert vd.word == verdict.UNEXPECTED, (evidence, vd.word)
        outcomes = {e.outcome for e in vd.evidence if e.cell_id in {c.id for c in witness}}
        assert outcomes == {"unexpected-failure"}, outcomes


def test_a_pass_reported_by_one_rank_of_the_world_at_the_right_topology_is_not_safe():
    """Each witness cell's evidence names its own topology, validation on and expert amax saved,
    but only one of its world's ranks reported: the others may never have run the stage. With
    every rank reporting the same cells make SAFE (test_safe_when_bug_no_longer_reproduces)."""
    witness, fix = _evidence_ids(ULTRA)

    def one_rank(c) -> dict:
        ev = _ran(c)
        assert all(e["ranks"] > 1 for e in ev.values())  # the world is larger than the one rank
        return {stage: {**e, "ranks": 1} for stage, e in ev.items()}

    recs = [_record(c.id, "unexpected-pass", c.expected, evidence=one_rank(c)) for c in witness]
    recs += [_record(c.id, "pass") for c in fix]
    vd = _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[ULTRA]
    assert vd.word == verdict.UNEXPECTED, vd.word
    assert {e.outcome for e in vd.evidence if e.role == verdict.Role.WITNESS} == {"unexpected-failure"}


def test_a_job_whose_cells_are_all_known_refusals_is_not_safe():
    """A known refusal is a limitation confirmed where predicted, not a pass: a job none of whose
    witness cells passed is not SAFE (nor SAFE WITH PATCH when its fix cells are refusals too)."""
    witness, fix = _evidence_ids(ULTRA)
    for fix_outcome in ("pass", "known-refusal"):
        recs = [_record(c.id, "known-refusal", c.expected, evidence=_ran(c)) for c in witness]
        recs += [_record(c.id, fix_outcome, evidence=_ran(c)) for c in fix]
        vd = _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[ULTRA]
        assert vd.word != verdict.SAFE, (fix_outcome, vd.word, vd.detail)
        if fix_outcome == "known-refusal":
            assert vd.word != verdict.SAFE_WITH_PATCH, vd.detail


def test_unexpected_failure_exits_nonzero(tmp_path, capsys):
    witness, fix = _evidence_ids(NANO)
    recs = [_record(c.id, "bug-reproduced" if c.load else "pass", c.expected) for c in witness]
    recs += [_record(fix[0].id, "pass"),
             _record(fix[1].id, "unexpected-failure", failed_stage="verify",
                     exception_type="AssertionError", message="3 per-expert amax differ")]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_doc(recs)))
    rc = verdict_text.main(verdict.read_docs([path]))
    out = capsys.readouterr().out
    assert rc == 1
    assert f"{NANO}: UNEXPECTED FAILURE" in out and "3 per-expert amax differ" in out


def test_unexpected_failure_outside_evidence_does_not_fail(tmp_path):
    # fix1 holds 10 unexpected failures (old logits criterion), none at the jobs' shapes.
    doc = json.loads(FIX1.read_text())
    assert sum(c["outcome"] == "unexpected-failure" for c in doc["cells"]) == 10
    assert not any(v.unexpected for v in verdict.judge_doc(doc))


def _args(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"results": [], "results_root": "results", "job": None, "gate": False,
                              "patched": False, **kw})


@pytest.mark.skipif(tier_skip_reason("gpu-shared", 8) is None, reason="a GPU is here: cells would run")
def test_a_gate_with_no_results_and_no_gpu_is_one_line(tmp_path, capsys):
    """Nothing given to the gate and nothing runnable here: one line saying where evidence comes
    from, no cells run (every one would be skipped), exit 4 (nothing decides). Bare ``verdict``
    judges the committed records instead (tests/test_verdict_no_gpu.py)."""
    rc = commands.cmd_verdict(_args(results_root=str(tmp_path), gate=True, job=NANO))
    out = capsys.readouterr().out
    assert rc == 4
    _no_evidence_line(out)
    assert not any(tmp_path.iterdir()), "no run directory: nothing ran"


def _no_evidence_line(out: str, files: int = 0) -> None:
    """One line pointing at the committed evidence (a page that exists, the gate that finds the
    records itself); a GPU host is named only when nothing was given: results files given that
    hold none of the jobs' cells came from a GPU host already."""
    lines = out.splitlines()
    assert len(lines) == 1, out
    line = lines[0]
    page = line.split("judged: ", 1)[1].split(",", 1)[0]
    assert (RUNS.parent.parent.parent / page).is_file(), page
    assert "verdict --job ID --gate --modelopt V" in line
    assert ("GPU host" in line) == (files == 0), line
    if files:
        assert f"none of the {files} results file(s)" in line
    assert "cpu tier" not in line


# Committed runs with no cell of either job (cpu-only, pipeline, shape and sample runs).
NO_JOB_CELLS = ["20261203-004730-density", "20261203-033850-pipeline", "20261203-034324-shape-nano",
                "20261203-035054-shape-ultra", "20261204-022455-sample-0.47.0-fix",
                "20261204-022455-sample-0.47.0-none"]


def test_results_without_evidence_say_so_once_not_per_file(capsys):
    docs = verdict.read_docs([RUNS / f"{n}.results.json" for n in NO_JOB_CELLS])
    assert verdict_text.main(docs) == 4  # nothing decides, as the gate says it
    _no_evidence_line(capsys.readouterr().out, files=len(NO_JOB_CELLS))


def test_an_undecided_job_is_one_summary_line_with_gpu_advice(capsys):
    """fix1 decides Ultra and holds none of Nano's cells; with the evidence-free runs beside it,
    Nano is one summary line (not an INCOMPLETE block per file) naming the cells to earn on a
    GPU host."""
    files = [FIX1] + [RUNS / f"{n}.results.json" for n in NO_JOB_CELLS]
    assert verdict_text.main(verdict.read_docs(files)) == 0
    out = capsys.readouterr().out
    nano = [line for line in out.splitlines() if line.strip().startswith(f"{NANO}:")]
    assert len(nano) == 1, out
    assert f"INCOMPLETE in every one of {len(files)} results file(s)" in nano[0]
    assert "GPU host" in nano[0] and "cpu tier" not in out
    for cell in _gate_cell_ids(NANO):
        assert cell in nano[0]
    assert f"{ULTRA}: SAFE WITH PATCH" in out
    assert out.count("INCOMPLETE") == 1


# --- the gate (harness/report/gate.py): exit codes as README "The verdict" lists them ----------
GATE_EXIT = {verdict.SAFE: 0, verdict.UNEXPECTED: 1, verdict.BLOCKED: 3, verdict.INCOMPLETE: 4,
             verdict.NO_EVIDENCE: 4}
GATE_RUNS = ["20261202-122731-witness", "20261203-100332-eq-fresh", "20261203-000227-matrix-0.48.0rc1",
             "20261202-121737-smoke", "20261204-020324-matrix-0.47.0-mc0.19.2",
             "20261204-022107-matrix-0.48.0rc1-mc0.15.3", "20261204-023144-repro-gpu-new",
             "20261203-004730-density"]


def _gate_cell_ids(job_id: str) -> list[str]:
    """witness save-only, witness save->load, fix save-only, fix save->load: from
    quarantine.toml, as the scenarios name cells."""
    import tomllib

    q = tomllib.loads(quarantine_path().read_text())
    job = next(j for j in q["jobs"] if j["id"] == job_id)
    save = Topology.parse(job["save"]).id
    (load,) = (Topology.parse(t).id for t in job["profile"]["loads"])
    profile = job["profile"]
    return [f"{name}[save={save},{tail}]"
            for name in (profile["witness_scenario"], profile["fix_scenario"])
            for tail in ("save-only", f"load={load}")]


def _expected_verdict(outcomes: dict[str, str], job_id: str, patched: bool = False) -> str:
    """The verdict the quarantine rules give these recorded outcomes (harness/report/verdict.py's
    docstring), derived here from the file, not from the gate; ``patched``: for a pipeline with
    the fix, which a reproducing witness cannot block while fix cells are missing."""
    w_save, w_load, f_save, f_load = (outcomes.get(c) for c in _gate_cell_ids(job_id))
    every = (w_save, w_load, f_save, f_load)
    if "unexpected-failure" in every:
        return verdict.UNEXPECTED
    if all(o in ("pass", "unexpected-pass") for o in (w_save, w_load)):
        return verdict.SAFE
    if f_save == f_load == "pass":
        return verdict.SAFE_WITH_PATCH
    if patched and "bug-reproduced" in (w_save, w_load) and None in (f_save, f_load):
        return verdict.INCOMPLETE
    if "bug-reproduced" in (w_save, w_load):
        return verdict.BLOCKED
    return verdict.INCOMPLETE


# `make test`: one run where the bug shows and one of the release that fixed it; the other runs
# (more records under the same rules) under -m slow, chosen by tools/coverage_split.py --plan
GATE_RUNS_PER_COMMIT = {"20261202-122731-witness", "20261203-000227-matrix-0.48.0rc1"}


@pytest.mark.parametrize("run", [pytest.param(r, marks=[] if r in GATE_RUNS_PER_COMMIT else [pytest.mark.slow])
                                 for r in GATE_RUNS])
def test_gate_exit_code_per_job_follows_from_the_committed_cells(run, capsys):
    from harness.fix import SUPPORTED_MCORE_VERSIONS, SUPPORTED_MODELOPT_VERSION

    path = RUNS / f"{run}.results.json"
    doc = json.loads(path.read_text())
    outcomes = {c["cell_id"]: c["outcome"] for c in doc["cells"]}
    # the whole fix (these profiles' fix scenarios need no part alone) patches only this pair
    fix_runs = ((doc["cells"][0].get("modelopt") or doc["versions"]["nvidia-modelopt"]) == SUPPORTED_MODELOPT_VERSION
                and (doc["cells"][0].get("mcore") or doc["versions"].get("megatron-core", "0.19.2")) in SUPPORTED_MCORE_VERSIONS)
    for job_id in (NANO, ULTRA):
        for patched in (False, True):
            word = _expected_verdict(outcomes, job_id, patched and fix_runs)
            rc = commands.cmd_verdict(_args(results=[str(path)], job=job_id, gate=True, patched=patched))
            out = capsys.readouterr().out
            want = (0 if patched else 3) if word == verdict.SAFE_WITH_PATCH else GATE_EXIT[word]
            assert rc == want, (job_id, patched, word, out)
            assert out.splitlines()[-1].startswith(f"gate {job_id}: {word} -> exit {want}:"), out
            assert ("Next step:" in out) == (want == 0)
            if not any(outcomes.get(c) for c in _gate_cell_ids(job_id)):
                # one line: the file holds none of the job's cells; what would decide it
                assert len(out.splitlines()) == 1 and "what would decide:" in out, out
                assert f"none of the 1 results file(s)" in out and "GPU host" not in out


@pytest.mark.parametrize("patched", [False, True])
def test_a_safe_with_patch_gate_names_the_change_to_the_pipeline(patched, capsys):
    """The step a job owner takes: the wheel's exact file, MOE_CKPT_FIX=1 and the allow-to-fail
    line, in the job's own pipeline file (run 20261203-100332-eq-fresh: SAFE WITH PATCH)."""
    from harness.fix import BUILT_WHEEL, JOB_CHANGE

    path = RUNS / "20261203-100332-eq-fresh.results.json"
    rc = commands.cmd_verdict(_args(results=[str(path)], job=NANO, gate=True, patched=patched))
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"gate {NANO}: {verdict.SAFE_WITH_PATCH} -> exit {0 if patched else 3}:")
    assert rc == (0 if patched else 3)
    if patched:
        pipeline = next(j.pipeline for j in verdict.load_quarantine().jobs if j.id == NANO)
        assert f"Next step: in {pipeline}," in line
        assert f"pip install --no-deps dist/{Path(BUILT_WHEEL).name}" in line and "make fix-wheel" in line
        assert "set MOE_CKPT_FIX=1" in line and "allow-to-fail line" in line
    else:
        assert "stays quarantined" in line and JOB_CHANGE in line and "Next step" not in line


def test_gate_covers_every_exit_code_the_readme_lists():
    """GATE_RUNS hold a SAFE, a SAFE WITH PATCH, a BLOCKED and an undecided job."""
    words = set()
    for run in GATE_RUNS:
        doc = json.loads((RUNS / f"{run}.results.json").read_text())
        outcomes = {c["cell_id"]: c["outcome"] for c in doc["cells"]}
        words |= {_expected_verdict(outcomes, j) for j in (NANO, ULTRA)}
    assert words == {verdict.SAFE, verdict.SAFE_WITH_PATCH, verdict.BLOCKED, verdict.INCOMPLETE}


def test_gate_unexpected_failure_is_exit_1(tmp_path, capsys):
    witness, fix = _evidence_ids(NANO)
    recs = [_record(c.id, "bug-reproduced" if c.load else "pass", c.expected) for c in witness]
    recs += [_record(fix[0].id, "pass"), _record(fix[1].id, "unexpected-failure",
                                                  failed_stage="verify", message="amax differ")]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_doc(recs, "0.47.0")))
    assert commands.cmd_verdict(_args(results=[str(path)], job=NANO, gate=True, patched=True)) == 1
    assert f"gate {NANO}: UNEXPECTED FAILURE -> exit 1" in capsys.readouterr().out


def test_gate_usage_errors_are_exit_2_and_name_the_known_jobs():
    """Through the real CLI: an unknown job, --gate without --job, results of two pairs."""
    import tomllib

    from tests.helpers import bounded

    known = [j["id"] for j in tomllib.loads(quarantine_path().read_text())["jobs"]]
    base = [sys.executable, "-W", "ignore", "-m", "harness", "verdict", "--results", str(WITNESS)]
    for extra, says in (
            (["--job", "nemotron-4", "--gate"], "unknown job 'nemotron-4'; known jobs: " + ", ".join(known)),
            (["--gate"], "--gate needs --job ID; known jobs: " + ", ".join(known)),
            (["--job", NANO, "--gate", "--results",
              str(RUNS / "20261203-000227-matrix-0.48.0rc1.results.json")],
             "the gate judges one (modelopt, megatron-core) pair")):
        r = bounded([*base, *extra], 300, cwd=RUNS.parent.parent.parent)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert r.stdout == ""
        assert says in r.stderr.strip().splitlines()[-1], r.stderr


def test_recorded_logits_failure_is_rejudged_under_the_current_rule():
    """The H200 Nano cell failed the whole-batch logits check at the save topology with every
    tensor bit-exact; under today's rule that comparison is the cross-topology figure,
    reported, not asserted: re-judged pass, with or without its routing figures, and the note
    says so."""
    routing = json.loads((RUNS / "20261202-151428-routing.results.json").read_text())
    fix2 = json.loads((RUNS / "20261202-144727-fix2.results.json").read_text())
    witness = json.loads(WITNESS.read_text())
    for docs in ((witness, fix2, routing), (witness, fix2)):
        together = {c["cell_id"]: c for doc in docs for c in doc["cells"]}
        v = _by_job(verdict.judge_records(together))[NANO]
        assert v.word == verdict.SAFE_WITH_PATCH
        note = next(e.note for e in v.evidence if "re-judged pass" in e.note)
        assert "cross-topology figure" in note and "0 mismatches" in note


def test_a_fixed_release_is_safe_by_its_own_rules_and_the_goldens_are_reported():
    """0.48.0rc1 expects the witness cells to pass: passing cells make the job SAFE unpatched,
    the fix cells are skipped there, and the golden loads are listed as existing checkpoints."""
    witness, fix = _evidence_ids("nano-30b-a3b-qad")
    cells = [_record(c.id, "pass", scenario="gpu-witness") for c in witness]
    cells += [_record(c.id, "skipped", scenario="gpu-fix", reason="fix is for 0.47.0") for c in fix]
    cells.append(_record("gpu-golden-witness[golden=g,load=tp1-etp1-ep1-pp1]", "bug-reproduced",
                         expected="not-restored", scenario="gpu-golden-witness",
                         verify={"expert_amax_state": {"saved": 32, "absent": 32, "restored": 0}}))
    text, vds = verdict_text.verdict_report([("run", _doc(cells, modelopt="0.48.0rc1"))])
    assert _by_job(vds)["nano-30b-a3b-qad"].word == verdict.SAFE
    assert "this version's own rules expect it to pass" in text
    assert "golden=g,load=tp1-etp1-ep1-pp1: bug-reproduced - expert amax after load: 32 absent" in text


def test_the_recorded_0_48_0rc1_run_clears_both_jobs():
    """Recorded H200 evidence (docs/runs/20261203-000204-matrix.md): under 0.48.0rc1's own rules
    (witness cells expected to pass) every witness cell of both jobs passed, so both are SAFE."""
    doc = json.loads((RUNS / "20261203-000227-matrix-0.48.0rc1.results.json").read_text())
    assert {c["modelopt"] for c in doc["cells"]} == {"0.48.0rc1"}
    vds = _by_job(verdict.judge_doc(doc))
    assert {job: vd.word for job, vd in vds.items()} == {
        "nano-30b-a3b-qad": verdict.SAFE, "ultra-550b-a55b-nvfp4-ptq": verdict.SAFE}


@pytest.mark.parametrize("kind, detail", [
    (SkipKind.NO_GPU, "on this machine (tier gpu-shared needs a GPU)"),
    (SkipKind.NO_TE, "on this machine (tier gpu-shared needs Transformer Engine: no GPU build)")])
def test_no_evidence_says_what_this_machine_lacks_by_the_reasons_kind(kind, detail):
    """Every evidence cell skipped: a machine without the GPUs says the tier needs one; any
    other reason is shown as written (its words decide nothing, even where they say GPU)."""
    reason = SKIP_TEXTS[kind].format(tier="gpu-shared", error="no GPU build")
    witness, fix = _evidence_ids(NANO)
    recs = [_record(c.id, "skipped", c.expected, reason=reason) for c in witness + fix]
    v = _by_job(verdict.judge_doc(_doc(recs, "0.47.0")))[NANO]
    assert (v.word, v.detail) == (verdict.NO_EVIDENCE, detail)


def test_a_pair_without_a_rule_gets_no_verdict_but_says_which_pair():
    """Records of a (modelopt, megatron-core) pair with no rule are never judged by another
    pair's rule: the verdict names the pair and decides nothing."""
    witness = json.loads(WITNESS.read_text())
    records = {c["cell_id"]: {**c, "modelopt": "0.47.0", "mcore": "0.18.0",
                              "outcome": "rule-unknown"} for c in witness["cells"]}
    v = _by_job(verdict.judge_records(records))[NANO]
    assert v.word == verdict.NO_RULE and "0.47.0 + mcore 0.18.0" in v.detail


# the unpatched pipeline's exit 3 per landing (-m slow): the same script, the same step lines;
# test_gate_exit_code_per_job_follows_from_the_committed_cells checks both words per commit
@pytest.mark.parametrize("patched, rc, passing", [pytest.param("0", 3, [], marks=pytest.mark.slow),
                                                  ("1", 0, [NANO, ULTRA])])
def test_gate_script_gates_every_job_and_shows_the_step(tmp_path, patched, rc, passing):
    """tools/unquarantine-gate.sh (the CI job unquarantine-gate, `make gate`) on a committed run
    whose patched cells pass for both jobs: without GATE_PATCHED both stay quarantined (3),
    with it both gates pass and each prints the step that un-quarantines it."""
    from tests.helpers import bounded

    run = tmp_path / "results" / "nightly"
    run.mkdir(parents=True)
    (run / "results.json").write_text((RUNS / "20261203-100332-eq-fresh.results.json").read_text())
    repo = RUNS.parent.parent.parent
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(tmp_path / "results"),
           "GATE_PATCHED": patched}
    r = bounded(["bash", str(repo / "tools" / "unquarantine-gate.sh")], 600, cwd=repo, env=env)
    assert r.returncode == rc, r.stdout + r.stderr
    gates = [line for line in r.stdout.splitlines() if line.startswith("gate ")]
    assert [g.split(":")[0] for g in gates] == [f"gate {NANO}", f"gate {ULTRA}"]
    assert [g.split()[1].rstrip(":") for g in gates if "Next step:" in g] == passing
