"""One process, one GPU: the load of an integer-quantized TE grouped linear, as a load stage
reads it (``load_state_dict``: the ``_extra_state`` setter restores the quantizers and runs the
post-restore, then the quantizers' buffers load). The only thing made up is what ``torch.empty``
hands the restore (tensor_quantizer.py ``_reset_pytorch_state_from_metadata``): -1 here, as
reused memory may hold, so the run does not depend on the allocator's history.

``python tests/gpu/unloaded_amax_child.py none|fix|fix-g``; prints one JSON line:
{"ok", "error", "parts", "amax_equal"}. tests/gpu/test_unloaded_amax.py runs it.
"""
from __future__ import annotations

import json
import sys

import torch

NUM_GEMMS = 4


def _grouped_linear():
    import modelopt.torch.quantization.plugins.megatron as mp
    from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear
    from megatron.core.transformer.transformer_config import TransformerConfig
    from modelopt.torch.opt.plugins.megatron import register_modelopt_extra_state_callbacks
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.model_calib import max_calibrate
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                               num_moe_experts=NUM_GEMMS, moe_grouped_gemm=True,
                               params_dtype=torch.bfloat16, bf16=True)
    m = QuantModuleRegistry.convert(TEColumnParallelGroupedLinear(
        NUM_GEMMS, 64, 128, config=config, init_method=torch.nn.init.normal_, bias=False,
        skip_bias_add=True, is_expert=True).cuda())
    per_channel = QuantizerAttributeConfig(num_bits=8, axis=0)  # INT8_WEIGHT_ONLY_CFG's weights
    for q in m.weight_quantizer:
        q.set_from_attribute_config(per_channel)
    m.input_quantizer.disable()
    max_calibrate(m, None, distributed_sync=False)
    register_modelopt_extra_state_callbacks(m, mp.quant_module_get_extra_state,
                                            mp.quant_module_set_extra_state)
    return m


def _restore_leaves_minus_one():
    from modelopt.torch.quantization.nn import TensorQuantizer

    reset = TensorQuantizer._reset_pytorch_state_from_metadata

    def reset_then_fill(self, metadata):
        reset(self, metadata)
        for buf in self._buffers.values():
            if buf is not None and buf.is_floating_point():
                buf.fill_(-1.0)

    TensorQuantizer._reset_pytorch_state_from_metadata = reset_then_fill


def main(mode: str) -> dict:
    import megatron.core.parallel_state as mpu

    # a store on a port the kernel picks: nothing inherited, nothing shared with another test
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True)
    torch.distributed.init_process_group("nccl", store=store, rank=0, world_size=1)
    mpu.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    parts = ()
    if mode != "none":
        import moe_ckpt_fix

        moe_ckpt_fix.apply(allow_unproven=mode == "fix-g")
        parts = moe_ckpt_fix.applied_parts()
    src = _grouped_linear()
    want = [q._amax.clone() for q in src.weight_quantizer]
    state = src.state_dict()
    dst = _grouped_linear()
    _restore_leaves_minus_one()
    try:
        dst.load_state_dict(state, strict=True)
        torch.cuda.synchronize()
    except Exception as exc:  # what a load stage would die of: its words are the evidence
        words = " ".join(str(exc).split())[:600]  # load_state_dict's keys are on its 2nd line
        return {"ok": False, "error": f"{type(exc).__name__}: {words}", "parts": list(parts)}
    got = [getattr(q, "_amax", None) for q in dst.weight_quantizer]
    equal = all(g is not None and torch.equal(g.to(w.device), w) for g, w in zip(got, want))
    return {"ok": True, "error": None, "parts": list(parts), "amax_equal": equal}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
