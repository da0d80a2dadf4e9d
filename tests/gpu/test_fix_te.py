"""harness.fix on the real Transformer Engine classes (one GPU, one process, world size 1).

World size 1 cannot show the replica-id bug (every rank is rank 0); the multi-rank TP != ETP
save/load scenarios belong to the harness's torchrun stages. What this checks: apply() installs
on the TE plugin classes, and the post-restore fix (b) on a real
``_MegatronTEGroupedColumnParallelLinear``, including 0.47.0's per-expert dry-run loop on CUDA.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu_shared

te = pytest.importorskip("transformer_engine.pytorch", reason="Transformer Engine is not importable")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NUM_GEMMS = 4


@pytest.fixture(scope="module")
def patched():
    import harness.fix

    first = harness.fix.apply()
    assert harness.fix.apply() == first  # idempotent
    return first


@pytest.fixture(scope="module")
def model_parallel():
    import megatron.core.parallel_state as mpu

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    created = not torch.distributed.is_initialized()
    if created:
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    mpu.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    yield
    mpu.destroy_model_parallel()
    if created:
        torch.distributed.destroy_process_group()


def test_apply_installs_on_te_classes(patched):
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


def _quant_grouped_linear(amax):
    import modelopt.torch.quantization.plugins.megatron as mp
    from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear
    from megatron.core.transformer.transformer_config import TransformerConfig
    from modelopt.torch.opt.plugins.megatron import register_modelopt_extra_state_callbacks
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_moe_experts=NUM_GEMMS,
        moe_grouped_gemm=True, params_dtype=torch.bfloat16, bf16=True,
    )
    linear = TEColumnParallelGroupedLinear(
        NUM_GEMMS, 64, 128, config=config, init_method=torch.nn.init.normal_,
        bias=False, skip_bias_add=True, is_expert=True,
    ).cuda()
    m = QuantModuleRegistry.convert(linear)
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
