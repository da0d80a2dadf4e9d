"""AWQ calibration (NVFP4_AWQ_LITE_CFG, W4A8_AWQ_BETA_CFG) of a Megatron-Core MoE whose routed
experts are Transformer Engine grouped linears (TEGroupedMLP) fails inside ModelOpt:
`AttributeError: 'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'`
(a grouped linear holds weight0 .. weight{n-1}; awq_lite asks `module.weight`).

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:0 repro.py \
        [--recipe NVFP4_AWQ_LITE_CFG|W4A8_AWQ_BETA_CFG]

Any number of ranks: tp 1, ep = ranks. Exit 1 + `REPRO: defect present: AttributeError:
<module>` when ModelOpt's calibration raises it; exit 0 + `REPRO: defect absent ...` when
calibration and a quantized forward pass; exit 2 on anything else.
"""
import argparse
import datetime
import os
import re
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

def init():
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.cuda.is_available():
        print("REPRO: needs a GPU (Transformer Engine grouped experts)", flush=True)
        sys.exit(2)
    torch.cuda.set_device(local % torch.cuda.device_count())
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    return backend


def finish(code, line):
    """Rank 0 prints the verdict; every rank leaves at once (peers may wait in a collective)."""
    if dist.get_rank() == 0:
        print(line, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def versions(backend, extra=""):
    if dist.get_rank() == 0:
        import megatron.core, modelopt, transformer_engine  # noqa: E401
        print(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, "
              f"nvidia-modelopt {modelopt.__version__}, transformer-engine "
              f"{transformer_engine.__version__}, {torch.cuda.get_device_name()}, "
              f"{dist.get_world_size()} ranks over {backend}{extra}", flush=True)


def topology(tp, etp, ep):
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=etp)


def build(tp, etp, ep):
    """A 2-layer GPT, hidden 256, 8 routed experts (top-2) as Transformer Engine TEGroupedMLP."""
    from megatron.core.models.gpt import GPTModel, gpt_layer_specs
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
        moe_ffn_hidden_size=256, num_moe_experts=8, moe_router_topk=2,
        moe_grouped_gemm=True, moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none", tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, hidden_dropout=0.0,
        attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16, add_bias_linear=False,
        gradient_accumulation_fusion=False, gated_linear_unit=False,
        activation_func=torch.nn.functional.gelu)
    spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(8, moe_grouped_gemm=True)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=128,
                     max_sequence_length=16, share_embeddings_and_output_weights=False)
    return model.cuda().eval()


def forward(model, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 128, (2, 16), generator=g).cuda()
    positions = torch.arange(16).unsqueeze(0).expand(2, 16).cuda()
    mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1).view(1, 1, 16, 16).cuda()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return model(input_ids=tokens, position_ids=positions, attention_mask=mask)


def quantize(model, recipe):
    import copy
    import modelopt.torch.quantization as mtq

    mtq.quantize(model, copy.deepcopy(getattr(mtq, recipe)),
                 lambda m: [forward(m, 100 + i) for i in range(3)])


def save(model, ckpt):
    from megatron.core import dist_checkpointing
    from modelopt.torch.opt.plugins.mcore_dist_checkpointing import save_sharded_modelopt_state

    dist_checkpointing.save(model.sharded_state_dict(), ckpt)
    save_sharded_modelopt_state([model], ckpt)


def load(model, ckpt):
    """As Megatron-LM resumes: ModelOpt's state, dist_checkpointing.load, strict load_state_dict."""
    from megatron.core import dist_checkpointing
    from modelopt.torch.opt.plugins.mcore_dist_checkpointing import restore_sharded_modelopt_state

    restore_sharded_modelopt_state([model], ckpt)
    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), ckpt), strict=True)


def shared_dir(path, prefix):
    where = [path or (tempfile.mkdtemp(prefix=prefix) if dist.get_rank() == 0 else None)]
    dist.broadcast_object_list(where, src=0)
    return where[0]


def failing_key(text):
    found = re.search(r"key='([^']+)'", text) or re.search(r"for key (\S+)", text)
    return found.group(1) if found else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="NVFP4_AWQ_LITE_CFG",
                    choices=("NVFP4_AWQ_LITE_CFG", "W4A8_AWQ_BETA_CFG"))
    args = ap.parse_args()
    backend = init()
    ep = dist.get_world_size()
    if 8 % ep:
        finish(2, "REPRO: usage: the ranks must divide the 8 experts")
    versions(backend, f", recipe {args.recipe}, tp1-etp1-ep{ep}")
    topology(1, 1, ep)
    model = build(1, 1, ep)
    try:
        quantize(model, args.recipe)
    except AttributeError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        inner = [f for f in frames if "/modelopt/" in f.filename.replace("\\", "/")]
        at = f"{inner[-1].filename.split('/modelopt/')[-1]}:{inner[-1].lineno}" if inner else "?"
        print(f"rank {dist.get_rank()}: AttributeError: {exc} (raised from modelopt/{at})",
              file=sys.stderr, flush=True)
        owner = re.search(r"'(\w+)' object has no attribute '(\w+)'", str(exc))
        what = f"{owner.group(1)}.{owner.group(2)}" if owner else str(exc)[:120]
        finish(1, f"REPRO: defect present: AttributeError: {what} (modelopt/{at})")
    except Exception as exc:  # noqa: BLE001 - the verdict names what was raised
        traceback.print_exc()
        finish(2, f"REPRO: unexpected: {type(exc).__name__}: {str(exc)[:200]}")
    out = forward(model, 7)
    ok = [None] * dist.get_world_size()
    dist.all_gather_object(ok, bool(torch.isfinite(out).all()))
    if not all(ok):
        finish(1, "REPRO: defect present: non-finite logits after AWQ calibration")
    finish(0, f"REPRO: defect absent: {args.recipe} calibrated the grouped experts")


if __name__ == "__main__":
    main()
