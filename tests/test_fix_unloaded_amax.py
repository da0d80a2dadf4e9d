"""Part (g) of harness.fix on the cpu tier: what its wrapper does to the values the restore left
(moe_ckpt_fix/unloaded_amax.py; the GPU case with Transformer Engine is
tests/gpu/test_unloaded_amax.py). ModelOpt's real quantizers, no TE."""
from __future__ import annotations

import math

import torch

from moe_ckpt_fix import unloaded_amax


def test_valid_amax_keeps_a_real_amax_and_zeroes_what_is_none():
    amax = torch.tensor([[3.0], [0.0], [-1.0], [math.nan], [1e-30]])
    got = unloaded_amax.valid_amax(amax)
    assert torch.equal(got, torch.tensor([[3.0], [0.0], [0.0], [0.0], [1e-30]]))


def test_the_wrapper_hands_the_post_restore_only_valid_expert_amax():
    from modelopt.torch.quantization.nn import GroupedQuantizer, TensorQuantizer

    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight_quantizer = GroupedQuantizer(TensorQuantizer(), TensorQuantizer())
            self.seen = None

        def modelopt_post_restore(self, prefix=""):
            self.seen = [q._amax.clone() for q in self.weight_quantizer]

    m = Grouped()
    m.weight_quantizer[0].register_buffer("_amax", torch.tensor([[-2.0], [5.0]]))
    m.weight_quantizer[1].register_buffer("_amax", torch.tensor([[math.nan], [0.5]]))
    wrapped = unloaded_amax.wrap_post_restore(Grouped.modelopt_post_restore)
    assert getattr(wrapped, unloaded_amax.MARK) and getattr(wrapped, "__moe_ckpt_fix__")
    wrapped(m)
    assert [s.tolist() for s in m.seen] == [[[0.0], [5.0]], [[0.0], [0.5]]]
    # a second call (the load's _extra_state runs the post-restore again) changes nothing
    wrapped(m)
    assert [s.tolist() for s in m.seen] == [[[0.0], [5.0]], [[0.0], [0.5]]]
