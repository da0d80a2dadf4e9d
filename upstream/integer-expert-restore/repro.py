"""nvidia-modelopt 0.48.0rc1: the restore of INT8 per-channel / INT4 per-block routed experts
(Transformer Engine grouped linears) dies of a CUDA device-side assert: the grouped linear's
post-restore dry run (`_QuantTEGroupedLinear.modelopt_post_restore`) fake-quantizes each expert
weight with an `_amax` that `torch.empty` made and nothing has loaded yet.

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:0 repro.py \
        [--recipe INT8_WEIGHT_ONLY_CFG|INT4_BLOCKWISE_WEIGHT_ONLY_CFG]

Save at tp1-etp1-ep2, then load at the same topology into a fresh model the way Megatron-LM
resumes. What uninitialised memory holds is up to the allocator; to make the run deterministic
the load runs under torch's own `use_deterministic_algorithms(True, warn_only=True)`, whose
`torch.utils.deterministic.fill_uninitialized_memory` fills `torch.empty` with NaN.
Exit 1 + `REPRO: defect present: ...` on the assert; exit 0 + `REPRO: defect absent ...` when
every expert amax loads equal to the saved one; exit 2 on anything else.
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


def amax_of(model):
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()
            if "weight_quantizer" in k and k.endswith("_amax") and torch.is_tensor(v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="INT8_WEIGHT_ONLY_CFG",
                    choices=("INT8_WEIGHT_ONLY_CFG", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG"))
    ap.add_argument("--no-fill", action="store_true",
                    help="leave torch.empty as the allocator hands it (nondeterministic)")
    args = ap.parse_args()
    backend = init()
    ep = dist.get_world_size()
    versions(backend, f", recipe {args.recipe}, tp1-etp1-ep{ep}")
    topology(1, 1, ep)
    saved = build(1, 1, ep)
    quantize(saved, args.recipe)
    want = amax_of(saved)
    ckpt = shared_dir(None, "repro-int-")
    save(saved, ckpt)
    dist.barrier()
    model = build(1, 1, ep)
    if not args.no_fill:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        load(model, ckpt)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the verdict names what was raised
        text = " ".join(str(exc).split())
        print(f"rank {dist.get_rank()}: {type(exc).__module__}.{type(exc).__name__}: "
              f"{text[:400]}", file=sys.stderr, flush=True)
        if "device-side assert" in text or "Negative values in amax" in text:
            where = [f.name for f in traceback.extract_tb(exc.__traceback__)][-4:]
            finish(1, f"REPRO: defect present: {type(exc).__name__}: "
                      f"{text.split(' Search for')[0][:80]} (in {' < '.join(reversed(where))})")
        traceback.print_exc()
        finish(2, f"REPRO: unexpected: {type(exc).__name__}: {text[:200]}")
    torch.use_deterministic_algorithms(False)
    got = amax_of(model)
    bad = sorted(set(want) ^ set(got)) or [k for k in sorted(want) if not torch.equal(want[k], got[k])]
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bad[:1])
    bad = [b for f in flags for b in f]
    if bad:
        finish(1, f"REPRO: defect present: expert amax not restored: {bad[0]}")
    finish(0, f"REPRO: defect absent: {len(want)} weight amax per rank loaded as saved")


if __name__ == "__main__":
    main()
