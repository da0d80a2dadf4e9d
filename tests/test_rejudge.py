"""Re-judging the committed GPU runs and the one judge, cpu tier.

Expectations: the lists in docs/runs/rejudge-*.md (which cells change and to what), and the
the recorded case (state bit-exact, cross-topology 0.137 rel, 2 routing flips under
0.48.0rc1 unpatched), judged by harness/check/judge.py judge_cell.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.check import judge, rejudge
from harness.check.results_file import read_results
from harness.records import CellRecord, StageResult
from harness.report.equivalence import outcome_changes

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "runs"
LISTS = sorted((ROOT / "docs" / "runs").glob("rejudge-*.md"))  # one per rule change
ROW = re.compile(r"^\| (\S+) \| `([^`]+)` \| (\S+) \| (\S+) \| (.*) \|$")

pytestmark = pytest.mark.cpu


def _listed() -> dict:
    rows = [ROW.match(line) for path in LISTS for line in path.read_text().splitlines()]
    return {(m[1], m[2]): (m[3], m[4]) for m in rows if m}


@pytest.mark.slow  # every committed run; rejudging one: the tests below
def test_rejudging_every_committed_run_changes_exactly_the_listed_cells():
    listed = _listed()
    # the logits rule, unreadable goldens, static amax, the restore dry run, then the
    # GPU-decided integer and dense static reshard rules
    assert len(listed) == 24 + 12 + 8 + 16 + 9 + 12  # + AWQ's refusal by its words
    got = {}
    for path in sorted(RUNS.glob("*.results.json")):
        run = path.name.removesuffix(".results.json")
        for cid, old, new, _why in outcome_changes(read_results(path)):
            got[(run, cid)] = (old, new)
    assert got == listed


def test_the_non_deterministic_recording_still_fails():
    doc = read_results(RUNS / "20261203-065627-shape-nano.results.json")
    assert not outcome_changes(doc)
    assert {c["outcome"] for c in doc["cells"]} == {"unexpected-failure"}


# --- judge_cell on the case -------------------------------------------------------------

def _cell():
    from harness.scenario.scenarios import load_all

    s = next(s for s in load_all() if s.name == "gpu-cross-topology")
    return next(c for c in s.cells() if c.save.id == "tp2-etp2-ep2-pp1")


def _verify(at_load_rel: float, noise: dict | None = None) -> dict:
    plain = {"rel_diff": 0.137, "max_abs_diff": 1.0, "rel_rms": 0.01, "top1_agreement": 0.97}
    v = {"mismatch_count": 0, "mismatches": [], "missing_keys": [], "unexpected_keys": [],
         "expert_amax_state": {"saved": 512, "restored": 512}, "logits_plain": plain,
         "routing_tokens": 32, "routing_flips": 2,
         "logits_at_load_topology": {"plain": {**plain, "rel_diff": at_load_rel}, "routing_flips": 0,
                                     "tensors_written": 0}}
    if noise:
        v["noise_floor_figures"] = noise
    return v


def _stages(verify: dict, modelopt: str = "0.48.0rc1"):
    env = {"nvidia-modelopt": modelopt}
    return (StageResult("save", True, 1.0, environment=env),
            StageResult("load", True, 1.0, environment=env, rank_results={"0": {"verify": verify}}))


def _judged(verify: dict) -> CellRecord:
    cell = _cell()
    rec = CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                     save_topology=cell.save.id, load_topology=cell.load.id, patch="none",
                     expected="", modelopt="0.48.0rc1")
    return judge.judge_cell(rec, cell.plan, *_stages(verify))


def test_the_routing_flip_cell_passes_on_its_bit_exact_state():
    rec = _judged(_verify(0.0))
    assert rec.expected == "pass" and rec.outcome == "pass", rec.message
    assert rec.verify["cross_topology"]["rel_diff"] == 0.137 and rec.finding is None


def test_a_difference_at_the_load_topology_is_a_checkpoint_failure():
    rec = _judged(_verify(0.01))
    assert rec.outcome == "unexpected-failure" and rec.failed_stage == "verify"
    assert "at the load topology" in rec.message


def test_a_cross_topology_difference_beyond_its_noise_floor_is_a_finding_not_a_failure():
    noise = {"bf16_vs_fp32_save": 0.002, "bf16_vs_fp32_load": 0.003, "fp32_cross_topology": 0.13}
    rec = _judged(_verify(0.0, noise))
    assert rec.outcome == "pass" and "beyond rounding" in rec.finding
    within = _judged(_verify(0.0, {**noise, "bf16_vs_fp32_save": 0.07, "bf16_vs_fp32_load": 0.07}))
    assert within.outcome == "pass" and within.finding is None


def test_run_cell_judges_once(tmp_path, monkeypatch):
    """Ranks measure, run_cell runs the stages and calls the one judge once."""
    from harness.run import cell as runner

    save, load = _stages(_verify(0.0))
    monkeypatch.setattr(runner, "run_save", lambda c, d: save)
    monkeypatch.setattr(runner, "_launch", lambda spec, d, c, run: load)
    calls = []
    real = judge.judge_cell
    monkeypatch.setattr(judge, "judge_cell", lambda *a, **k: calls.append(a) or real(*a, **k))
    rec = runner.run_cell(_cell(), tmp_path)
    assert len(calls) == 1 and rec.outcome == "pass"


def test_rejudge_reads_a_record_back_to_the_same_outcome():
    rec = _judged(_verify(0.01)).as_dict()
    again = rejudge.rejudge_record(rec, _cell().plan)
    assert again["outcome"] == rec["outcome"] == "unexpected-failure"
    assert again["message"] == rec["message"]


def test_a_timed_out_stage_is_read_from_the_record_s_fact_or_an_old_record_s_reason():
    """The re-judged stage times out where the run noted it did (CellRecord.timed_out); a record
    from before that field says so only in the judge's reason of then."""
    cell = _cell()
    base = dict(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                save_topology=cell.save.id, load_topology=cell.load.id, patch="none",
                expected="pass", outcome="unexpected-failure", failed_stage="load",
                exception_type="timeout", modelopt="0.48.0rc1")
    cases = [({"timed_out": True}, True), ({"timed_out": False, "reason": "timed out, said by hand"}, False),
             ({"reason": "load stage timed out"}, True), ({}, False)]
    for extra, want in cases:
        _, load, _ = rejudge.stages_from_record(CellRecord.from_json({**base, **extra}), cell.plan)
        assert load.timed_out is want, extra


def test_the_summary_shows_the_logits_figures_and_the_finding():
    from harness.report.summary import markdown_summary

    noise = {"bf16_vs_fp32_save": 0.002, "bf16_vs_fp32_load": 0.003, "fp32_cross_topology": 0.13}
    rec = _judged(_verify(0.0, noise)).as_dict()
    text = markdown_summary({"run_id": "r", "cells": [rec]})
    assert "| cross-topology |" in text and "| 0.137 | 2 |" in text
    assert "Findings (the product, not the checkpoint): 1" in text and "beyond rounding" in text
