"""The expected state of each committed golden checkpoint (harness/check/expect.py), cpu tier.

The goldens were made on an H200 (tools/gpu-host/make-golden.sh); only their files are read
here. Facts checked against the files themselves, so the rules the golden load cells rely on
are evidence, not assumptions:
- ModelOpt's max calibration stores max|W_e| as each expert's NVFP4 weight amax (every amax in
  both 0.47.0 goldens equals it), which is the value the fix re-derives for missing experts;
- the 0.46.1 golden holds one shared amax per grouped linear, equal to expert 0's max|W| (EP
  rank 0 wrote it: the other ranks' values were never saved), with weights identical to the
  0.47.0 golden of the same topology and seed.
"""
from __future__ import annotations

import pytest
import torch

from harness.golden.manifest import copy_to_temp
from harness.check.expect import expected_state, read_checkpoint_tensors
from harness.scenario.scenarios import GOLDEN_DIR

A, B, C = ("modelopt-0.46.1-tp1-etp1-ep8", "modelopt-0.47.0-tp1-etp1-ep8",
           "modelopt-0.47.0-tp2-etp1-ep2-novalidate")
LINEARS = [f"decoder.layers.{l}.mlp.experts.experts.{{e}}.linear_fc{f}" for l in (0, 1) for f in (1, 2)]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("goldens")
    return {n: read_checkpoint_tensors(copy_to_temp(GOLDEN_DIR / n, into=root) / "ckpt") for n in (A, B, C)}


def _max_abs(w: torch.Tensor) -> torch.Tensor:
    return w.float().abs().amax().reshape(1).to(torch.bfloat16)


@pytest.mark.cpu
@pytest.mark.parametrize("name", [B, C])
def test_stored_expert_amax_is_max_abs_of_the_expert_weight(stored, name):
    seen = 0
    for lin in LINEARS:
        for e in range(8):
            amax = stored[name].get(lin.format(e=e) + ".weight_quantizer._amax")
            if amax is not None:
                assert torch.equal(amax, _max_abs(stored[name][lin.format(e=e) + ".weight"])), (name, lin, e)
                seen += 1
    assert seen == (32 if name == B else 16)


@pytest.mark.cpu
def test_legacy_golden_shares_expert0_amax_and_weights(stored):
    a, b = stored[A], stored[B]
    for k, v in a.items():
        if k in b:
            assert torch.equal(v, b[k]), k
    for lin in LINEARS:
        shared = a[lin.replace(".{e}", "") + ".weight_quantizer._amax"]
        assert torch.equal(shared, b[lin.format(e=0) + ".weight_quantizer._amax"])


@pytest.mark.cpu
def test_expected_state_of_each_golden(stored):
    exp_a, exp_b, exp_c = (expected_state(stored[n]) for n in (A, B, C))
    assert exp_b.from_legacy == {} and exp_b.max_calibrated == {}
    assert sum(len(v) for v in exp_a.from_legacy.values()) == 32 and exp_a.max_calibrated == {}
    assert all(".experts.experts.linear_fc" in k for k in exp_a.legacy_keys) and len(exp_a.legacy_keys) == 4
    assert not set(exp_a.legacy_keys) & set(exp_a.tensors)
    for lin in LINEARS:
        legacy = stored[A][lin.replace(".{e}", "") + ".weight_quantizer._amax"]
        for e in range(8):
            assert torch.equal(exp_a.tensors[lin.format(e=e) + ".weight_quantizer._amax"], legacy)
    assert exp_c.max_calibrated == {lin.replace(".{e}", ""): [4, 5, 6, 7] for lin in LINEARS}
    for lin in LINEARS:
        for e in (4, 5, 6, 7):
            got = exp_c.tensors[lin.format(e=e) + ".weight_quantizer._amax"]
            assert torch.equal(got, _max_abs(stored[C][lin.format(e=e) + ".weight"]))


@pytest.mark.cpu
def test_prepare_golden_names_the_layout_and_writes_the_reference(tmp_path):
    from harness.rank.compare import load_reference
    from harness.run.cell import prepare_golden

    stage = prepare_golden(C, tmp_path / "save")
    assert stage.ok and "layout per-expert, 16 expert amax missing" in stage.summary
    ref, disagree = load_reference(tmp_path / "save" / "reference")
    complete = read_checkpoint_tensors(GOLDEN_DIR / B / "ckpt")
    assert not disagree and set(ref) == set(complete)  # 79 stored + 16 re-derived = the full key set


@pytest.mark.cpu
def test_a_shared_layout_modelopt_expects_the_stored_tensors_as_they_are(stored):
    """modelopt <= 0.46 has no per-expert amax: nothing is derived for it (harness/check/versions.py)."""
    raw = stored["modelopt-0.46.1-tp1-etp1-ep8"]
    exp = expected_state(raw, "shared")
    assert exp.tensors.keys() == raw.keys() and not exp.from_legacy and not exp.max_calibrated
    assert any(k.endswith("experts.experts.linear_fc1.weight_quantizer._amax") for k in exp.tensors)
