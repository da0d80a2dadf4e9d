"""The topology-independent comparison must catch what a broken reshard looks like: a changed
value, a missing key, a replica disagreement. Built from megatron-core ShardedTensors directly
(two 'save ranks' holding halves of a tensor, one 'load rank' holding all of it)."""
from __future__ import annotations

import pytest
import torch

from harness.rank import compare
from harness.check.keys import is_expert_weight_amax

pytestmark = pytest.mark.cpu


def _st(key, data, offset_axis0=0, parts=1, replica=(0, 0, 0)):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return ShardedTensor.from_rank_offsets(key, data, (0, offset_axis0, parts), replica_id=replica)


def _save(tmp_path, rank_dicts):
    for rank, sd in enumerate(rank_dicts):
        compare.save_reference(sd, tmp_path, rank)
    return compare.load_reference(tmp_path)


def test_resharded_tensor_compares_equal_and_a_changed_value_is_caught(tmp_path):
    w = torch.arange(8.0).reshape(4, 2)
    amax = torch.tensor([3.5])
    reference, disagree = _save(tmp_path, [
        {"w": _st("w", w[:2], 0, 2), "a": _st("a", amax)},
        {"w": _st("w", w[2:], 1, 2), "a": _st("a", amax, replica=(0, 1, 0))},
    ])
    assert disagree == []
    ok = compare.compare({"w": _st("w", w), "a": _st("a", amax)}, reference)
    assert ok.keys_compared == 2 and not ok.mismatches

    w2 = w.clone()
    w2[3, 1] += 1
    bad = compare.compare({"w": _st("w", w2), "a": _st("a", amax)}, reference)
    assert [m["key"] for m in bad.mismatches] == ["w"] and bad.mismatches[0]["max_abs_diff"] == 1


def test_missing_expert_amax_and_replica_disagreement_are_reported(tmp_path):
    key = "decoder.layers.0.mlp.experts.experts.1.linear_fc1.weight_quantizer._amax"
    reference, disagree = _save(tmp_path, [
        {"a": _st(key, torch.tensor([1.0]))},
        {"a": _st(key, torch.tensor([2.0]), replica=(0, 1, 0))},  # a replica that disagrees
    ])
    assert disagree == [key]
    assert reference[key].item() == 1.0  # the main replica wins, as in the checkpoint
    assert is_expert_weight_amax(key)
    assert compare.missing_keys(reference, present_on_any_rank=set()) == [key]


def test_merge_reports_a_mismatch_seen_on_any_rank(tmp_path):
    w = torch.arange(4.0)
    reference, _ = _save(tmp_path, [{"w": _st("w", w)}])
    good = compare.compare({"w": _st("w", w[:2], 0, 2)}, reference)
    bad = compare.compare({"w": _st("w", w[2:] + 1, 1, 2)}, reference)
    merged = compare.merge([good, bad], reference)
    assert merged["keys_compared"] == 2 and merged["ranks_compared"] == 2
    assert merged["mismatch_count"] == 1 and merged["missing_keys"] == []
