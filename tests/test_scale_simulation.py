"""Scale by simulation (harness/topology/scale.py): megatron-core's real validation on per-expert
amax metadata synthesized for production world sizes. The synthesis is first proved equal to the
real metadata recorded on an H200; the 64-rank expectations come from the replica rule as
docs/findings.md states it, not from the simulator.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed

from harness.check.versions import rules_for
from harness.topology import scale
from harness.topology.topology import Topology

RECORDED = Path(__file__).parent / "data" / "recorded"
RECORDINGS = sorted(RECORDED.rglob("*.json"))


def _rule(doc: dict) -> str:
    """The fix's rule when patched, else the rule of the (modelopt, megatron-core) pair that
    recorded it."""
    if doc["provenance"]["patch"] == "fix":
        return "fixed"
    # the pair that recorded it (every recording so far: megatron-core 0.19.2)
    prov = doc["provenance"]
    return rules_for(prov["nvidia-modelopt"], prov.get("megatron-core", "0.19.2")).replica_rule


def _id(path: Path) -> str:
    return str(path.relative_to(RECORDED).with_suffix(""))


@pytest.mark.cpu
@pytest.mark.parametrize("path", RECORDINGS, ids=_id)
def test_synthesis_equals_recorded_real_metadata(path):
    """Every expert-amax field per rank, and the real validation's verdict and failing keys."""
    doc = json.loads(path.read_text())
    assert any(scale.KEY_RE.match(e["key"]) for e in doc["entries"])
    assert scale.cross_check(doc, _rule(doc)) == []


@pytest.mark.cpu
def test_cross_check_notices_the_wrong_rule():
    """The cross-check can fail: a buggy recording synthesized under the fixed rule differs."""
    doc = json.loads((RECORDED / "tp4-etp1-ep8-none.json").read_text())
    assert doc["validation_error"]
    problems = scale.cross_check(doc, "fixed")
    assert any(p.startswith("rank ") for p in problems)
    assert any(p.startswith("verdict") for p in problems)


# (topology at 64 ranks, buggy rule fails?) -- from findings.md: the buggy replica id uses the
# DENSE tp rank where expert weights use the EXPERT tp rank, so TP != ETP gives 0 (TP > ETP) or
# more than 1 (ETP > TP) main replicas per expert; TP == ETP is always valid; the fix always is.
AT_64 = [
    ("tp1-etp1-ep8-w64", False),  # Nano quantize save, TP == ETP
    ("tp4-etp1-ep8-w64", True),  # Nano reload: the quarantined failure
    ("tp4-etp1-ep8-pp8", True),  # Ultra PTQ save/load (pp 8 assumed), world 64
    ("tp1-etp2-ep8-w64", True),  # ETP > TP
]


@pytest.mark.cpu
@pytest.mark.parametrize("topology,buggy_fails", AT_64, ids=[t for t, _ in AT_64])
def test_64_ranks_buggy_fails_at_tp_ne_etp_and_fixed_passes(topology, buggy_fails):
    topo = Topology.parse(topology)
    assert topo.world_size == 64
    experts, layers = 16, 8
    for rule in ("buggy", "fixed"):
        per_rank = scale.synthesize(topo, experts, layers, rule)
        assert len(per_rank) == 64
        keys = {sh.key for rank in per_rank for sh in rank}
        assert len(keys) == layers * 2 * experts  # every expert of every layer is held somewhere
        assert sum(map(len, per_rank)) == 64 * (layers // topo.pp) * 2 * (experts // topo.ep)
        failing = scale.validate(per_rank)
        assert all(scale.KEY_RE.match(k) for k in failing)
        assert bool(failing) == (buggy_fails and rule == "buggy"), (rule, failing[:3])


@pytest.mark.cpu
def test_etp_above_tp_refuses_every_expert():
    """ETP 2 > TP 1: both expert-TP ranks of expert-DP rank 0 have dense TP rank 0, so every
    expert amax has 2 main replicas under the buggy rule."""
    per_rank = scale.synthesize("tp1-etp2-ep8-w64", 16, 8, "buggy")
    assert len(scale.validate(per_rank)) == 8 * 2 * 16


@pytest.mark.cpu
def test_nano_reload_at_production_size_64_ranks():
    """128 experts, 23 MoE layers (assumed Nano sizes): refused under 0.47.0's rule, not the fix."""
    assert scale.validate(scale.synthesize("tp4-etp1-ep8-w64", 128, 23, "buggy"))
    assert scale.validate(scale.synthesize("tp4-etp1-ep8-w64", 128, 23, "fixed")) == []


@pytest.mark.cpu
def test_validate_leaves_torch_distributed_alone():
    before = torch.distributed.get_rank
    scale.validate(scale.synthesize("tp2-etp1-ep2", 8, 2, "buggy"))
    assert torch.distributed.get_rank is before
    assert not torch.distributed.is_initialized()
