"""The forecast of what a quantization recipe puts in a checkpoint: the amax kinds of its weight
quantizers, per module family, read from the recipe files ModelOpt ships.

Why: whether a reshard works depends on the kind of amax a recipe stores, not on its name.
The version rules (harness/check/versions.py) are written per (kind, family). Before a save has
run, the kinds listed here decide a cell's expectation; once a save ran, the kinds it RECORDED
(harness/model/quant.py ``amax_kinds``) decide, and this table is only checked against them: a
disagreement is named in the record (``forecast_disagreement``), never a reason to stop judging.
A recipe not listed (a user's file, a constant not read yet) has no forecast: it is judged from
its recorded kinds like any other.

Kinds (weight quantizers of one module family):
- ``scalar``: one amax per quantizer, shape (1,): dynamic NVFP4 (a per-tensor global amax with
  per-block scales computed at run time) and FP8 per-tensor alike; ModelOpt builds its sharded
  tensor the same way for both.
- ``per-channel``: one amax per output channel (axis 0: INT8 / FP8 per-channel).
- ``per-block``: static blocks of another format (INT4 / FP8 blockwise): a per-block ``_amax``,
  no ``_global_amax``.
- ``no-amax``: MX formats: e8m0 block scales computed at run time, no amax at all.
- ``static-block``: static NVFP4: ``_amax`` of one value per 16-element block (weight numel / 16)
  and a scalar ``_global_amax``; calibrated by the recipe's algorithm (MSE for the Nemotron ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.model.recipes import (DEFAULT_RECIPE, EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL,
                                   SCALAR, SHARED_EXPERTS, STATIC_BLOCK)

AMAX_KINDS = (SCALAR, STATIC_BLOCK, PER_CHANNEL, PER_BLOCK, NO_AMAX)


@dataclass(frozen=True)
class RecipeFacts:
    """One recipe's amax kinds, per module family it quantizes (a family absent: left in bf16)."""

    ref: str
    kinds: dict[str, str] = field(default_factory=dict)  # family -> kind
    calibration: str = "max"
    source: str = ""

    @property
    def expert_kind(self) -> str | None:
        return self.kinds.get(EXPERTS)

    def on(self, families: tuple[str, ...] | None) -> dict[str, list[str]]:
        """The kinds per family on a model that has ``families`` (None: every family listed),
        in the shape a save records them (family -> sorted kinds)."""
        return {f: [k] for f, k in sorted(self.kinds.items()) if families is None or f in families}


_NEMOTRON = "models/nvidia/NVIDIA-Nemotron-3-{}-BF16/ptq/{}"
ULTRA_4O6 = "modelopt:" + _NEMOTRON.format("Ultra-550B-A55B", "nvfp4-4o6")
SUPER_MSE = "modelopt:" + _NEMOTRON.format("Super-120B-A12B", "nvfp4-mse")

KNOWN_RECIPES = {r.ref: r for r in (
    RecipeFacts(DEFAULT_RECIPE, {EXPERTS: SCALAR, SHARED_EXPERTS: SCALAR, OTHER: SCALAR},
                source="modelopt_recipes/configs/ptq/presets/model/nvfp4.yaml: every linear "
                       "w4a4 dynamic NVFP4 (configs/numerics/nvfp4.yaml, block type dynamic); "
                       "algorithm max"),
    RecipeFacts(ULTRA_4O6, {EXPERTS: STATIC_BLOCK, SHARED_EXPERTS: SCALAR}, calibration="mse",
                source="modelopt_recipes/models/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16/ptq/"
                       "nvfp4-4o6.yaml: '*' disabled; '*mlp.experts*weight_quantizer' "
                       "configs/numerics/nvfp4_four_over_six (block type static); shared experts "
                       "configs/numerics/fp8 (per-tensor); algorithm mse"),
    RecipeFacts(SUPER_MSE, {EXPERTS: STATIC_BLOCK, SHARED_EXPERTS: SCALAR}, calibration="mse",
                source="modelopt_recipes/models/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16/ptq/"
                       "nvfp4-mse.yaml: '*' disabled; '*mlp.experts*weight_quantizer' block type "
                       "static; shared experts fp8 per-tensor; algorithm mse, fp8_scale_sweep"),
    RecipeFacts("mtq:MAMBA_MOE_NVFP4_CONSERVATIVE_CFG", {EXPERTS: SCALAR, SHARED_EXPERTS: SCALAR},
                source="modelopt_recipes/configs/ptq/presets/model/mamba_moe_nvfp4_conservative.yaml:"
                       " units/w4a4_nvfp4_nvfp4 (dynamic NVFP4); mamba_moe_disabled_quantizers (attention, "
                       "latent projections) and Mamba in/out_proj off; algorithm max"),
    RecipeFacts("mtq:MAMBA_MOE_NVFP4_AGGRESSIVE_CFG", {EXPERTS: SCALAR, SHARED_EXPERTS: SCALAR, OTHER: SCALAR},
                source="modelopt_recipes/configs/ptq/presets/model/mamba_moe_nvfp4_aggressive.yaml:"
                       " units/w4a4_nvfp4_nvfp4 (dynamic NVFP4); mamba_moe_disabled_quantizers (attention, "
                       "latent projections) off, Mamba in/out_proj on; algorithm max"),
    RecipeFacts("mtq:FP8_DEFAULT_CFG", {EXPERTS: SCALAR, SHARED_EXPERTS: SCALAR, OTHER: SCALAR},
                source="modelopt_recipes/configs/ptq/presets/model/fp8.yaml: per-tensor FP8 "
                       "(axis None, no block sizes); algorithm max"),
    # Issue 52 item 3: one recipe per kind set that had no GPU scenario (docs/recipes.md).
    RecipeFacts("mtq:INT8_WEIGHT_ONLY_CFG", {EXPERTS: PER_CHANNEL, SHARED_EXPERTS: PER_CHANNEL,
                                             OTHER: PER_CHANNEL},
                source="modelopt_recipes/configs/ptq/presets/model/int8_weight_only.yaml: "
                       "'*weight_quantizer' configs/numerics/int8_per_channel (axis 0), inputs "
                       "off; algorithm max"),
    RecipeFacts("mtq:INT4_BLOCKWISE_WEIGHT_ONLY_CFG", {EXPERTS: PER_BLOCK, SHARED_EXPERTS: PER_BLOCK,
                                                       OTHER: PER_BLOCK},
                source="modelopt_recipes/configs/ptq/presets/model/int4_blockwise_weight_only.yaml:"
                       " '*weight_quantizer' configs/numerics/int4_per_block (static blocks, no "
                       "global amax), inputs off; algorithm max"),
    RecipeFacts("mtq:MXFP8_DEFAULT_CFG", {EXPERTS: NO_AMAX, SHARED_EXPERTS: NO_AMAX, OTHER: NO_AMAX},
                calibration="no calibration (algorithm None)",
                source="modelopt_recipes/configs/ptq/presets/model/mxfp8.yaml: weights and inputs "
                       "configs/numerics/mxfp8 (MX: e8m0 scales at run time); algorithm none"),
    RecipeFacts("mtq:NVFP4_FOUR_OVER_SIX_CFG", {EXPERTS: STATIC_BLOCK, SHARED_EXPERTS: STATIC_BLOCK,
                                                OTHER: STATIC_BLOCK}, calibration="mse",
                source="modelopt_recipes/configs/ptq/presets/model/nvfp4_four_over_six.yaml: "
                       "units/w4a4_nvfp4_nvfp4_four_over_six on every linear (block type static); "
                       "algorithm mse without the FP8 scale sweep"),
)}


def recipe_facts(ref: str | None) -> RecipeFacts | None:
    """The table's facts for a recipe (None: not known here); a record without a recipe was
    made before the recipe axis, with the default."""
    return KNOWN_RECIPES.get(ref or DEFAULT_RECIPE)


def forecast(ref: str | None, families: tuple[str, ...] | None = None) -> dict[str, list[str]] | None:
    """The kinds this table forecasts for a recipe on a model with ``families``; None: none."""
    facts = recipe_facts(ref)
    return facts.on(families) if facts else None


def disagreement(ref: str | None, forecast_kinds: dict | None, recorded: dict | None) -> str | None:
    """One line when a save recorded, for some family, other amax kinds than the forecast (or a
    family it does not forecast), else None. A forecast family the save recorded nothing for is
    no disagreement: the recipe's patterns may name modules this model lacks (Mamba projections
    on a plain GPT). No forecast, or nothing recorded: nothing to disagree with."""
    if not forecast_kinds or not recorded or all(
            sorted(kinds) == forecast_kinds.get(family) for family, kinds in recorded.items()):
        return None
    return (f"recipe {ref or DEFAULT_RECIPE}: the save recorded amax kinds {recorded}, "
            f"harness/check/recipes.py forecasts {forecast_kinds}: judged by what the save recorded")
