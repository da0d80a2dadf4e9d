"""A loaded expert amax that is zero, non-finite or another expert's value is a
named failure even when the load raised nothing (dist-ckpt strictness log_all only logs a key
the checkpoint lacks). The comparison runs on megatron-core's own ShardedTensors."""
from __future__ import annotations

import pytest
import torch

from harness.check.verify_figures import verify_problems
from harness.rank.compare import compare, expert_amax_state

pytestmark = pytest.mark.cpu

KEY = "decoder.layers.0.mlp.experts.experts.{e}.linear_fc1.weight_quantizer._amax"


def sharded(values: dict[int, torch.Tensor]) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {KEY.format(e=e): ShardedTensor.from_rank_offsets(KEY.format(e=e), v)
            for e, v in values.items()}


REFERENCE = {KEY.format(e=e): torch.tensor([float(e + 1)]) for e in range(4)}


@pytest.mark.parametrize("loaded, state", [
    (torch.tensor([3.0]), "restored"),
    (torch.tensor([0.0]), "placeholder-zero"),
    (torch.tensor([float("inf")]), "non-finite"),
    (torch.tensor([float("nan")]), "non-finite"),
    (torch.tensor([1.0]), "another-expert"),  # expert 0's value in expert 2
    (torch.tensor([7.5]), "differs"),
])
def test_each_loaded_amax_gets_its_state(loaded, state):
    model = sharded({e: REFERENCE[KEY.format(e=e)].clone() for e in range(4)} | {2: loaded})
    cmp = compare(model, REFERENCE)
    assert cmp.expert_amax[KEY.format(e=2)] == state
    assert all(cmp.expert_amax[KEY.format(e=e)] == "restored" for e in (0, 1, 3))


def test_the_judge_names_the_state_and_its_first_key():
    model = sharded({0: torch.tensor([1.0]), 1: torch.tensor([1.0]), 2: torch.tensor([float("nan")]),
                     3: torch.tensor([0.0])})
    cmp = compare(model, REFERENCE)
    verify = {"mismatch_count": len(cmp.mismatches), "mismatches": cmp.mismatches,
              "expert_amax_state": expert_amax_state([cmp], REFERENCE, [])}
    problems = verify_problems(verify, known_gaps=())
    assert f"1 expert amax another-expert after load, first {KEY.format(e=1)}" in problems
    assert f"1 expert amax non-finite after load, first {KEY.format(e=2)}" in problems
    assert f"1 expert amax placeholder-zero after load, first {KEY.format(e=3)}" in problems
    restored = sharded({e: REFERENCE[KEY.format(e=e)].clone() for e in range(4)})
    ok = compare(restored, REFERENCE)
    assert verify_problems({"expert_amax_state": expert_amax_state([ok], REFERENCE, [])}, ()) == []
