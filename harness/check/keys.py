"""Checkpoint key patterns of the MoE expert quantizer state: the one place they are written.

Megatron names an expert linear ``...layers.<L>.mlp.experts.<...>linear_fc<n>``; TEGroupedMLP with
``singleton_local_shards`` adds a second ``experts.`` and one key per expert, the local spec
(SequentialMLP) says ``local_experts.<e>``. ModelOpt < 0.47 keeps one weight-quantizer amax per
linear (the shared layout); 0.47 keeps one per expert (the per-expert layout).
"""
from __future__ import annotations

import re

# The per-expert weight-quantizer amax whose replica ids collide (the report's failing key).
WEIGHT_AMAX_SUFFIX = "weight_quantizer._amax"
# A static NVFP4 recipe's scalar per-expert ``_global_amax`` is built with the same replica ids
# (harness/check/versions.py _STATIC_SOURCE): its refusal is the same collision.
WEIGHT_AMAX = re.compile(r"weight_quantizer\._(?:global_)?amax$")

_LAYER = r"(?:.*\.)?layers\.(?P<layer>\d+)\.mlp\.experts\."
PER_EXPERT_WEIGHT_AMAX = re.compile(
    _LAYER + r"(?:experts|local_experts)\.(?P<expert>\d+)\.(?P<linear>linear_fc\d)\.weight_quantizer\._amax$"
)
SHARED_WEIGHT_AMAX = re.compile(_LAYER + r"(?:experts\.)?(?P<linear>linear_fc\d)\.weight_quantizer\._amax$")
EXPERT_INPUT_AMAX = re.compile(_LAYER + r"(?:experts\.)?(?:\d+\.)?linear_fc\d\.input_quantizer\._amax$")
# group "linear": the expert linear without its expert index, e.g. "...mlp.experts.experts.linear_fc1"
EXPERT_WEIGHT = re.compile(
    r"^(?P<prefix>" + _LAYER + r"(?:experts|local_experts))\.(?P<expert>\d+)\.(?P<name>linear_fc\d)\.weight$"
)
ROUTER_WEIGHT = re.compile(r"(?:.*\.)?layers\.(?P<layer>\d+)\.mlp\.router\.weight$")
ANY_LAYER = re.compile(r"(?:.*\.)?layers\.(?P<layer>\d+)\.")


def amax_key_counts(keys) -> dict:
    """How many quantizer amax keys (``_amax``, ``_global_amax``; weight and input quantizers) a
    checkpoint holds per module family, those of MTP layers (``mtp.`` keys) apart under "mtp"."""
    from harness.model.recipes import module_family

    out: dict = {}
    for key in keys:
        if "_quantizer." in key and key.endswith("amax"):
            where = out.setdefault("mtp", {}) if key.startswith("mtp.") else out
            family = module_family(key)
            where[family] = where.get(family, 0) + 1
    return out


def is_expert_weight_amax(key: str) -> bool:
    """A weight-quantizer amax of an expert linear, in either layout."""
    return ".experts." in key and "weight_quantizer" in key and key.endswith("amax")


def weight_amax_key(weight_key: str) -> str:
    """``<...>.weight`` -> its weight quantizer's amax key ``<...>.weight_quantizer._amax``."""
    return weight_key + "_quantizer._amax"


def shared_weight_amax_key(m: re.Match) -> str:
    """The shared-layout amax key of the linear an ``EXPERT_WEIGHT`` match belongs to."""
    return f"{m['prefix']}.{m['name']}.{WEIGHT_AMAX_SUFFIX}"


# The checkpoint key an error names. megatron-core dist_checkpointing/validation.py: "Invalid
# access pattern for ShardedTensor(key='...'"; dist_checkpointing/strategies/torch.py, a key the
# model asks for and the checkpoint lacks: KeyError: "<key> from model not in state dict: [...]"
SHARDED_KEY = re.compile(r"ShardedTensor\(\s*key='([^']+)'")
MISSING_KEY = re.compile(r"""KeyError: ["']([^"'\s]+) from model not in state dict""")


def failing_key(text: str) -> str | None:
    """The checkpoint key a failure's message names (a refused or a missing key), if any."""
    m = SHARDED_KEY.search(text or "") or MISSING_KEY.search(text or "")
    return m.group(1) if m else None
