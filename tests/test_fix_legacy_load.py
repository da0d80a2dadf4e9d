"""The fix's back-compat load (moe_ckpt_fix/legacy_load.py) on real megatron-core checkpoints.

Tier cpu, 2 gloo ranks at ETP 2 (tests/rank_programs/legacy_load.py). Expectations come from the
rules the loader promises, computed here from the rank program's known weights:
- a pre-0.47 shared amax goes to every expert unchanged;
- an expert amax missing from the checkpoint is max|W| over the WHOLE expert weight (the max sits
  in ETP rank 1's half, so a rank-local max on rank 0 would be wrong), with a warning naming it;
- the caller's request keeps every entry; and megatron-core's plain load refuses the same request
  (today's failure mode).
"""
from __future__ import annotations

import pytest

from harness.launch.stages import run_module_stage
from tests.rank_programs.legacy_load import full_weight


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("legacy-load")
    run = run_module_stage("legacy-load", d / "stage", 2, [str(d / "ckpts")], 240,
                           "tests.rank_programs.legacy_load")
    assert run.ok, run.summary()
    return run.rank_results


def _max_abs(expert: int) -> float:
    return full_weight(expert).float().abs().max().item()


@pytest.mark.cpu
def test_plain_megatron_load_refuses_the_legacy_request(ranks):
    for r in ranks.values():
        assert "error" in r["unwrapped_legacy"], r["unwrapped_legacy"]
        assert "weight_quantizer._amax" in r["unwrapped_legacy"]["error"]


@pytest.mark.cpu
def test_legacy_shared_amax_goes_to_every_expert(ranks):
    for r in ranks.values():
        got = r["wrapped_legacy"]
        assert got["amax"] == {"0": [0.25], "1": [0.25]} or got["amax"] == {0: [0.25], 1: [0.25]}
        assert any("experts [0, 1]" in w and "pre-0.47" in w for w in got["warnings"]), got["warnings"]


@pytest.mark.cpu
def test_missing_expert_amax_is_max_calibrated_over_the_expert_tp_group(ranks):
    want = _max_abs(1)
    assert want != full_weight(1)[:2].float().abs().max().item()  # rank 0's half alone differs
    for r in ranks.values():
        got = {int(k): v for k, v in r["wrapped_partial"]["amax"].items()}
        assert got[0] == [0.5]  # present in the checkpoint: loaded as stored
        assert got[1] == [want]
        assert any("experts [1]" in w and "max calibration" in w for w in r["wrapped_partial"]["warnings"])


@pytest.mark.cpu
def test_the_callers_request_keeps_every_entry(ranks):
    for r in ranks.values():
        assert r["wrapped_partial"]["request_keys"] == [
            "weight0", "weight1", "weight_quantizer.0._amax", "weight_quantizer.1._amax"]
