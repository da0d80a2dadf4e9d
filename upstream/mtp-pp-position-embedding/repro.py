"""MTP at pipeline depth 2 with a learned absolute position embedding: megatron-core builds it,
then its own checkpoint validation refuses `embedding.position_embeddings.weight` (two main
replicas: the first stage's and the MTP stage's).

megatron-core only (Transformer Engine optional). Two ranks, pp 2:

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:0 repro.py
    ... repro.py --position-embedding none        # control: passes

Runs on CPU (gloo), on one GPU (gloo ranks sharing it) or on two GPUs (nccl).
Exit 1 and `REPRO: defect present: ...` when the save is refused on that key; exit 0 and
`REPRO: defect absent ...` when the save passes, or when megatron-core refuses the combination
when the model is built (the guard this report asks for).
"""
import argparse
import datetime
import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist

KEY = "embedding.position_embeddings.weight"


def init():
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    backend = "nccl" if cuda and torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    if not cuda:  # CPU only: megatron-core calls Tensor.cuda() (embedding sync at pp > 1,
        # language_module.py:307) and torch.cuda.synchronize() (torch_dist save): no-ops here
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"
    return cuda, backend


def finish(code, line):
    """Rank 0 prints the verdict; every rank leaves at once (a refused save leaves peers waiting
    in a collective: torchrun's exit code is then rank 0's)."""
    if dist.get_rank() == 0:
        print(line, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def build(position, cuda):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    try:
        import transformer_engine  # noqa: F401
        te = cuda
    except ImportError:
        te = False
    torch.manual_seed(1234)
    if cuda:
        model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
        pipeline_model_parallel_size=2, mtp_num_layers=1, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=cuda,
        params_dtype=torch.bfloat16 if cuda else torch.float32,
        pipeline_dtype=torch.bfloat16 if cuda else torch.float32,
        use_cpu_initialization=not cuda)
    spec = (specs.get_gpt_layer_with_transformer_engine_spec() if te
            else specs.get_gpt_layer_local_spec())
    mtp = specs.get_gpt_mtp_block_spec(config, spec, use_transformer_engine=te)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=128,
                     max_sequence_length=16, position_embedding_type=position,
                     share_embeddings_and_output_weights=False, mtp_block_spec=mtp,
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage())
    return (model.cuda() if cuda else model), te


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--position-embedding", default="learned_absolute",
                    choices=("learned_absolute", "none"))
    args = ap.parse_args()
    cuda, backend = init()
    if dist.get_world_size() != 2:
        finish(2, "REPRO: usage: run with --nproc-per-node 2 (pp 2)")
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.core import CheckpointingException

    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
    try:
        model, te = build(args.position_embedding, cuda)
    except (AssertionError, ValueError, NotImplementedError) as exc:
        text = str(exc)
        if "position" in text.lower() and "mtp" in text.lower():  # a guard at construction
            finish(0, f"REPRO: defect absent: refused when built: {type(exc).__name__}: {text}")
        raise
    if dist.get_rank() == 0:
        import megatron.core
        print(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, "
              f"backend {backend}, {'TE' if te else 'local'} spec, position embedding "
              f"{args.position_embedding}, pp 2, mtp_num_layers 1", flush=True)
    holders = [None] * dist.get_world_size()
    has_key = any(k.endswith(KEY) for k in model.state_dict())
    dist.all_gather_object(holders, has_key)
    if dist.get_rank() == 0:
        print(f"ranks holding {KEY}: {[r for r, h in enumerate(holders) if h]}", flush=True)
    where = [tempfile.mkdtemp(prefix="repro-mtp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    try:
        dist_checkpointing.save(model.sharded_state_dict(), where[0])
    except CheckpointingException as exc:
        text = str(exc)
        found = re.search(r"key='([^']+)'", text)
        key = found.group(1) if found else "?"
        print(f"rank {dist.get_rank()}: {type(exc).__module__}.{type(exc).__name__}: "
              f"{text[:600]}", file=sys.stderr, flush=True)
        finish(1, f"REPRO: defect present: {type(exc).__name__}: {key}")
    dist.barrier()
    finish(0, "REPRO: defect absent: the pp-2 save with MTP passed validation")


if __name__ == "__main__":
    main()
