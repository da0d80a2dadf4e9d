"""The hybrid Mamba/attention MoE model of Nemotron-3 (``[model] kind = "hybrid"``).

Why: the quarantined Nemotron-3 jobs checkpoint a HybridModel, not a GPTModel; its layers come
from a pattern string of megatron-core's symbols (harness/model/modules.py). It is built as
Megatron-LM's ModelOpt flows build it: megatron-core's HybridModel with the stack spec of
megatron-core's post-training module (post_training/modelopt/hybrid/model_specs.py), here its
full Transformer Engine variant with TEGroupedMLP experts, the code path of the report. TE only
(HybridStack imports it) and, with Mamba layers, mamba-ssm: harness/machine.py skips a
hybrid cell where they are missing. Mamba dimensions stay at megatron-core's defaults
(harness/topology/topology.py ``MAMBA_*``).
"""
from __future__ import annotations


def stack_spec():
    from megatron.core.post_training.modelopt.hybrid.model_specs import (
        get_hybrid_stack_modelopt_spec,
    )

    # use_default_te_spec: TE linears and norms; moe_grouped_gemm: TEGroupedMLP experts
    # (model_specs.py:67-98), as backend "te" builds the GPT model's experts.
    return get_hybrid_stack_modelopt_spec(use_default_te_spec=True, moe_grouped_gemm=True)


def build_hybrid(config, size, pre_process: bool, post_process: bool):
    """This rank's HybridModel; its MTP depths come from the pattern (after "/")."""
    from megatron.core.models.hybrid.hybrid_model import HybridModel

    return HybridModel(
        config=config,
        hybrid_stack_spec=stack_spec(),
        vocab_size=size.vocab_size,
        max_sequence_length=size.seq_length,
        hybrid_layer_pattern=size.hybrid_layer_pattern,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=False,
        # none unless the scenario says otherwise: HybridModel's default (hybrid_model.py:118-119)
        position_embedding_type=size.position_embedding,
    )
