"""The tiny MoE GPT under test, built from megatron-core's own layer specs.

Two backends, one per tier family:
- ``local``: megatron-core's local spec, ``SequentialMLP`` experts (cpu tier, no TE);
- ``te``: Transformer Engine spec with ``moe_grouped_gemm=True``, i.e. ``TEGroupedMLP`` -- the
  exact code path of the bug report (gpu-shared and gpu tiers).
Sizes are small so a cell runs in seconds; the checkpoint metadata shape (keys, per-expert
amax, replica ids) is what matters and does not depend on size. The Nemotron-3 modules (shared
experts, sigmoid router with expert bias, MTP, latent MoE, the hybrid Mamba model) are optional
``ModelSize`` fields, all off by default: harness/model/modules.py.

torch is imported by the functions that build or run the model, not here: ``ModelSize`` is read
by the controller's read-only commands (``verdict``, the gate), which then start in a fraction
of a second instead of paying torch's import (about 1 s).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from harness.tiers import Backend
from harness.topology.topology import Topology

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, repr=False)
class ModelSize:
    """The model a stage builds: its sizes, then the optional modules (harness/model/modules.py),
    named as megatron-core's TransformerConfig names them; a module field at its default is off."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    moe_ffn_hidden_size: int = 64
    num_experts: int = 8
    moe_router_topk: int = 2
    vocab_size: int = 128
    seq_length: int = 16
    micro_batch_size: int = 2
    # Optional modules, off by default (harness/model/modules.py).
    kind: str = "gpt"  # "gpt" (GPTModel) or "hybrid" (HybridModel, harness/model/hybrid.py)
    hybrid_layer_pattern: str | None = None  # kind "hybrid": megatron-core's layer symbols
    moe_shared_expert_intermediate_size: int | None = None
    moe_router_score_function: str = "softmax"
    moe_router_enable_expert_bias: bool = False
    mtp_num_layers: int | None = None
    moe_latent_size: int | None = None
    # None: the kind's own (KIND_POSITION_EMBEDDING); Nemotron-3 models have none
    # (harness/model/modules.py POSITION_EMBEDDINGS says why and which values).
    position_embedding_type: str | None = None

    def __post_init__(self):
        # The kind's own position embedding named explicitly is the same model: the same record,
        # repr and save id as when it is left out.
        if self.position_embedding_type == KIND_POSITION_EMBEDDING.get(self.kind):
            object.__setattr__(self, "position_embedding_type", None)

    @property
    def position_embedding(self) -> str:
        """The position embedding the model is built with (GPTModel / HybridModel's
        ``position_embedding_type``)."""
        return self.position_embedding_type or KIND_POSITION_EMBEDDING.get(self.kind, "learned_absolute")

    def as_dict(self) -> dict:
        """Every size, and only the modules that are on: a model without them gives the same
        dict (spec.json, golden manifests) as before the modules existed."""
        out = asdict(self)
        for f in fields(self):
            if f.name in MODULE_FIELDS and out[f.name] == f.default:
                del out[f.name]
        return out

    def record(self) -> dict:
        """What a cell record says of the model that ran (CellRecord.model): ``as_dict`` with
        its kind and its position embedding always named."""
        return {"kind": self.kind, **self.as_dict(), "position_embedding_type": self.position_embedding}

    def difference(self, recorded: dict) -> str | None:
        """One line naming how a recorded model (``record``'s dict) differs from this one, or
        None when it is this one. A record made before the position embedding was recorded built
        its kind's own (KIND_POSITION_EMBEDDING: the only one the harness built then)."""
        mine = self.record()
        if "position_embedding_type" not in recorded:
            kind = recorded.get("kind", "gpt")
            recorded = {**recorded, "position_embedding_type": KIND_POSITION_EMBEDDING.get(kind)}
        diff = [f"{k} {recorded.get(k, 'absent')} recorded, {mine.get(k, 'absent')} in the profile"
                for k in sorted(set(mine) | set(recorded)) if recorded.get(k) != mine.get(k)]
        return "; ".join(diff) or None

    def __repr__(self) -> str:  # the dataclass repr of ``as_dict``: save ids hash it (cells.py)
        return f"ModelSize({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


    def problems(self) -> list[str]:
        """What megatron-core (0.19.2, file:line under megatron/core/) refuses, or builds other
        than asked, of this size whatever the topology: one line each, checked before any rank
        starts. Rules that involve a parallel size: ``Topology.problems``."""
        out = []
        # transformer_config.py:1332 kv_channels = hidden_size // num_attention_heads: not
        # refused, floored, so the attention would be kv_channels * heads wide, not hidden_size.
        if self.hidden_size % self.num_attention_heads:
            out.append(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                       f"{self.num_attention_heads} (megatron-core floors kv_channels to "
                       f"{self.hidden_size // self.num_attention_heads}, an attention "
                       f"{self.hidden_size // self.num_attention_heads * self.num_attention_heads}"
                       " wide)")
        # transformer/moe/moe_utils.py:823 torch.topk(scores, k=topk) over num_experts scores.
        if self.moe_router_topk > self.num_experts:
            out.append(f"moe_router_topk {self.moe_router_topk} is more than num_experts "
                       f"{self.num_experts} (the router picks topk of num_experts)")
        # transformer_config.py:2328 ValueError: topk 1 needs pre-softmax routing; this model
        # routes with softmax after top-k and no load balancing (transformer_config below).
        if self.moe_router_topk == 1:
            out.append("moe_router_topk 1 is refused by megatron-core for a softmax router "
                       "without pre-softmax (use 2 or more)")
        return out


MODULE_FIELDS = ("kind", "hybrid_layer_pattern", "moe_shared_expert_intermediate_size",
                 "moe_router_score_function", "moe_router_enable_expert_bias", "mtp_num_layers",
                 "moe_latent_size", "position_embedding_type")
# The position embedding each kind builds unless the scenario says otherwise: the GPT model's
# learned absolute one, as the harness always built it (every committed golden and record); the
# hybrid model's none, HybridModel's default (megatron-core 0.19.2 models/hybrid/hybrid_model.py:
# 118-119), as harness/model/hybrid.py always built it.
KIND_POSITION_EMBEDDING = {"gpt": "learned_absolute", "hybrid": "none"}


CPU_SIZE = ModelSize()
GPU_SIZE = ModelSize(hidden_size=256, ffn_hidden_size=512, moe_ffn_hidden_size=256)


def default_size(backend: str) -> ModelSize:
    """The size a backend's scenarios build unless they say otherwise."""
    return CPU_SIZE if backend == Backend.LOCAL else GPU_SIZE
# Golden checkpoints are committed to git and travel with every GPU-host upload: half the GPU
# width keeps one at about 1.5 MB while every key, replica id and per-expert amax stays the same.
GOLDEN_SIZE = ModelSize(hidden_size=128, ffn_hidden_size=256, moe_ffn_hidden_size=128)


def transformer_config(topo: Topology, size: ModelSize, backend: str):
    import torch
    from megatron.core.transformer import TransformerConfig

    from harness.model import host_p2p, modules
    from harness.model.mcore_shims import shim_config_warnings

    shim_config_warnings()  # megatron-core 0.15.x only (NameError at EP > 1, TP > 1)
    on_gpu = torch.cuda.is_available()
    host_staged = topo.pp > 1 and host_p2p.needs_host_staging()
    if host_staged:
        host_p2p.install()
    return TransformerConfig(
        num_layers=size.num_layers,
        hidden_size=size.hidden_size,
        num_attention_heads=size.num_attention_heads,
        ffn_hidden_size=size.ffn_hidden_size,
        moe_ffn_hidden_size=size.moe_ffn_hidden_size,
        num_moe_experts=size.num_experts,
        moe_router_topk=size.moe_router_topk,
        moe_grouped_gemm=backend == Backend.TE,
        # allgather works over gloo and on CPU; alltoall needs uneven all_to_all_single.
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none",
        tensor_model_parallel_size=topo.tp,
        pipeline_model_parallel_size=topo.pp,
        expert_model_parallel_size=topo.ep,
        expert_tensor_parallel_size=topo.etp,
        sequence_parallel=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # bf16 on GPUs, as in the report; the local spec's torch norms stay fp32, so the cpu
        # tier (no Float16Module wrapper) runs in fp32.
        bf16=on_gpu,
        params_dtype=torch.bfloat16 if on_gpu else torch.float32,
        pipeline_dtype=torch.bfloat16 if on_gpu else torch.float32,
        use_cpu_initialization=not on_gpu,
        # gloo ranks on a GPU (tier gpu-shared): pipeline sends go through host memory.
        use_ring_exchange_p2p=host_staged,
        gradient_accumulation_fusion=False,
        add_bias_linear=False,
        gated_linear_unit=False,
        activation_func=torch.nn.functional.gelu,
        **modules.config_kwargs(size),  # the optional modules that are on; none by default
    )


def layer_spec(size: ModelSize, backend: str):
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if backend == Backend.TE:
        return specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=size.num_experts, moe_grouped_gemm=True
        )
    if backend == Backend.LOCAL:
        return specs.get_gpt_layer_local_spec(num_experts=size.num_experts, moe_grouped_gemm=False)
    raise ValueError(f"unknown model backend {backend!r}: expected 'local' or 'te'")


def build_gpt(topo: Topology, size: ModelSize, backend: str, seed: int = 1234):
    """Build the model for this rank; parallel_state must already be initialised for ``topo``."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    if torch.cuda.is_available():  # CPU init (use_cpu_initialization) needs no CUDA RNG tracker
        model_parallel_cuda_manual_seed(seed)
    config = transformer_config(topo, size, backend)
    stages = {"pre_process": ps.is_pipeline_first_stage(), "post_process": ps.is_pipeline_last_stage()}
    if size.kind == "hybrid":
        from harness.model.hybrid import build_hybrid

        model = build_hybrid(config, size, **stages)
    else:
        spec = layer_spec(size, backend)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=size.vocab_size,
            max_sequence_length=size.seq_length,
            share_embeddings_and_output_weights=False,
            # learned_absolute by default (the goldens'), none as Nemotron-3 (modules.py)
            position_embedding_type=size.position_embedding,
            **stages,
            **_mtp(config, spec, backend),
        )
    if torch.cuda.is_available():
        model = model.cuda()
    return model.eval()


def _mtp(config, spec, backend: str) -> dict:
    """GPTModel's MTP argument when mtp_num_layers is set, from megatron-core's own helper (the
    MTP layer is built like the decoder's last layer; None on stages other than the last)."""
    if not config.mtp_num_layers:
        return {}
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    return {"mtp_block_spec": get_gpt_mtp_block_spec(
        config, spec, use_transformer_engine=backend == Backend.TE)}


def sample_batch(size: ModelSize, seed: int, device) -> dict:
    """A seeded batch, identical on every rank (so every topology sees the same tokens)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b, s = size.micro_batch_size, size.seq_length
    tokens = torch.randint(0, size.vocab_size, (b, s), generator=g)
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
    # Explicit causal mask (True = masked): the local attention path needs it on CPU.
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
    return {
        "input_ids": tokens.to(device),
        "position_ids": position_ids.to(device),
        "attention_mask": mask.to(device),
    }


def forward(model, batch: dict, bf16_autocast: bool = True) -> torch.Tensor | None:
    """Eval forward without grad; on GPU under bf16 autocast, the role Megatron's Float16Module
    plays in training (TE modules refuse fp32 activations next to bf16 parameters).
    ``bf16_autocast=False``: a model converted to fp32 runs in fp32 (the noise-floor pass).

    With pipeline parallelism the batch goes through megatron-core's own schedule (forward
    only): each stage receives its input from the previous one, as in training. Returns the
    logits on the last pipeline stage, None on the others.

    With MTP layers the model still returns the main head's logits, which the harness compares:
    megatron-core runs the MTP block, then keeps only the first chunk of the hidden states for the
    output layer, the MTP chunks feeding only their loss (transformer/multi_token_prediction.py
    process_mtp_loss, :804-805: with no labels it derives them from input_ids, :810-816)."""
    import torch
    from megatron.core import parallel_state as ps

    with torch.no_grad(), _autocast(bf16_autocast):
        if ps.get_pipeline_model_parallel_world_size() == 1:
            return model(**batch)
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def step(data_iterator, m):
            out = m(**next(data_iterator))
            # Under autocast a stage's output is fp32; the next stage receives into a buffer of
            # the config's pipeline_dtype, so send that dtype (Float16Module's role in training).
            if not ps.is_pipeline_last_stage():
                out = out.to(m.config.pipeline_dtype)
            return out, None  # no loss: the schedule keeps the output

        b, s = batch["input_ids"].shape
        out = get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter([batch]), model=model,
            num_microbatches=1, seq_length=s, micro_batch_size=b, forward_only=True)
        return out[0] if ps.is_pipeline_last_stage() else None


def _autocast(on: bool = True):
    import contextlib

    import torch

    if on and torch.cuda.is_available():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
