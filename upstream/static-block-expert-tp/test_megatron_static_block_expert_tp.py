# The test for the change in modelopt.diff, written in the layout of Model-Optimizer's Megatron
# plugin tests (tests/gpu_megatron/torch/quantization/plugins/): the suite's own helpers
# (spawn_multiprocess_job, initialize_for_megatron, get_mcore_gpt_model, get_forward) and its
# need_2_gpus fixture, NCCL, one rank per GPU. It goes beside test_megatron.py there; it does not
# run from this repository (it needs Model-Optimizer's tests/_test_utils), and it has not run yet:
# test_static_block_expert_tp.py beside it runs the same check through repro.py on any host.
# Without the change the ETP-1 -> ETP-2 case fails on megatron-core's "Global shape mismatch"
# for ...weight_quantizer._amax (and ModelOpt refuses the ETP-2 calibration of the other case).
from functools import partial

import pytest
import torch
from _test_utils.import_helper import skip_if_no_megatron
from _test_utils.torch.distributed.utils import spawn_multiprocess_job
from _test_utils.torch.megatron.models import get_mcore_gpt_model
from _test_utils.torch.megatron.utils import get_forward, initialize_for_megatron

skip_if_no_megatron()

from megatron.core import dist_checkpointing
from megatron.core.parallel_state import destroy_model_parallel

import modelopt.torch.quantization as mtq
from modelopt.torch.opt.plugins import (
    restore_sharded_modelopt_state,
    save_sharded_modelopt_state,
)

SEED = 1234
NUM_EXPERTS = 4


def _moe_model(size, etp):
    initialize_for_megatron(
        tensor_model_parallel_size=1,
        seed=SEED,
        expert_model_parallel_size=size // etp,
        expert_tensor_parallel_size=etp,
    )
    model = get_mcore_gpt_model(
        tensor_model_parallel_size=1,
        expert_model_parallel_size=size // etp,
        expert_tensor_parallel_size=etp,
        num_layers=2,
        hidden_size=256,
        vocab_size=256,
        num_attention_heads=8,
        ffn_hidden_size=None,
        num_moe_experts=NUM_EXPERTS,
        moe_grouped_gemm=True,
        use_te=True,
        transformer_impl="modelopt",
    )
    return model.cuda().eval()


def _save(model, path):
    save_sharded_modelopt_state([model], str(path))
    dist_checkpointing.save(model.sharded_state_dict(prefix=""), str(path))


def _test_static_block_reshard(tmp_path, save_etp, load_etp, rank, size):
    first, again = tmp_path / "saved", tmp_path / "resaved"
    model = _moe_model(size, save_etp)
    config = mtq.NVFP4_FOUR_OVER_SIX_CFG  # static NVFP4: per-block _amax + _global_amax
    model = mtq.quantize(model, config, get_forward(model))
    _save(model, first)
    destroy_model_parallel()

    model = _moe_model(size, load_etp)
    restore_sharded_modelopt_state([model], str(first))
    state = dist_checkpointing.load(model.sharded_state_dict(prefix=""), str(first))
    model.load_state_dict(state)
    _save(model, again)
    torch.distributed.barrier()

    saved = dist_checkpointing.load_plain_tensors(str(first))
    resaved = dist_checkpointing.load_plain_tensors(str(again))
    amax = [k for k in saved if k.endswith(("weight_quantizer._amax", "weight_quantizer._global_amax"))]
    assert amax and saved.keys() == resaved.keys()
    for key in amax:  # the whole expert's block amax, whatever expert TP held it
        assert torch.equal(saved[key].cpu(), resaved[key].cpu()), key
    destroy_model_parallel()


@pytest.mark.parametrize(("save_etp", "load_etp"), [(1, 2), (2, 1)])
def test_static_nvfp4_expert_amax_across_expert_tp(need_2_gpus, tmp_path, save_etp, load_etp):
    spawn_multiprocess_job(
        size=2,
        job=partial(_test_static_block_reshard, tmp_path, save_etp, load_etp),
        backend="nccl",
    )
