"""Static NVFP4 expert weights across expert TP: a checkpoint of routed experts quantized with a
static NVFP4 recipe (per-block `_amax` + `_global_amax`, here NVFP4_FOUR_OVER_SIX_CFG) saved at
expert TP 1 is refused at expert TP 2 ("Global shape mismatch ... weight_quantizer._amax"), and
ModelOpt refuses to calibrate it at expert TP 2 at all.

Two ranks, tp 1; expert TP 1 is ep 2, expert TP 2 is ep 1:
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:0 repro.py
      # save at ETP 1, load at ETP 2, re-save there, compare both checkpoints bit for bit
    repro.py --stage save --save-etp 2 --ckpt DIR   # one half of a format check: save only
    repro.py --stage load --load-etp 1 --ckpt DIR   # the other half (another ModelOpt build)

Exit 1 + `REPRO: defect present: <exception>: <key>` on the refusal (or a re-saved checkpoint
that differs); exit 0 + `REPRO: defect absent ...` when the load and the re-save are bit-exact
(with the change in modelopt.diff beside this file); exit 2 on anything else.
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
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not Exception

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


RECIPE = "NVFP4_FOUR_OVER_SIX_CFG"


def stage_save(etp, ckpt):
    topology(1, etp, 2 // etp)
    model = build(1, etp, 2 // etp)
    try:
        quantize(model, RECIPE)
    except NotImplementedError as exc:  # _check_nvfp4_static_tp_supported
        print(f"rank {dist.get_rank()}: NotImplementedError: {exc}", file=sys.stderr)
        finish(1, f"REPRO: defect present: NotImplementedError: static NVFP4 calibration "
                  f"refused at expert TP {etp}")
    save(model, ckpt)


def stage_load(etp, ckpt):
    """Load at ``etp``, save again there, and compare every tensor of both checkpoints."""
    from megatron.core.dist_checkpointing import load_plain_tensors

    topology(1, etp, 2 // etp)
    model = build(1, etp, 2 // etp)
    load(model, ckpt)
    again = shared_dir(None, "repro-static-resave-")
    save(model, again)
    dist.barrier()
    first, second = load_plain_tensors(ckpt), load_plain_tensors(again)
    bad = sorted(set(first) ^ set(second)) or [
        k for k in sorted(first) if not torch.equal(first[k].cpu(), second[k].cpu())]
    return (bad[0] if bad else None), sum(k.endswith("weight_quantizer._amax") for k in first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("both", "save", "load"), default="both")
    ap.add_argument("--save-etp", type=int, choices=(1, 2), default=1)
    ap.add_argument("--load-etp", type=int, choices=(1, 2), default=2)
    ap.add_argument("--ckpt", help="checkpoint directory (--stage save/load); default a temp dir")
    args = ap.parse_args()
    backend = init()
    if dist.get_world_size() != 2:
        finish(2, "REPRO: usage: run with --nproc-per-node 2")
    versions(backend, f", recipe {RECIPE}, stage {args.stage}")
    ckpt = shared_dir(args.ckpt, "repro-static-")
    os.makedirs(ckpt, exist_ok=True)
    try:
        if args.stage in ("both", "save"):
            stage_save(args.save_etp, ckpt)
            if args.stage == "save":
                dist.barrier()
                finish(0, f"REPRO: saved at expert TP {args.save_etp}: {ckpt}")
        bad, amax = stage_load(args.load_etp, ckpt)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - the verdict names it
        text = str(exc)
        print(f"rank {dist.get_rank()}: {type(exc).__name__}: {text[-1500:]}", file=sys.stderr)
        if "Global shape mismatch" in text or "Invalid access pattern" in text:
            inner = re.search(r"(\w+Exception): (Global shape mismatch|Invalid)", text)
            name = inner.group(1) if inner else type(exc).__name__
            finish(1, f"REPRO: defect present: {name}: {failing_key(text)}")
        traceback.print_exc()
        finish(2, f"REPRO: unexpected: {type(exc).__name__}: {text[:200]}")
    if bad:
        finish(1, f"REPRO: defect present: not bit-exact after the reshard: {bad}")
    finish(0, f"REPRO: defect absent: expert TP {args.save_etp} -> {args.load_etp} loaded, "
              f"re-saved bit-exact ({amax} expert block amax)")


if __name__ == "__main__":
    main()
