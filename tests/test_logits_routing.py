"""The logits criterion (harness/check/logits.py), cpu tier, no model needed.

Expectations: the rule in that module's docstring (asserted: the loaded model against the saved
state written into a model at the load topology, exact; reported: the cross-topology figure
against its measured noise floor), and recorded H200 runs (tests/data/runs/): one of 32 probe
tokens changed experts (20261202-151428-routing), 15-17 of 32 at 23 layers (20261203-034324),
the non-deterministic forward (20261203-065627) and its deterministic re-run (20261203-095205).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.check.verify_figures import judged_verify, verify_problems
from harness.check.logits import FP32_ROUNDING, judge_logits, topology_finding
from harness.rank.logits import at_load_topology_figures, logits_figures, same_routing_tokens

B, S, V, E = 2, 16, 8, 4
RUNS = Path(__file__).resolve().parent / "data" / "runs"


def _routing(flip_rows=()):
    m = torch.zeros(S * B, E, dtype=torch.bool)
    m[:, 0] = m[:, 1] = True
    for r in flip_rows:
        m[r] = torch.tensor([False, False, True, True])
    return {"decoder.layers.0.mlp.router": m}


def _write(ref_dir: Path, logits: torch.Tensor, routing) -> None:
    probe = {"plain": logits, "routing": routing} if routing is not None else {"plain": logits}
    torch.save(probe, ref_dir / "logits_checkpoint.pt")
    torch.save(probe, ref_dir / "logits_saved_model.pt")


@pytest.fixture
def ref(tmp_path):
    logits = torch.linspace(-1, 1, B * S * V).reshape(B, S, V)
    return tmp_path, logits


def _judged(logits, d, restored=None, tier="gpu-shared", noise=None):
    """Measured as on a rank (``restored``: the saved state's logits at the load topology,
    default the loaded model's own), judged as in the controller."""
    out = logits_figures(logits, d)
    out["logits_at_load_topology"] = at_load_topology_figures(logits, restored or logits)
    if noise is not None:
        out["noise_floor_figures"] = noise
    return judged_verify(out, tier)


@pytest.mark.cpu
def test_router_rows_are_seq_major(ref):
    same = same_routing_tokens(_routing([3 * B + 1]), _routing(), (B, S))
    assert same.shape == (B, S) and (~same).sum() == 1 and not same[1, 3]


@pytest.mark.cpu
def test_cross_topology_flips_are_reported_never_asserted(ref):
    d, logits = ref
    _write(d, logits, _routing())
    got = logits * 1.5  # far off the save topology's logits, every token flipped
    out = _judged({"plain": got, "routing": _routing(range(S * B))}, d)
    ct = out["cross_topology"]
    assert ct["routing_flips"] == S * B and ct["rel_diff"] > 0.3
    assert out["logits_asserted"] == "load-topology" and out["logits_rel_diff"] == 0.0
    assert out["logits_ok"] and not verify_problems(out, ())


@pytest.mark.cpu
@pytest.mark.parametrize("at_load_rel", [1e-6, 0.3])
def test_any_difference_at_the_load_topology_fails(ref, at_load_rel):
    """Same topology, same kernels, deterministic algorithms: the tolerance is exact."""
    d, logits = ref
    _write(d, logits, _routing())
    out = _judged({"plain": logits, "routing": _routing()}, d,
                  restored={"plain": logits * (1 + at_load_rel), "routing": _routing()})
    assert out["logits_tolerance"] == 0.0 and not out["logits_ok"]
    assert "logits at the load topology differ" in verify_problems(out, ())[0]


@pytest.mark.cpu
def test_noise_floor_decides_the_topology_finding_not_the_outcome(ref):
    """The recorded cross-topology figure (0.137 rel, 2 flips) within a floor of bf16 rounding at both topologies
    is noise; beyond it (fp32 forwards disagree) it is a finding, never a checkpoint failure."""
    d, logits = ref
    _write(d, logits, _routing())
    got = logits * 1.137
    noisy = {"bf16_vs_fp32_save": 0.07, "bf16_vs_fp32_load": 0.08, "fp32_cross_topology": 1e-6}
    out = _judged({"plain": got, "routing": _routing([1, 2])}, d, noise=noisy)
    ct = out["cross_topology"]
    assert ct["noise_floor"] == pytest.approx(0.15 + FP32_ROUNDING) and ct["beyond_noise_floor"] is False
    assert out["logits_ok"] and topology_finding(out) is None
    exact = {"bf16_vs_fp32_save": 0.001, "bf16_vs_fp32_load": 0.001, "fp32_cross_topology": 0.13}
    out = _judged({"plain": got, "routing": _routing()}, d, noise=exact)
    assert out["cross_topology"]["beyond_noise_floor"] and out["logits_ok"]
    assert "forward differs across topologies beyond rounding" in topology_finding(out)


@pytest.mark.cpu
def test_without_a_noise_floor_the_cross_topology_figure_is_unjudged(ref):
    d, logits = ref
    _write(d, logits, _routing())
    out = _judged({"plain": logits * 2, "routing": _routing()}, d)
    assert out["cross_topology"]["noise_floor"] is None
    assert "beyond_noise_floor" not in out["cross_topology"] and out["logits_ok"]
    cpu = _judged({"plain": logits * 2, "routing": _routing()}, d, tier="cpu")
    assert cpu["cross_topology"]["noise_floor"] == FP32_ROUNDING and cpu["cross_topology"]["beyond_noise_floor"]


@pytest.mark.cpu
def test_records_without_a_load_topology_figure_assert_no_logits():
    """Recorded before logits were split into asserted and reported, with the default reference: the state comparison is the
    checkpoint evidence; the old judged keys (logits_ok False) are dropped, not trusted."""
    doc = json.loads((RUNS / "20261202-151428-routing.results.json").read_text())
    cell = next(c for c in doc["cells"] if c["cell_id"] == "gpu-fix[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]")
    v = cell["verify"]
    assert v["mismatch_count"] == 0 and v["ranks_compared"] == 8 and not v["missing_keys"]
    assert v["logits_plain"]["rel_diff"] > 0.3 and v["routing_flips"] == 1
    out = judged_verify({**v, "logits_ok": False}, cell["tier"])
    assert out["logits_asserted"].startswith("none") and "logits_ok" not in out
    assert out["cross_topology"]["rel_diff"] == v["logits_plain"]["rel_diff"]
    assert not verify_problems(out, ())


@pytest.mark.cpu
def test_recorded_nano_shape_cells_pass_on_their_bit_exact_state():
    """H200, 23 MoE layers x 128 experts, every tensor and amax bit-exact: 15-17 of 32 tokens
    flip across splits. Under the old cross-split rule they failed; they are reported now."""
    doc = json.loads((RUNS / "20261203-034324-shape-nano.results.json").read_text())
    fixed = [c for c in doc["cells"] if c["patch"] == "fix"]
    assert len(fixed) == 2
    for cell in fixed:
        v = cell["verify"]
        assert v["mismatch_count"] == 0 and v["ranks_compared"] in (8, 16)
        assert v["routing_flips"] > 4 and not v["logits_ok"]  # failed as recorded
        out = judged_verify(v, cell["tier"])
        assert out["cross_topology"]["routing_flips"] == v["routing_flips"] and not verify_problems(out, ())


@pytest.mark.cpu
def test_recorded_non_deterministic_forward_still_fails_the_exact_rule():
    """The one recorded case where the asserted figure is not 0 (H200, 20261203-065627: the
    forward before the probe ran under deterministic algorithms): the rule can fail."""
    doc = json.loads((RUNS / "20261203-065627-shape-nano.results.json").read_text())
    for cell in doc["cells"]:
        v = judged_verify(cell["verify"], cell["tier"])
        assert v["logits_at_load_topology"]["plain"]["rel_diff"] > 0.06 and not v["logits_ok"]
