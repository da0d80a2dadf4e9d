"""Part (g): the grouped linear's post-restore dry run reads expert amax nobody has loaded yet.

``_QuantTEGroupedLinear.modelopt_post_restore`` (plugins/transformer_engine.py:173-233, the same
in 0.47.0 and 0.48.0rc1) runs each expert's weight quantizer on its weight (``wq_i(weight_i)``,
:207) to learn whether the restored ``_amax`` fits that weight. The restore made the buffer with
``torch.empty`` (nn/modules/tensor_quantizer.py:1364, ``_reset_pytorch_state_from_metadata``);
its values come from the checkpoint only afterwards (megatron-core's ``dist_checkpointing.load``;
``load_state_dict`` loads a quantizer's buffers after its parent's ``_extra_state``, whose
setter runs the post-restore: plugins/megatron.py ``quant_module_set_extra_state``). Integer fake
quantization asserts ``amax >= 0`` on the device (kernels/quantization/gemm/tensor_quant_gpu.cu:44;
without the CUDA extension tensor_quant.py:631-633 raises "Negative values in amax"), so
uninitialized memory that holds a negative number or a NaN ends the process with a device-side
assert, reported by the next synchronizing call. 0.48.0rc1 keeps GroupedQuantizer members through
the reset (plugins/custom.py:180-186), as part (b) does on 0.47.0, so both reach the dry run with
such values; unpatched 0.47.0 first deletes every expert's amax but expert 0's, which it
re-calibrates.

The fix: before the post-restore runs, every expert weight quantizer's ``_amax`` entry that is
no amax at all (negative or NaN) is set to 0. A real amax (>= 0) is left as it is, so only
values nobody loaded change, and the load that follows writes the checkpoint's.
"""
from __future__ import annotations

import functools

from . import static_block

MARK = "__moe_ckpt_fix_unloaded_amax__"  # on every function this module installs (idempotency)
_ANY_MARK = "__moe_ckpt_fix__"  # the package's common mark (tests look for it)
DESCRIPTION = ("(g) _QuantTEGroupedLinear.modelopt_post_restore's per-expert dry run sees no "
               "negative or NaN _amax (what torch.empty left before the checkpoint's values load)")


def valid_amax(amax):
    """``amax`` with every entry that is no amax (negative or NaN) set to 0; a real one as is."""
    import torch

    return torch.where(amax >= 0, amax, torch.zeros_like(amax))


def wrap_post_restore(post_restore):
    @functools.wraps(post_restore)
    def modelopt_post_restore(self, prefix: str = ""):
        import torch

        with torch.no_grad():
            for q in static_block.expert_amax_holders(self):
                q._amax.copy_(valid_amax(q._amax))
        post_restore(self, prefix=prefix)

    for m in (MARK, _ANY_MARK):
        setattr(modelopt_post_restore, m, True)
    return modelopt_post_restore


def prepare(mp):
    """The function that installs (g) on ModelOpt's megatron plugin ``mp`` (its grouped linear's
    post-restore, around whatever wrappers the caller installed there before)."""
    grouped = mp._QuantMegatronTEGroupedLinear

    def install() -> str:
        current = grouped.modelopt_post_restore
        if not getattr(current, MARK, False):
            grouped.modelopt_post_restore = wrap_post_restore(current)
        return DESCRIPTION

    return install
