"""harness.fix on the real Transformer Engine classes (one GPU, one process, world size 1).

World size 1 cannot show the replica-id bug (every rank is rank 0); the multi-rank TP != ETP
save/load scenarios belong to the harness's torchrun stages. What this checks: apply() installs
on the TE plugin classes, and the post-restore fix (b) on a real
``_MegatronTEGroupedColumnParallelLinear``, including 0.47.0's per-expert dry-run loop on CUDA.
"""
from __future__ import annotations

import pytest
import torch

from tests.helpers import one_rank_store

pytestmark = pytest.mark.gpu_shared

te = pytest.importorskip("transformer_engine.pytorch", reason="Transformer Engine is not importable")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NUM_GEMMS = 4


@pytest.fixture(scope="module")
def patched():
    import harness.fix

    # as the harness's ranks and a job (MOE_CKPT_FIX=1) apply it: every part the release lacks
    first = harness.fix.apply()
    assert harness.fix.apply() == first  # idempotent
    return first


@pytest.fixture(scope="module")
def model_parallel():
    import megatron.core.parallel_state as mpu

    created = not torch.distributed.is_initialized()
    if created:  # a store on a port the kernel picks: no address shared with any other test
        torch.distributed.init_process_group("nccl", store=one_rank_store(), rank=0, world_size=1)
    mpu.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    yield
    mpu.destroy_model_parallel()
    if created:
        torch.distributed.destroy_process_group()


def test_apply_installs_on_te_classes(patched):
    """Parts (a)-(e) on 0.47.0; 0.48.0rc1 has them itself and gets (f) alone (the next test)."""
    from harness.check.versions import installed_modelopt
    from harness.fix import SUPPORTED_MODELOPT_VERSION

    if installed_modelopt() != SUPPORTED_MODELOPT_VERSION:
        pytest.skip(f"parts (a)-(e) exist for {SUPPORTED_MODELOPT_VERSION} only; "
                    f"{installed_modelopt()} gets part (f) alone")
    import modelopt.torch.quantization.plugins.custom as custom
    import modelopt.torch.quantization.plugins.megatron as mp
    from moe_ckpt_fix.modelopt_0_47_0 import _MARK

    for target in (
        mp.make_sharded_tensors_for_checkpoint,
        mp._QuantMegatronTEGroupedLinear.sharded_state_dict,
        mp._MegatronTEGroupedColumnParallelLinear.sharded_state_dict,
        mp._MegatronTEGroupedRowParallelLinear.sharded_state_dict,
        custom._ParallelLinear.modelopt_post_restore,
        mp._MegatronTEGroupedRowParallelLinear._get_shard_axis_dict,
    ):
        assert getattr(target, _MARK, False), target


def _converted_grouped_linear(grouped_class, input_size: int, output_size: int):
    """A real TE grouped linear of NUM_GEMMS experts on the GPU, converted to ModelOpt's quant
    module (its per-expert weight quantizers not yet configured)."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_moe_experts=NUM_GEMMS,
        moe_grouped_gemm=True, params_dtype=torch.bfloat16, bf16=True,
    )
    linear = grouped_class(
        NUM_GEMMS, input_size, output_size, config=config, init_method=torch.nn.init.normal_,
        bias=False, skip_bias_add=True, is_expert=True,
    ).cuda()
    return QuantModuleRegistry.convert(linear)


def _quant_grouped_linear(amax):
    import modelopt.torch.quantization.plugins.megatron as mp
    from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear
    from modelopt.torch.opt.plugins.megatron import register_modelopt_extra_state_callbacks

    m = _converted_grouped_linear(TEColumnParallelGroupedLinear, 64, 128)
    for q, a in zip(m.weight_quantizer, amax):
        q.amax = torch.tensor(a, device="cuda")
    register_modelopt_extra_state_callbacks(
        m, mp.quant_module_get_extra_state, mp.quant_module_set_extra_state
    )
    return m


def test_load_state_dict_keeps_every_expert_amax(patched, model_parallel):
    src_amax = [1.0, 2.0, 3.0, 4.0]
    sd = _quant_grouped_linear(src_amax).state_dict()
    assert {f"weight_quantizer.{i}._amax" for i in range(NUM_GEMMS)} <= set(sd)
    dst = _quant_grouped_linear([9.0] * NUM_GEMMS)
    result = dst.load_state_dict(sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert [q._amax.item() for q in dst.weight_quantizer] == src_amax


def test_per_expert_sharded_entries_keep_keys_and_shapes(patched, model_parallel):
    m = _quant_grouped_linear([1.0, 2.0, 3.0, 4.0])
    ssd = m.sharded_state_dict(prefix="experts.linear_fc1.", metadata={"singleton_local_shards": True})
    for i in range(NUM_GEMMS):
        sh = ssd[f"experts.linear_fc1.weight_quantizer.{i}._amax"]
        assert sh.key == f"{i}.experts.linear_fc1.weight_quantizer._amax"
        assert sh.global_shape == (1,) and sh.replica_id == (0, 0, 0)


# --- part (f): static NVFP4 experts across expert TP (written on the cpu machine, first run on a
# GPU with the queue tools/gpu-host/queues/static-block-fix.txt) ----------------------------------
def test_apply_installs_part_f_on_te_classes(patched):
    import modelopt.torch.quantization.mode as mode
    import modelopt.torch.quantization.model_calib as model_calib
    import modelopt.torch.quantization.plugins.megatron as mp
    from moe_ckpt_fix import static_block

    for target in (
        mp._QuantMegatronTEGroupedLinear.sharded_state_dict,
        mp._QuantMegatronTEGroupedLinear.modelopt_post_restore,
        mp._check_nvfp4_static_tp_supported,
        model_calib.max_calibrate,
        mode.MaxCalibrateModeDescriptor._calib_func,
    ):
        assert getattr(target, static_block.MARK, False), target


def _static_row_grouped_linear():
    """A real TERowParallelGroupedLinear (fc2-like: weight (64, 128) per expert), its expert
    weight quantizers static NVFP4, max-calibrated on the weights (world size 1)."""
    from megatron.core.extensions.transformer_engine import TERowParallelGroupedLinear
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.model_calib import max_calibrate

    m = _converted_grouped_linear(TERowParallelGroupedLinear, 128, 64)
    static = QuantizerAttributeConfig(num_bits=(2, 1), block_sizes={-1: 16, "type": "static",
                                                                   "scale_bits": (4, 3)})
    for q in m.weight_quantizer:
        q.set_from_attribute_config(static)
    m.input_quantizer.disable()
    max_calibrate(m, None, distributed_sync=False)
    return m


def test_static_block_amax_is_declared_whole_in_modelopts_format(patched, model_parallel):
    """World size 1 (expert TP 1): each block amax is a factory under ModelOpt's key that builds
    the (N, 1) buffer itself, one main replica, and merges a loaded whole back unchanged."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    m = _static_row_grouped_linear()
    ssd = m.sharded_state_dict(prefix="experts.linear_fc2.", metadata={"singleton_local_shards": True})
    for i, q in enumerate(m.weight_quantizer):
        assert q.is_nvfp4_static and tuple(q._amax.shape) == (64 * 128 // 16, 1)
        factory = ssd[f"experts.linear_fc2.weight_quantizer.{i}._amax"]
        assert isinstance(factory, ShardedTensorFactory)
        assert factory.key == f"{i}.experts.linear_fc2.weight_quantizer._amax"
        amax = factory.build()
        assert amax.global_shape == (64 * 128 // 16, 1) and amax.replica_id == (0, 0, 0)
        assert torch.equal(amax.data, q._amax)
        assert torch.equal(factory.merge_fn(amax.data), q._amax)
        # the expert's global amax stays whole and replicated, in the buffer's own (0-d) shape
        global_amax = ssd[f"experts.linear_fc2.weight_quantizer.{i}._global_amax"]
        assert global_amax.global_shape == tuple(q._global_amax.shape) and q._global_amax.numel() == 1
        assert global_amax.replica_id == (0, 0, 0)


def test_a_block_amax_restored_with_another_shape_is_refitted(patched, model_parallel):
    m = _static_row_grouped_linear()
    want = [q._amax.clone() for q in m.weight_quantizer]
    for q in m.weight_quantizer:  # the shape a save at half this expert TP would restore
        q._amax = torch.ones(2 * q._amax.numel(), 1, device="cuda")
    m.modelopt_post_restore()
    assert [tuple(q._amax.shape) for q in m.weight_quantizer] == [tuple(w.shape) for w in want]
    assert all(torch.equal(q._amax, w) for q, w in zip(m.weight_quantizer, want))
