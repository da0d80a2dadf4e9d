"""What each nvidia-modelopt version does to a TEGroupedMLP checkpoint: one place, as data.

Every expectation the harness judges against comes from the ``Behaviour`` of the ModelOpt
version a cell actually ran in (recorded by its ranks), never from the harness's own output.
Each entry says where in that version's sources the rule was read; the recorded GPU metadata
(tests/data/recorded/<version>/) and the GPU runs under docs/runs/ check it.

A version not listed here gets ``UNKNOWN``: a notice, and the witness keeps the last buggy
release's expectations, so a release that fixed the bug shows up as ``unexpected-pass`` (the bug
is gone: review it and add an entry) and any other failure as ``unexpected-failure``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# Layout of a grouped linear's weight quantizer in the checkpoint.
SHARED, PER_EXPERT = "shared", "per-expert"
# What an unpatched load of a golden checkpoint of each layout gives (harness/golden/inspect.py
# names the layouts: shared = pre-0.47, complete / incomplete = per-expert with all / some amax).
RESTORED, NOT_RESTORED = "restored", "not-restored"


@dataclass(frozen=True)
class Behaviour:
    label: str
    specifier: str  # PEP 440, matched against the installed version (pre-releases included)
    layout: str  # SHARED | PER_EXPERT
    # replica_id rule of the per-expert weight-quantizer amax (harness/topology/oracle.py); None: the
    # layout has no per-expert amax, so nothing can collide.
    replica_rule: str | None
    # The second bug: load_state_dict re-calibrates a GroupedQuantizer through expert 0 only,
    # so a load rank holding several experts loses every other expert's amax.
    drops_expert_amax_on_reload: bool
    golden_restore: dict[str, str] = field(default_factory=dict)  # golden layout -> outcome
    fix_applies: bool = False  # harness.fix (written against 0.47.0's private methods)
    # Its megatron quantization plugin imports transformer_engine unconditionally: on a
    # machine without TE the plugin is silently absent, so cpu-tier quantization means nothing.
    plugin_needs_te: bool = False
    source: str = ""
    known: bool = True

    def matches(self, version: str) -> bool:
        return SpecifierSet(self.specifier, prereleases=True).contains(version)

    def notice(self, version: str | None) -> str | None:
        """One line for reports when the expectations are not this version's own."""
        if self.known:
            return None
        return (f"nvidia-modelopt {version} is not known to the harness (harness/check/versions.py): "
                f"judged with {LAST_BUGGY}'s expectations, so `unexpected-pass` means the bug "
                "is gone in this version; review it and add an entry")


KNOWN = (
    Behaviour(
        label="0.46.x", specifier="<0.47.0", layout=SHARED, replica_rule=None,
        drops_expert_amax_on_reload=False,
        golden_restore={"shared": RESTORED, "complete": NOT_RESTORED, "incomplete": NOT_RESTORED},
        source="0.46.1 plugins/transformer_engine.py: one weight_quantizer per grouped linear "
               "(no per-expert amax keys); a per-expert checkpoint's keys do not exist there",
    ),
    Behaviour(
        label="0.47.0", specifier="==0.47.0", layout=PER_EXPERT, replica_rule="buggy",
        drops_expert_amax_on_reload=True,
        golden_restore={"shared": NOT_RESTORED, "complete": RESTORED, "incomplete": NOT_RESTORED},
        fix_applies=True,
        source="0.47.0 plugins/megatron.py _QuantMegatronTEGroupedLinear.sharded_state_dict "
               "(make_sharded_tensors_for_checkpoint without tp_group/dp_cp_group: dense TP "
               "rank in replica_id); plugins/custom.py modelopt_post_restore resets and "
               "re-calibrates the GroupedQuantizer",
    ),
    Behaviour(
        label="0.48.0rc1", specifier="==0.48.0rc1", layout=PER_EXPERT, replica_rule="fixed",
        drops_expert_amax_on_reload=False,
        golden_restore={"shared": NOT_RESTORED, "complete": RESTORED, "incomplete": NOT_RESTORED},
        plugin_needs_te=True,
        source="0.48.0rc1 plugins/megatron.py sharded_state_dict passes tp_group=expert TP, "
               "dp_cp_group=expert DP (_expert_parallel_groups); plugins/custom.py skips "
               "GroupedQuantizer in modelopt_post_restore; _initialize_grouped_weight_quantizer"
               "_state registers zero _amax placeholders for experts without one",
    ),
)
LAST_BUGGY = "0.47.0"
DEFAULT_MATRIX = ("0.46.1", "0.47.0", "0.48.0rc1")  # `make matrix` without MODELOPT=


def _last_buggy() -> Behaviour:
    return next(b for b in KNOWN if b.label == LAST_BUGGY)


UNKNOWN = Behaviour(
    **{**_last_buggy().__dict__, "label": f"unknown (as {LAST_BUGGY})", "specifier": "",
       "fix_applies": False, "known": False,
       "source": f"no entry: {LAST_BUGGY}'s expectations, the witness asks whether the bug is gone"},
)


@functools.lru_cache(maxsize=None)
def behaviour_for(version: str | None) -> Behaviour:
    """The Behaviour of an installed version string; UNKNOWN for anything not listed."""
    try:
        Version(version or "")
    except InvalidVersion:
        return UNKNOWN
    return next((b for b in KNOWN if b.matches(version)), UNKNOWN)


def installed_modelopt() -> str | None:
    import importlib.metadata as md

    try:
        return md.version("nvidia-modelopt")
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def plugin_problem() -> str | None:
    """Why ModelOpt's megatron quantization plugin is unusable here, or None.

    modelopt imports its plugins under ``import_plugin``, which swallows ModuleNotFoundError:
    a missing plugin is silent, and quantizing a megatron model then quietly does less.
    """
    try:
        import modelopt.torch.quantization.plugins.megatron  # noqa: F401
    except ModuleNotFoundError as exc:
        return (f"nvidia-modelopt {installed_modelopt()}'s megatron quantization plugin needs "
                f"{exc.name or 'a missing module'} ({exc}); this machine has no Transformer "
                "Engine, so the cpu tier cannot exercise this version")
    except Exception as exc:  # noqa: BLE001  (TE's meta package raises RuntimeError on CPU)
        return (f"nvidia-modelopt {installed_modelopt()}'s megatron quantization plugin does "
                f"not import: {type(exc).__name__}: {str(exc)[:160]}")
    return None
