"""The defects a (nvidia-modelopt, megatron-core) pair meets that are not the collision: megatron-core's
torch_dist format (a checkpoint without common.pt), a refusal on a tensor of the model (MTP's
position embedding), ModelOpt's static-block refusal at TP > 1, and ModelOpt's own restore (the
grouped post-restore's dry run). Each says where in the sources it was read; the pair's rules
(harness/check/versions.py) and the judge name them.
"""
from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from harness.model.recipes import PER_BLOCK, PER_CHANNEL
from harness.records import Stage
from moe_ckpt_fix.parts import UNLOADED_AMAX_PART
from moe_ckpt_fix.releases import MTP_EMBEDDING_READ, NEEDS_COMMON_PT


# megatron-core's torch_dist on-disk format. <= 0.16 writes common.pt and cannot read a checkpoint
# without it (0.16.1 dist_checkpointing/strategies/common.py:83-98: load_common raises
# FileNotFoundError, and its own error path then fails on the str path: AttributeError "'str'
# object has no attribute 'iterdir'"; 0.15.3 the same). 0.19.2 keeps non-tensor state inside DCP
# and writes no common.pt (0.19.2 strategies/common.py:41-44: load_common "is deprecated ...
# torch_dist now handles all non-tensor data as part of default PyTorch DCP"). Checked on the
# H200: every golden (written by 0.19.2) refused by 0.15.3 and 0.16.1 that way
# (docs/runs/20261204-0203-pairs.md). Releases between 0.16.1 and 0.19.2 were not read.
# NEEDS_COMMON_PT (moe_ckpt_fix/releases.py): the releases that need it.


def in_band(band: str, mcore: str) -> bool:
    """Whether megatron-core ``mcore`` is in ``band``: PEP 440 specifiers, "||" between
    alternatives; an empty band holds nothing."""
    return any(SpecifierSet(alt.strip(), prereleases=True).contains(mcore)
               for alt in band.split("||") if alt.strip())
COMMON_PT = "common.pt"


def common_pt_problem(ckpt_dir, mcore: str | None, shown=None) -> str | None:
    """Why megatron-core ``mcore`` cannot read the torch_dist checkpoint at ``ckpt_dir`` (it has
    no common.pt and this megatron-core needs one), or None; ``shown``: the path to print."""
    from pathlib import Path

    try:
        needs = in_band(NEEDS_COMMON_PT, mcore or "")
    except InvalidVersion:
        return None
    if not needs or (Path(ckpt_dir) / COMMON_PT).is_file():
        return None
    return (f"{shown or ckpt_dir}: no {COMMON_PT}: megatron-core {mcore} reads only torch_dist checkpoints "
            f"that have one (written by megatron-core <= 0.16); this one was written by a newer "
            f"megatron-core (0.19.2 keeps non-tensor state inside DCP): load it with the "
            "megatron-core that wrote it")



# ModelOpt's refusal to calibrate static NVFP4 blocks with the module's TP group > 1.
STATIC_REFUSAL = ("NotImplementedError: Static-block NVFP4 weight quantization (e.g. MSE) is not "
                   "supported with TP > 1")


@dataclass(frozen=True)
class ModelDefect:
    """A refusal of megatron-core's own, on a tensor of the model rather than a quantizer's: what
    a checkpoint of that model meets at a topology whatever the nvidia-modelopt. Judged as a known
    refusal (``Expected.MTP_EMBEDDING_REFUSED`` -> ``known-refusal``) where its release band was
    read, as ``rule-unknown`` on another megatron-core; never as the collision."""

    label: str
    mcore: str  # PEP 440 band of the megatron-core releases whose sources were read
    exception: str  # the exception type's name
    text: str  # what its message says
    key: str  # the checkpoint key it names
    source: str
    finding: str  # the record's reason when it is seen where predicted
    checked_on: str = ""

    def reached(self, mtp_num_layers: int | None, position_embedding: str | None, topo) -> bool:
        """Whether a model with these modules meets it at ``topo`` (a save or a load)."""
        return bool(mtp_num_layers) and position_embedding == "learned_absolute" and topo.pp > 1


# MTP at pipeline depth > 1 with a learned absolute position embedding. Read in
# megatron-core 0.19.2 (paths under megatron/core/): without a pipeline layout the MTP block sits
# on the last stage (transformer/multi_token_prediction.py:651-656), which at pp > 1 is not the
# first; GPTModel builds that stage its own LanguageModelEmbedding (models/gpt/gpt_model.py:
# 167-175; HybridModel the same, models/hybrid/hybrid_model.py:234-242), whose learned absolute
# position embedding is a torch.nn.Embedding (models/common/embeddings/language_model_embedding.py:
# 44, :66-69). LanguageModule.sharded_state_dict ties only the word embedding of the MTP stage to
# the first stage's (models/common/language_module/language_module.py:441-449: replica id (1, 0,
# dp) from transformer/multi_token_prediction.py:85-99); the position embedding keeps the default
# replica id (0, tp rank, dp rank) of make_sharded_tensor_for_checkpoint (utils.py:1149-1150,
# through transformer/utils.py:182-188) on both stages, so the key has two main replicas and
# validate_sharding_integrity refuses it (dist_checkpointing/validation.py:437-443, raised at
# :401-403). Nor does setup_embeddings_and_output_layer sync it (language_module.py:300-308 all-
# reduces the word embedding only): the MTP stage's copy keeps its own initialisation. Nemotron-3
# models have no learned position embedding (harness/model/modules.py): the jobs never meet it.
MTP_POSITION_EMBEDDING = ModelDefect(
    label="MTP at pp > 1 with a learned absolute position embedding",
    mcore=MTP_EMBEDDING_READ,
    exception="CheckpointingException",
    text="Invalid access pattern",
    key="embedding.position_embeddings.weight",
    source=("megatron-core 0.19.2 models/common/language_module/language_module.py:441-449 ties "
            "only embedding.word_embeddings.weight of the MTP stage's own LanguageModelEmbedding "
            "(models/gpt/gpt_model.py:167-175) to the first stage's; its learned absolute "
            "embedding.position_embeddings.weight keeps replica id (0, tp, dp) on both stages: two "
            "main replicas, refused by dist_checkpointing/validation.py:437-443"),
    finding=("megatron-core 0.19.2 refuses embedding.position_embeddings.weight at pp > 1 with "
             "MTP: the MTP stage's own learned absolute position embedding is a second main "
             "replica (models/common/language_module/language_module.py:441-449 ties only the "
             "word embedding); a defect of megatron-core, not the collision; Nemotron-3 models "
             "have no learned position embedding"),
)
MODEL_DEFECTS = (MTP_POSITION_EMBEDDING,)


def model_defect(mtp_num_layers: int | None, position_embedding: str | None, save,
                 load) -> tuple[ModelDefect, str] | None:
    """The model defect a cell's save or load meets, and the stage that meets it first (save,
    then load), or None, whatever the megatron-core: the caller decides what a release outside
    its band gets (``defect_covers``)."""
    for defect in MODEL_DEFECTS:
        for stage, topo in ((Stage.SAVE, save), (Stage.LOAD, load)):
            if topo is not None and defect.reached(mtp_num_layers, position_embedding, topo):
                return defect, stage
    return None


def defect_covers(defect: ModelDefect, mcore: str | None) -> bool:
    try:
        return in_band(defect.mcore, mcore or "")
    except InvalidVersion:
        return False


@dataclass(frozen=True)
class RestoreDefect:
    """A defect of nvidia-modelopt's own restore, met by every stage that restores its state (the
    load stages, and the save stage's reference reload) with an amax kind it reaches: not the
    collision, not a property of the checkpoint. It is nondeterministic where it reads memory
    nothing initialised, so a stage may pass: expected ``Expected.RESTORE_DRY_RUN`` ("passes, or
    dies of it"), judged ``known-refusal`` on its own words (``texts``), and by the expectation
    behind it where it did not fire."""

    label: str
    texts: tuple[str, ...]  # what the stage's first failure says when it is this defect
    source: str
    finding: str  # the record's reason when it is seen where predicted
    checked_on: str = ""

    def seen(self, message: str | None) -> bool:
        return any(t in (message or "") for t in self.texts)


# ModelOpt's grouped post-restore dry run on amax that torch.empty made (the
# fix's part (g), moe_ckpt_fix/unloaded_amax.py). Read in nvidia-modelopt 0.47.0 and 0.48.0rc1
# (paths under modelopt/torch/): the restore makes each quantizer buffer with torch.empty
# (quantization/nn/modules/tensor_quantizer.py _reset_pytorch_state_from_metadata, 0.47.0 :1361,
# 0.48.0rc1 :1364); the checkpoint's values load only afterwards (megatron-core's
# dist_checkpointing.load). Before that, _QuantTEGroupedLinear.modelopt_post_restore
# (quantization/plugins/transformer_engine.py:173-233, both releases) runs each expert's weight
# quantizer on its weight (wq_i(weight_i), :207) for every member that still has an _amax, and
# re-raises any error that is not a shape mismatch (a "device-side" one included). Integer fake
# quantization asserts amax >= 0 on the device (kernels/quantization/gemm/tensor_quant_gpu.cu:44
# CUDA_KERNEL_ASSERT(amax >= 0); without the CUDA extension quantization/tensor_quant.py 0.47.0
# :618-620, 0.48.0rc1 :631-633 raise ValueError "Negative values in amax"): uninitialised memory
# holding a negative value or a NaN ends the stage with a device-side assert, reported by the next
# synchronising call (the GPU run showed it in _ParallelLinear.modelopt_post_restore through
# calib/max.py). The members keep an _amax there where the reset passes GroupedQuantizer by:
# 0.48.0rc1 itself (quantization/plugins/custom.py:180-186), and 0.47.0 under the fix's part (b)
# (EXPERT_AMAX_PART, which mirrors it); unpatched 0.47.0 resets every member and re-calibrates
# member 0 first (custom.py:177-181), so only expert 0 has an _amax, a calibrated one. The fix's
# part (g) (UNLOADED_AMAX_PART) sets every negative or NaN entry to 0 before the dry run. Routed
# experts only (the grouped linear's dry run); dense linears re-calibrate from their weight first.
RESTORE_DRY_RUN = RestoreDefect(
    label="the grouped post-restore's dry run on expert amax not yet loaded",
    texts=("device-side assert", "Negative values in amax"),
    source=("nvidia-modelopt 0.47.0 / 0.48.0rc1 quantization/plugins/transformer_engine.py:173-233 "
            "(_QuantTEGroupedLinear.modelopt_post_restore: wq_i(weight_i) at :207 on the _amax "
            "torch.empty made, nn/modules/tensor_quantizer.py 0.47.0 :1361, 0.48.0rc1 :1364, before "
            "the checkpoint's values load); kernels/quantization/gemm/tensor_quant_gpu.cu:44 asserts "
            "amax >= 0 (tensor_quant.py 0.48.0rc1 :631-633 without the extension: 'Negative values "
            "in amax'); reached where members keep their amax through the reset: 0.48.0rc1 "
            "plugins/custom.py:180-186, 0.47.0 with the fix's part (b); fixed by part (g) "
            "(moe_ckpt_fix/unloaded_amax.py)"),
    finding=("nvidia-modelopt's _QuantTEGroupedLinear.modelopt_post_restore "
             "(plugins/transformer_engine.py:173-233) dry-runs each expert's integer weight "
             "quantizer on the _amax torch.empty made before the checkpoint's values load; the "
             "CUDA kernel asserts amax >= 0 (kernels/quantization/gemm/tensor_quant_gpu.cu:44), so "
             "uninitialised memory ends the restore with a device-side assert (nondeterministic); "
             "a defect of ModelOpt's, not the collision; the fix's part (g) "
             f"({UNLOADED_AMAX_PART}) removes it"),
)
# The routed experts' amax kinds integer fake quantization handles (the kernel's amax >= 0 assert).
DRY_RUN_KINDS = (PER_CHANNEL, PER_BLOCK)
