"""The refusal predicates of harness/check/refusals.py as units: which first failure of a stage
is the report's collision, an amax refusal, a shape refusal at another expert TP, or ModelOpt's
refusal to quantize. The causes are written here in megatron-core's own words (the installed
0.19.2: dist_checkpointing/validation.py 'Invalid access pattern for ...',
dist_checkpointing/strategies/torch.py _validate_global_shapes 'Global shape mismatch for loaded
(...) and expected (...) tensor for key ...', both raising CheckpointingException from
dist_checkpointing/core.py), and the pair's behaviours are the rows of harness/check/versions.py.
Pure: no rank starts. The mutation run over refusals.py (docs/mutation.md) found these branches
untested."""
from __future__ import annotations

import pytest

from harness.check.refusals import (INTEGER_SHAPE_REFUSAL_FINDING, SHAPE_REFUSAL_FINDING,
                                    expert_tensors, is_amax_refusal, is_bug, is_not_quantizable,
                                    is_shape_refusal, shape_refusal_finding)
from harness.check.versions import KNOWN
from harness.model.recipes import (EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SCALAR,
                                   SHARED_EXPERTS, STATIC_BLOCK)
from harness.outcomes import CauseKind
from harness.records import StageCause

pytestmark = pytest.mark.cpu

MCORE_EXC = "megatron.core.dist_checkpointing.core.CheckpointingException"
DCP_EXC = "torch.distributed.checkpoint.api.CheckpointException"
EXPERT_WEIGHT = "decoder.layers.0.mlp.experts.experts.linear_fc1.weight_quantizer"
PER_EXPERT_WEIGHT = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight_quantizer"
SHARED_INPUT_AMAX = "decoder.layers.0.mlp.experts.experts.linear_fc2.input_quantizer._amax"
ACCESS = "Invalid access pattern for ShardedTensor(key='x'): tensor([[2]])"


def cause(exc_type=MCORE_EXC, message=ACCESS, key=None) -> StageCause:
    return StageCause(rank=0, kind=CauseKind.EXCEPTION, exc_type=exc_type, message=message, key=key)


def shape_message(key: str) -> str:
    return (f"Global shape mismatch for loaded (torch.Size([4, 16])) and expected "
            f"(torch.Size([2, 16])) tensor for key {key}")


# The pair's behaviours, by the rule they carry (harness/check/versions.py).
CANNOT_SAVE = next(b for b in KNOWN if b.cannot_save)
SHARED_COLLIDES = next(b for b in KNOWN if b.shared_rule == "expert-tp-dense-dp" and not b.cannot_save)
PER_EXPERT_RULE = next(b for b in KNOWN if b.shared_rule != "expert-tp-dense-dp" and not b.cannot_save)


# --- expert_tensors ---------------------------------------------------------------------------

@pytest.mark.parametrize("kinds", [None, {}, {EXPERTS: []}, {EXPERTS: [NO_AMAX]},
                                   {EXPERTS: ["a kind no rule knows"]}, {OTHER: [STATIC_BLOCK]},
                                   {SHARED_EXPERTS: [STATIC_BLOCK]}])
def test_expert_tensors_fall_back_to_the_scalar_amax_without_a_known_routed_expert_kind(kinds):
    assert expert_tensors(kinds) == ("_amax",)


def test_expert_tensors_of_a_static_kind_are_its_block_and_global_amax_once_each_sorted():
    assert expert_tensors({EXPERTS: [STATIC_BLOCK]}) == ("_amax", "_global_amax")
    assert expert_tensors({EXPERTS: [SCALAR, STATIC_BLOCK, PER_CHANNEL],
                           OTHER: [PER_BLOCK]}) == ("_amax", "_global_amax")
    assert expert_tensors({EXPERTS: [PER_CHANNEL]}) == ("_amax",)


# --- is_bug -----------------------------------------------------------------------------------

def test_no_cause_is_never_the_bug():
    assert is_bug(None) is False
    assert is_bug(None, PER_EXPERT_RULE) is False
    assert is_bug(None, CANNOT_SAVE) is False


@pytest.mark.parametrize("key", [f"{EXPERT_WEIGHT}._amax", f"{EXPERT_WEIGHT}._global_amax",
                                 f"{PER_EXPERT_WEIGHT}._amax"])
def test_the_validation_refusal_of_an_expert_weight_amax_is_the_bug_by_default(key):
    assert is_bug(cause(key=key)) is True
    assert is_bug(cause(key=key), PER_EXPERT_RULE) is True


def test_the_bug_is_only_on_the_tensors_of_the_experts_kinds():
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._global_amax"), None, ("_amax",)) is False
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._amax"), None, ("_amax",)) is True
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._global_amax"), PER_EXPERT_RULE, ("_amax",)) is False
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._amax"), PER_EXPERT_RULE, ("_global_amax",)) is False


@pytest.mark.parametrize("key", [None, "", SHARED_INPUT_AMAX, f"{EXPERT_WEIGHT}._scale",
                                 f"{EXPERT_WEIGHT}._amax.extra", "decoder.layers.0.mlp.experts.experts."
                                 "linear_fc1.weight"])
def test_the_validation_refusal_of_another_key_is_not_the_bug(key):
    assert is_bug(cause(key=key)) is False


@pytest.mark.parametrize("exc_type,message", [
    (None, ACCESS), ("RuntimeError", ACCESS), ("CheckpointingExceptionX", ACCESS),
    (MCORE_EXC, None), (MCORE_EXC, ""), (MCORE_EXC, "invalid access pattern"),
    (DCP_EXC, ACCESS)])
def test_the_bug_needs_megatrons_exception_and_its_words(exc_type, message):
    assert is_bug(cause(exc_type=exc_type, message=message, key=f"{EXPERT_WEIGHT}._amax")) is False


def test_the_bug_of_a_pair_that_cannot_save_is_its_own_exception():
    exc, _, text = CANNOT_SAVE.cannot_save.partition(": ")
    assert exc == "TypeError" and text  # the row names the exception, then its words
    assert is_bug(cause(exc_type=exc, message=f"rank 0: {text}"), CANNOT_SAVE) is True
    assert is_bug(cause(exc_type=f"builtins.{exc}", message=text), CANNOT_SAVE) is True
    # the exception alone, or the words under another exception, are not it
    assert is_bug(cause(exc_type=exc, message="another argument"), CANNOT_SAVE) is False
    assert is_bug(cause(exc_type=exc, message=None), CANNOT_SAVE) is False
    assert is_bug(cause(exc_type="ValueError", message=text), CANNOT_SAVE) is False
    assert is_bug(cause(exc_type=None, message=text), CANNOT_SAVE) is False
    # and megatron-core's collision is not what that pair predicts
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._amax"), CANNOT_SAVE) is False


def test_a_pair_whose_shared_expert_amax_collides_predicts_that_key_and_no_other():
    assert is_bug(cause(key=SHARED_INPUT_AMAX), SHARED_COLLIDES) is True
    assert is_bug(cause(key="decoder.layers.3.mlp.experts.experts.linear_fc1.input_quantizer._amax"),
                  SHARED_COLLIDES) is True
    assert is_bug(cause(key=f"{EXPERT_WEIGHT}._amax"), SHARED_COLLIDES) is False
    assert is_bug(cause(key=None), SHARED_COLLIDES) is False
    # still megatron-core's validation only
    assert is_bug(cause(exc_type="RuntimeError", key=SHARED_INPUT_AMAX), SHARED_COLLIDES) is False
    assert is_bug(cause(message="something else", key=SHARED_INPUT_AMAX), SHARED_COLLIDES) is False
    # the shared key is not the bug of the other pairs
    assert is_bug(cause(key=SHARED_INPUT_AMAX), PER_EXPERT_RULE) is False


# --- is_amax_refusal --------------------------------------------------------------------------

@pytest.mark.parametrize("exc_type,message,key", [
    (MCORE_EXC, ACCESS, f"{EXPERT_WEIGHT}._amax"),
    (MCORE_EXC, f"Invalid access pattern for {EXPERT_WEIGHT}._amax", None),
    (DCP_EXC, "Missing key in checkpoint state_dict", f"{EXPERT_WEIGHT}._amax"),
    (DCP_EXC, f"Missing key in checkpoint state_dict: {SHARED_INPUT_AMAX}.", None),
    ("CheckpointException", "x", "a._amax"),
])
def test_megatrons_or_dcps_refusal_on_an_amax_is_an_amax_refusal(exc_type, message, key):
    assert is_amax_refusal(cause(exc_type=exc_type, message=message, key=key)) is True


@pytest.mark.parametrize("exc_type,message,key", [
    (MCORE_EXC, ACCESS, "decoder.layers.0.self_attention.linear_qkv.weight"),
    (MCORE_EXC, None, None),
    (DCP_EXC, "Missing key in checkpoint state_dict: decoder.final_layernorm.weight", None),
    ("RuntimeError", "_amax", f"{EXPERT_WEIGHT}._amax"),
    ("KeyError", f"{EXPERT_WEIGHT}._amax from model not in state dict", None),
    (None, "_amax", f"{EXPERT_WEIGHT}._amax"),
    (MCORE_EXC, "x_am", "ax"),
])
def test_another_exception_or_a_refusal_of_no_amax_is_not_an_amax_refusal(exc_type, message, key):
    assert is_amax_refusal(cause(exc_type=exc_type, message=message, key=key)) is False


def test_no_cause_is_no_amax_refusal():
    assert is_amax_refusal(None) is False


# --- is_shape_refusal -------------------------------------------------------------------------

@pytest.mark.parametrize("exc_type", [MCORE_EXC, DCP_EXC])
def test_megatrons_global_shape_refusal_of_a_weight_amax_is_a_shape_refusal(exc_type):
    assert is_shape_refusal(cause(exc_type=exc_type, message=shape_message(f"{EXPERT_WEIGHT}._amax"))) is True


@pytest.mark.parametrize("exc_type,message", [
    ("RuntimeError", shape_message(f"{EXPERT_WEIGHT}._amax")),
    (None, shape_message(f"{EXPERT_WEIGHT}._amax")),
    (MCORE_EXC, shape_message(SHARED_INPUT_AMAX)),
    (MCORE_EXC, shape_message("decoder.layers.0.mlp.experts.experts.linear_fc1.weight")),
    (MCORE_EXC, f"Invalid access pattern for {EXPERT_WEIGHT}._amax"),
    (MCORE_EXC, f"global shape mismatch for key {EXPERT_WEIGHT}._amax"),
    (MCORE_EXC, None),
    (MCORE_EXC, ""),
])
def test_other_refusals_are_not_a_shape_refusal(exc_type, message):
    assert is_shape_refusal(cause(exc_type=exc_type, message=message,
                                  key=f"{EXPERT_WEIGHT}._amax")) is False


def test_no_cause_is_no_shape_refusal():
    assert is_shape_refusal(None) is False


# --- shape_refusal_finding --------------------------------------------------------------------

@pytest.mark.parametrize("amax_kinds", [None, {}, {EXPERTS: []}, {EXPERTS: [STATIC_BLOCK]},
                                        {EXPERTS: [PER_CHANNEL], OTHER: [STATIC_BLOCK]},
                                        {OTHER: [STATIC_BLOCK, PER_BLOCK]}])
def test_a_static_block_kind_or_no_recorded_kind_finds_the_static_amax_refusal(amax_kinds):
    assert shape_refusal_finding(amax_kinds) == SHAPE_REFUSAL_FINDING


@pytest.mark.parametrize("amax_kinds", [{EXPERTS: [PER_CHANNEL]}, {EXPERTS: [SCALAR], OTHER: [PER_BLOCK]},
                                        {SHARED_EXPERTS: [PER_CHANNEL], EXPERTS: []}])
def test_integer_kinds_alone_find_the_integer_amax_refusal(amax_kinds):
    assert shape_refusal_finding(amax_kinds) == INTEGER_SHAPE_REFUSAL_FINDING


def test_the_two_findings_differ():
    assert SHAPE_REFUSAL_FINDING != INTEGER_SHAPE_REFUSAL_FINDING


# --- is_not_quantizable -----------------------------------------------------------------------

@pytest.mark.parametrize("exc_type,message", [
    ("harness.model.quant.NotQuantizable", "AttributeError: something"),
    ("NotQuantizable", None),
    ("AttributeError", "'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'"),
    ("builtins.AttributeError",
     "rank 3: 'QuantTERowParallelGroupedLinear' object has no attribute 'weight'. Did you mean"),
])
def test_modelopts_refusal_to_quantize_is_not_quantizable(exc_type, message):
    assert is_not_quantizable(cause(exc_type=exc_type, message=message)) is True


@pytest.mark.parametrize("exc_type,message", [
    (None, "'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'"),
    ("RuntimeError", "'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'"),
    ("AttributeError", "'QuantTEColumnParallelGroupedLinear' object has no attribute 'bias'"),
    ("AttributeError", "'QuantTEColumnParallelLinear' object has no attribute 'weight'"),
    ("AttributeError", None),
    ("AttributeError", ""),
    ("NotQuantizableX", "x"),
])
def test_other_failures_are_not_a_refusal_to_quantize(exc_type, message):
    assert is_not_quantizable(cause(exc_type=exc_type, message=message)) is False


def test_no_cause_is_not_a_refusal_to_quantize():
    assert is_not_quantizable(None) is False
