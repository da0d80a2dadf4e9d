"""Saved keys a load legitimately does not restore (known gaps): a scenario's own, plus the ones
its backend always has.

Why: the local spec (backend ``local``, tier cpu) puts plain torch LayerNorms in front of
``linear_qkv`` / ``linear_fc1`` and the final norm; ModelOpt gives them an NVFP4 input quantizer
whose amax is saved but not re-created by ``restore_sharded_modelopt_state`` (nvidia-modelopt
0.47.0), so every reload lacks those keys (5 on the 2-layer model, seen on a cpu cell:
``decoder.final_layernorm.input_quantizer._amax`` and per layer
``...{linear_qkv,linear_fc1}.layer_norm_input_quantizer._amax``). TE fuses these norms into its
linears, so backend ``te`` has no such gap. It is a fact of the backend, not of one scenario: a
scenario written without ``known_gaps`` must not fail on it, so the judge adds it here, once.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from harness.tiers import Backend


@dataclass(frozen=True)
class KnownGap:
    """Saved keys a load legitimately does not restore, with the reason (shown in reports)."""

    pattern: str
    reason: str

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


_LOCAL_NORM = "local-spec LayerNorm input quantizer amax is not restored by ModelOpt (cpu tier only)"

BACKEND_GAPS: dict[str, tuple[KnownGap, ...]] = {
    Backend.LOCAL: (KnownGap("*layer_norm_input_quantizer._amax", _LOCAL_NORM),
                    KnownGap("decoder.final_layernorm.input_quantizer._amax", _LOCAL_NORM)),
    Backend.TE: (),
}


def known_gaps(scenario) -> tuple[KnownGap, ...]:
    """The gaps a cell of ``scenario`` is judged with: its ``known_gaps`` then its backend's."""
    own = tuple(getattr(scenario, "known_gaps", ()))
    return tuple(dict.fromkeys(own + BACKEND_GAPS.get(getattr(scenario, "backend", ""), ())))
