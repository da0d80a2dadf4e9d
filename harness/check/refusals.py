"""What a stage's first failure is, by its own words: the collision (the report's bug), a
refusal of an amax, a shape refusal at another expert TP. Pure predicates over a StageCause;
the judge (judge.py) decides what each means for a cell."""
from __future__ import annotations

import re

from harness.check.keys import WEIGHT_AMAX
from harness.model.recipes import EXPERTS, KIND_TENSORS, SCALAR, STATIC_BLOCK
from harness.records import StageCause


# The report's failure: megatron-core's validation refuses the per-expert amax access pattern.
BUG_EXCEPTION = "CheckpointingException"
BUG_TEXT = "Invalid access pattern"


# megatron-core < 0.16 with ModelOpt 0.47.0: the shared input amax of a grouped expert linear
# collides instead (harness/check/versions.py, rule "0.47.0 + mcore 0.15").
SHARED_EXPERT_AMAX = re.compile(r"mlp\.experts\.experts\.linear_fc\d\.input_quantizer\._amax")


def expert_tensors(kinds: dict | None) -> tuple[str, ...]:
    """The checkpoint tensors the routed experts' weight quantizers hold, by their recorded or
    forecast kinds (each its own sharded tensor: a static kind's ``_global_amax`` beside its
    block ``_amax``); unknown kinds: the scalar ``_amax``."""
    names = {t for kind in (kinds or {}).get(EXPERTS, ()) for t in KIND_TENSORS.get(kind, ())}
    return tuple(sorted(names)) or KIND_TENSORS[SCALAR]


def is_bug(cause: StageCause | None, behaviour=None,
           tensors: tuple[str, ...] = KIND_TENSORS[STATIC_BLOCK]) -> bool:
    """The failure the pair's rule predicts: by default the report's (validation on a per-expert
    weight-quantizer tensor of the experts' kinds, ``tensors``: by default either of a static
    kind's, the widest); a pair that cannot save predicts
    its exception; a pair whose shared expert amax collides predicts that key, and no other."""
    if not cause:
        return False
    if behaviour is not None and behaviour.cannot_save:
        exc, _, text = behaviour.cannot_save.partition(": ")
        return (cause.exc_type or "").endswith(exc) and text in (cause.message or "")
    if not ((cause.exc_type or "").endswith(BUG_EXCEPTION) and BUG_TEXT in (cause.message or "")):
        return False
    if behaviour is not None and behaviour.shared_rule == "expert-tp-dense-dp":
        return bool(SHARED_EXPERT_AMAX.search(cause.key or ""))
    key = cause.key or ""
    return bool(WEIGHT_AMAX.search(key)) and any(key.endswith(f"weight_quantizer.{t}") for t in tensors)


def is_amax_refusal(cause: StageCause | None) -> bool:
    """An unpatched golden load refused by megatron-core on a quantizer amax (its validation, or a
    missing key): what "not-restored" predicts. Any other exception (a format the installed
    megatron-core cannot read, a harness error) is not the bug."""
    return bool(cause and (cause.exc_type or "").endswith(REFUSALS)
                and "_amax" in f"{cause.key or ''} {cause.message or ''}")


# megatron-core's validation, and torch DCP's missing-key refusal of the load plan
REFUSALS = (BUG_EXCEPTION, "CheckpointException")

# A static per-block amax saved at one expert TP, loaded at another: megatron-core's load planner
# refuses its global shape (dist_checkpointing/strategies/torch.py _validate_global_shapes,
# raised inside torch DCP's CheckpointException on rank 0). Not the collision.
SHAPE_REFUSAL_TEXT = "Global shape mismatch"
SHAPE_REFUSAL_FINDING = ("static per-block weight-quantizer amax at another expert TP: megatron-core "
                         "refuses its global shape (docs/findings.md, 'Static NVFP4 amax at "
                         "another expert TP'); not the collision")
# The same refusal of an integer recipe's amax (per-channel experts at another expert TP,
# per-block dense linears at another TP: harness/check/versions.py _PER_CHANNEL_RESHARD,
# dense_per_block_rule); the jobs' recipes never make these kinds.
INTEGER_SHAPE_REFUSAL_FINDING = ("integer (per-channel or per-block) weight-quantizer amax at "
                                 "another TP or expert TP: megatron-core refuses its global shape "
                                 "(docs/findings.md, 'Integer amax at another TP'); not the "
                                 "collision")


def shape_refusal_finding(amax_kinds: dict | None) -> str:
    """The finding of a ``reshard-refused`` cell, by the kinds its save recorded (a record's
    ``amax_kinds``)."""
    kinds = {k for names in (amax_kinds or {}).values() for k in names}
    return SHAPE_REFUSAL_FINDING if STATIC_BLOCK in kinds or not kinds else INTEGER_SHAPE_REFUSAL_FINDING


def is_shape_refusal(cause: StageCause | None) -> bool:
    """The refusal ``Expected.RESHARD_REFUSED`` predicts, on a weight-quantizer amax."""
    text = (cause.message or "") if cause else ""
    return bool(cause and (cause.exc_type or "").endswith(REFUSALS) and SHAPE_REFUSAL_TEXT in text
                and "weight_quantizer._amax" in text)


# harness/model/quant.py NotQuantizable: ModelOpt's own exception inside mtq.quantize, as the
# ranks wrap it. Records written before they did carry ModelOpt's exception itself; the one seen
# so is AWQ-lite's calibration on TE grouped experts (upstream/awq-te-grouped-experts: its
# AttributeError raised in modelopt/torch/opt/dynamic.py:786 on every release read), known by
# its own words.
NOT_QUANTIZABLE_EXCEPTION = "NotQuantizable"
AWQ_ON_GROUPED_EXPERTS = re.compile(
    r"'QuantTE(?:Column|Row)ParallelGroupedLinear' object has no attribute 'weight'")


def is_not_quantizable(cause: StageCause | None) -> bool:
    """ModelOpt refused to quantize the model with the recipe: its exception, wrapped by the
    ranks, or AWQ-lite's known refusal on TE grouped experts by its own words."""
    exc_type = (cause.exc_type or "") if cause else ""
    return bool(cause and (exc_type.endswith(NOT_QUANTIZABLE_EXCEPTION) or (
        exc_type.endswith("AttributeError")
        and AWQ_ON_GROUPED_EXPERTS.search(cause.message or ""))))
