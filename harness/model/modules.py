"""The Nemotron-3 modules a scenario can switch on as ``[model]`` keys, all off by default.

Why: the two quarantined jobs (scenarios/quarantine.toml) run Nemotron-3 models: hybrid
Mamba/attention MoE with shared experts, latent MoE projections, a sigmoid router with expert
bias and MTP layers, where the harness's default model is a plain GPT MoE. Each module is one
``ModelSize`` field (harness/model/gpt.py) named as megatron-core's TransformerConfig names it.
This module says which values a scenario may give them (harness/scenario/schema.py reads these),
what megatron-core 0.19.2 requires of them at any topology (the per-topology rules are
harness/topology/topology.py ``module_problems``), what each needs beyond the stack, and the
router state a trained model holds. Source paths below are under megatron/core/.

| field | module | backend local (cpu tier) | backend te |
| --- | --- | --- | --- |
| moe_shared_expert_intermediate_size | shared expert MLP beside the routed experts | yes | yes |
| moe_router_score_function, moe_router_enable_expert_bias | sigmoid router, expert_bias buffer | yes | yes |
| mtp_num_layers | MTP block on the last pipeline stage | yes (loads at pp > 1 too) | yes |
| moe_latent_size | latent projections around the experts | no: TELinear | yes |
| kind = "hybrid", hybrid_layer_pattern | HybridModel (harness/model/hybrid.py) | no: TE | yes, with mamba-ssm |
| position_embedding_type | the learned absolute position embedding, or none | yes | yes |

The position embedding: the GPT model has megatron-core's learned absolute one unless the scenario
says ``"none"`` (the committed goldens and plain scenarios keep it); Nemotron-3 models have none
(megatron-core's HybridModel default, models/hybrid/hybrid_model.py:118-119, "Mamba with no
attention has no need for position embeddings"; Megatron-Bridge's NemotronHModelProvider keeps its
MambaModelProvider base's ``position_embedding_type = "none"``). It matters with MTP at pp > 1: the
MTP stage builds its own LanguageModelEmbedding (models/gpt/gpt_model.py:167-175) and ties only its
word embedding to the first stage's (models/common/language_module/language_module.py:441-449),
so a learned absolute ``embedding.position_embeddings.weight`` has two main replicas
(harness/check/versions.py MTP_POSITION_EMBEDDING).
"""
from __future__ import annotations

import zlib
from dataclasses import fields

from harness.tiers import Backend
from harness.topology.topology import MAMBA_EXPAND, MAMBA_HEAD_DIM, MAMBA_NUM_GROUPS, mamba_heads

KINDS = ("gpt", "hybrid")
SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")  # transformer/transformer_config.py:787
EXPERT_BIAS_SCORES = ("sigmoid", "sqrtsoftplus")  # transformer/transformer_config.py:2284-2292
# What a scenario may give position_embedding_type: two of the values GPTModel takes
# (models/gpt/gpt_model.py:105-107) and HybridModel takes (hybrid_model.py:119). Not the rotary
# ones (rope, mrope, yarn): the harness's forward passes no rotary arguments, and
# RotaryEmbedding moves its frequencies to torch.cuda.current_device() on a forward
# (models/common/embeddings/rotary_pos_embedding.py:162), which the cpu tier has not.
LEARNED_ABSOLUTE, NO_POSITION_EMBEDDING = "learned_absolute", "none"
POSITION_EMBEDDINGS = (LEARNED_ABSOLUTE, NO_POSITION_EMBEDDING)
# The layer symbols of models/hybrid/hybrid_layer_allocation.py:17-25 that Nemotron-3 uses:
# M Mamba, * attention, - MLP, E MoE; "|" ends a pipeline stage, "/" starts an MTP depth.
HYBRID_PATTERN_RE = r"^[-M*E|]+(?:/[-M*E]+)*$"
HYBRID_PATTERN_RULE = ("a layer pattern of megatron-core's symbols M (Mamba), * (attention), "
                       "- (MLP), E (MoE), | (end of a pipeline stage), / (an MTP depth)")
EXPERT_BIAS_SCALE = 0.05  # of the seeded expert_bias; sigmoid scores lie in (0, 1)
# The module fields that are TransformerConfig fields of the same name.
CONFIG_FIELDS = ("moe_shared_expert_intermediate_size", "moe_router_score_function",
                 "moe_router_enable_expert_bias", "mtp_num_layers", "moe_latent_size")


def split_pattern(pattern: str) -> tuple[str, list[str]]:
    """``"M*E|ME/*E"`` -> main ``"M*E|ME"`` and MTP depths ``["*E"]`` (hybrid_layer_allocation.py
    parse_hybrid_pattern, :200-275)."""
    main, *depths = pattern.split("/")
    return main, depths


def problems(size, backend: str) -> list[str]:
    """Every rule of megatron-core an optional module breaks whatever the topology, one line each
    in the words of a scenario file (``model.<key>: ...``)."""
    out = []
    score = size.moe_router_score_function
    if size.moe_router_enable_expert_bias and score not in EXPERT_BIAS_SCORES:
        out.append(f"model.moe_router_enable_expert_bias: true needs moe_router_score_function "
                   f"'sigmoid' or 'sqrtsoftplus', got {score!r} "
                   "(megatron-core transformer/transformer_config.py:2284)")
    if size.moe_latent_size and backend != Backend.TE:
        out.append("model.moe_latent_size: needs backend 'te': megatron-core builds the latent "
                   "projections as Transformer Engine TELinear (transformer/moe/moe_layer.py:266)")
    if size.kind == "hybrid":
        out += _hybrid_problems(size, backend)
    elif size.hybrid_layer_pattern is not None:
        out.append('model.hybrid_layer_pattern: only with kind = "hybrid"')
    return out


def _hybrid_problems(size, backend: str) -> list[str]:
    out = []
    if backend != Backend.TE:
        out.append("model.kind: 'hybrid' needs backend 'te': megatron-core's HybridStack builds its "
                   "norms with Transformer Engine (models/hybrid/hybrid_block.py:19)")
    pattern = size.hybrid_layer_pattern
    if pattern is None:
        return out + ["model.hybrid_layer_pattern: required with kind = 'hybrid'"]
    main, depths = split_pattern(pattern)
    layers = main.replace("|", "")
    if "" in main.split("|"):
        out.append(f"model.hybrid_layer_pattern: {pattern!r} has an empty pipeline stage ('|')")
    if len(layers) != size.num_layers:
        out.append(f"model.num_layers: {size.num_layers}, but hybrid_layer_pattern {pattern!r} has "
                   f"{len(layers)} layers: they must agree (megatron-core counts the layers so: "
                   "models/hybrid/hybrid_layer_allocation.py:128-142)")
    if "E" not in layers:
        out.append(f"model.hybrid_layer_pattern: {pattern!r} has no MoE layer 'E' (the harness "
                   "checks expert state)")
    if len(set(depths)) > 1:
        out.append(f"model.hybrid_layer_pattern: {pattern!r}: every MTP depth must be the same "
                   "pattern (models/hybrid/hybrid_layer_allocation.py:260-266)")
    if len(depths) != (size.mtp_num_layers or 0):
        out.append(f"model.mtp_num_layers: {size.mtp_num_layers}, but hybrid_layer_pattern "
                   f"{pattern!r} has {len(depths)} MTP depths ('/'): megatron-core builds the MTP "
                   "block only when both say so (models/hybrid/hybrid_model.py:215-227)")
    heads = mamba_heads(size.hidden_size)
    if "M" in layers and (size.hidden_size * MAMBA_EXPAND % MAMBA_HEAD_DIM
                          or heads % MAMBA_NUM_GROUPS):
        out.append(f"model.hidden_size: {size.hidden_size} gives {heads} Mamba heads (hidden_size "
                   f"* {MAMBA_EXPAND} / {MAMBA_HEAD_DIM}); they must fill the {MAMBA_NUM_GROUPS} "
                   "Mamba groups evenly: a multiple of 256 (ssm/mamba_mixer.py:248 and :272)")
    return out


def packages_needed(size) -> list[tuple[str, str, str]]:
    """(import name, package, why) of each package the model's modules need beyond the stack;
    harness/machine.py turns a missing one into the cell's skip reason."""
    if size.kind != "hybrid" or "M" not in split_pattern(size.hybrid_layer_pattern or "")[0]:
        return []
    return [("mamba_ssm", "mamba-ssm", "megatron-core's Mamba layers run its kernels "
             "(megatron/core/ssm/mamba_mixer.py:202-206; requirements/mamba.txt, which the "
             "docker image installs)"),
            ("einops", "einops", "megatron-core's Mamba layers reshape with it "
             "(megatron/core/ssm/mamba_mixer.py:207-208)")]


def megatron_files_needed(size) -> list[tuple[str, str]]:
    """(file under megatron/core/, why) of each megatron-core module the model's modules build
    from; harness/machine.py turns a release without it into the cell's skip reason (megatron-core
    0.16.1 has MambaModel under models/mamba/, no HybridModel: a hybrid cell there would fail
    deep in its stage with a ModuleNotFoundError instead)."""
    if size.kind != "hybrid":
        return []
    why = "model.kind 'hybrid' builds it (harness/model/hybrid.py)"
    return [("models/hybrid/hybrid_model.py", f"HybridModel: {why}"),
            ("post_training/modelopt/hybrid/model_specs.py", f"the hybrid post-training spec: {why}")]


def config_kwargs(size) -> dict:
    """TransformerConfig arguments of the modules that are on (none when all are off, so the
    default model's config is built exactly as before). moe_router_load_balancing_type stays
    "none": megatron-core 0.19.2 asks nothing more of expert bias than its score function
    (transformer/transformer_config.py:2284); the bias itself is updated only by training."""
    default = {f.name: f.default for f in fields(size)}
    out = {k: getattr(size, k) for k in CONFIG_FIELDS if getattr(size, k) != default[k]}
    if size.kind == "hybrid":
        out["is_hybrid_model"] = True
    return out


def router_key(name: str, router) -> str:
    """A router's name that is the same at every topology: ``layer<global layer number>``. An
    MTP layer numbers its inner layers from 1 again (transformer/multi_token_prediction.py:
    1036-1043), so its routers go by their module path from ``mtp`` on (the MTP block sits whole
    on the last pipeline stage)."""
    parts = name.split(".")
    if "mtp" in parts:
        return ".".join(parts[parts.index("mtp"):])
    number = getattr(router, "layer_number", None)
    return f"layer{number}" if number else name


def seed_expert_bias(model, seed: int) -> int:
    """Give every router's ``expert_bias`` the non-zero values training leaves; returns how many.

    megatron-core changes the buffer only in training's gradient finalization
    (distributed/finalize_model_grads.py:363, moe_utils.get_updated_expert_bias), so a freshly
    built model holds zeros and a load that skipped it would look restored. The values come from
    the router's topology-independent key, so every rank holding a replica holds the same."""
    import torch

    from megatron.core.transformer.moe.router import Router

    seeded = 0
    with torch.no_grad():
        for name, mod in model.named_modules():
            bias = getattr(mod, "expert_bias", None) if isinstance(mod, Router) else None
            if bias is None:
                continue
            g = torch.Generator().manual_seed(seed + zlib.crc32(router_key(name, mod).encode()))
            bias.copy_(torch.randn(bias.shape, generator=g) * EXPERT_BIAS_SCALE)
            seeded += 1
    return seeded
