"""Every record says what model ran: its kind, sizes and modules, and
the quantizer amax keys its checkpoint holds per module family (MTP layers' apart); the verdict
refuses a job's evidence whose recorded model is not the one the job profile's scenario builds.

Expectations come from megatron-core's key names (routed experts under ``.mlp.experts.``, shared
ones under ``.mlp.shared_experts.``, the MTP block under ``mtp.``) and from the scenario files.
"""
from __future__ import annotations

import pytest

from harness.check.keys import amax_key_counts
from harness.records import StageResult
from tests.helpers import own_recipe_job

pytestmark = pytest.mark.cpu


def test_amax_keys_are_counted_per_family_with_the_mtp_layers_apart():
    keys = ["decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_quantizer._amax",
            "decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_quantizer._global_amax",
            "decoder.layers.0.mlp.experts.experts.linear_fc1.input_quantizer._amax",
            "decoder.layers.0.mlp.shared_experts.linear_fc1.weight_quantizer._amax",
            "decoder.layers.0.self_attention.linear_qkv.weight_quantizer._amax",
            "decoder.layers.0.self_attention.linear_qkv.weight",
            "mtp.layers.0.transformer_layer.mlp.experts.experts.3.linear_fc2.weight_quantizer._amax",
            "mtp.layers.0.eh_proj.weight_quantizer._amax"]
    assert amax_key_counts(keys) == {"experts": 3, "shared_experts": 1, "other": 1,
                                     "mtp": {"experts": 1, "other": 1}}


def test_a_cell_record_names_its_model_and_the_amax_keys_saved(tmp_path, monkeypatch):
    from harness.run import cell as run_cell_module
    from harness.scenario.scenarios import load_scenario

    path = tmp_path / "m.toml"
    path.write_text('tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\nsaves = ["tp1-etp1-ep4"]\n'
                    '[model]\nmoe_shared_expert_intermediate_size = 512\nmtp_num_layers = 1\n')
    cell = load_scenario(path).cells()[0]
    counts = {"experts": 32, "shared_experts": 4, "mtp": {"experts": 16}}
    monkeypatch.setattr(run_cell_module, "run_save", lambda c, run: StageResult(
        stage="save", ok=True, wall_s=1.0, amax_keys=counts))
    rec = run_cell_module.run_cell(cell, tmp_path / "run")
    assert rec.model["kind"] == "gpt" and rec.model["hidden_size"] == 256
    assert rec.model["moe_shared_expert_intermediate_size"] == 512 and rec.model["mtp_num_layers"] == 1
    assert rec.amax_keys == counts and rec.as_dict()["amax_keys"] == counts


def _job(tmp_path):
    return own_recipe_job(tmp_path, "mtq:NVFP4_DEFAULT_CFG", "tp1-etp1-ep4", ["tp1-etp1-ep2"])


def _records(scenarios, **extra) -> dict:
    out = {}
    for c in scenarios[0].cells():
        out[c.id] = {"cell_id": c.id, "tier": "gpu-shared", "backend": "te", "patch": "none",
                     "save_topology": c.save.id, "load_topology": c.load.id if c.load else None,
                     "modelopt": "0.48.0rc1", "mcore": "0.19.2", "expected": "pass", "outcome": "pass",
                     "verify": {"mismatch_count": 0, "keys_compared": 10}, **extra}
    return out


def test_the_verdict_refuses_evidence_of_another_model_and_says_how_it_differs(tmp_path):
    from harness.report import verdict

    quarantine, scenarios = _job(tmp_path)
    other = {**scenarios[0].size.record(), "hidden_size": 128, "mtp_num_layers": 1}
    (v,) = verdict.judge_records(_records(scenarios, model=other), quarantine, scenarios)
    witness = [e for e in v.evidence if e.role == verdict.Role.WITNESS]
    assert v.word == verdict.INCOMPLETE and all(e.outcome == verdict.MISSING for e in witness)
    assert "hidden_size 128 recorded, 256 in the profile" in witness[0].note
    assert "mtp_num_layers 1 recorded, absent in the profile" in witness[0].note


def test_the_verdict_takes_the_profiles_model_and_names_records_before_the_field(tmp_path):
    from harness.report import verdict

    quarantine, scenarios = _job(tmp_path)
    same = scenarios[0].size.record()
    (v,) = verdict.judge_records(_records(scenarios, model=same), quarantine, scenarios)
    assert v.word == verdict.SAFE, v.detail
    (old,) = verdict.judge_records(_records(scenarios), quarantine, scenarios)
    assert old.word == verdict.SAFE
    assert all(verdict.MODEL_NOT_RECORDED in e.note for e in old.evidence if e.role == verdict.Role.WITNESS)
