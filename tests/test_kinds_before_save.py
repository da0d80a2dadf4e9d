"""A save that fails after calibration still says what its calibration made.

Why: the failure the harness exists for is a save that dies of the collision; judging by the
amax kinds the save recorded must not need the save to succeed. Each saving rank records its
kinds as soon as calibration ends (harness/rank/stages.py ``record_kinds``).

The recipe is a job owner's file that no forecast names (tests/data/recipes/
nvfp4_static_experts.yaml): its routed experts' weight quantizers are configured as static NVFP4
blocks, ModelOpt's ``is_nvfp4_static`` (harness/model/quant.py ``configured_kind``), and nothing
else is quantized by weight. Without recorded kinds its cell can only be ``rule-unknown``.
"""
from __future__ import annotations

import pytest

from harness.launch.torchrun import calibrated_kinds
from harness.records import Expected, Outcome

pytestmark = pytest.mark.cpu

MINE = "file:tests/data/recipes/nvfp4_static_experts.yaml"
STATIC_EXPERTS = {"experts": ["static-block"]}  # what the file configures (see the docstring)


def test_a_save_that_fails_after_calibration_carries_its_kinds_and_is_judged_by_them(
        tmp_path, monkeypatch):
    from harness.run.cell import run_cell
    from harness.scenario.scenarios import load_scenario

    path = tmp_path / "mine.toml"
    path.write_text('name = "mine-cpu"\ntier = "cpu"\nbackend = "local"\nexpect = "oracle"\n'
                    f'patch = "none"\nrecipe = "{MINE}"\nsaves = ["tp1-etp1-ep2"]\n')
    (cell,) = [c for c in load_scenario(path).cells() if c.load is None]
    monkeypatch.setenv("HARNESS_INJECT", "raise:1:before_save")  # after calibration, before the save
    rec = run_cell(cell, tmp_path / "run")
    assert rec.failed_stage == "save" and "injected failure" in (rec.message or ""), rec.reason
    assert rec.amax_kinds == STATIC_EXPERTS
    # judged by the kinds, not left undecided: the injected error is not the collision
    assert rec.expected not in (Expected.RULE_UNKNOWN, "") and rec.outcome == Outcome.UNEXPECTED_FAILURE, (
        rec.expected, rec.outcome, rec.notice, rec.reason)


def _kinds_file(stage_dir, rank, kinds, token="t"):
    import json

    (stage_dir / "kinds").mkdir(parents=True, exist_ok=True)
    (stage_dir / "kinds" / f"rank{rank}.json").write_text(
        json.dumps({"amax_kinds": kinds, "stage_token": token}))


def test_the_kinds_are_merged_over_the_ranks_of_this_stage_only(tmp_path):
    """Each rank holds its own layers (pp) and experts: the save's kinds are their union; a
    file of another stage (token) or a rank outside the world does not count."""
    _kinds_file(tmp_path, 0, {"experts": ["scalar"], "other": ["scalar"]})
    _kinds_file(tmp_path, 1, {"experts": ["static-block"]})
    _kinds_file(tmp_path, 2, {"shared_experts": ["per-channel"]}, token="another stage")
    _kinds_file(tmp_path, 5, {"shared_experts": ["per-block"]})
    assert calibrated_kinds(tmp_path, 2, "t") == {"experts": ["scalar", "static-block"], "other": ["scalar"]}
    assert calibrated_kinds(tmp_path / "none", 2, "t") is None
