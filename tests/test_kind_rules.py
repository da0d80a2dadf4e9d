"""The constructors of harness/check/kinds.py as units: what each amax kind of a family's weights
does under a pair, as the module's own sources say it was read and checked (nvidia-modelopt 0.47.0
plugins/megatron.py, plugins/custom.py, model_calib.py; megatron-core 0.19.2; the GPU runs under
docs/runs/), and the save's reference reload. The constructors run when harness/check/versions.py
is imported, so a test that reads ``versions.KNOWN`` does not judge them: these call them. Pure.
The mutation run over kinds.py (docs/mutation.md) found these untested."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.check.defects import RESTORE_DRY_RUN, STATIC_REFUSAL
from harness.check.kinds import (FAMILY_SPLIT, KindRule, dense_per_block_rule, dense_per_channel_rule,
                                 dense_scalar_rule, dense_static_block_rule, expert_kinds,
                                 fixed_static_block_rule, integer_expert_rule, measures_logits,
                                 no_amax_rule, reference_reload, reload_keeps_state, scalar_rule,
                                 split_of, static_block_rule)
from harness.model.recipes import (EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SHARED_EXPERTS,
                                   STATIC_BLOCK)
from harness.records import Expected

pytestmark = pytest.mark.cpu

PASS, REFUSED = Expected.PASS, Expected.RESHARD_REFUSED


def _fields(rule: KindRule) -> tuple:
    return (rule.replica_rule_applies, rule.lost_on_reload, rule.reshard, rule.save_refused_split,
            rule.restore_defect)


# --- how each family is split -----------------------------------------------------------------

def test_routed_experts_split_over_expert_tp_and_the_rest_over_tp():
    topo = SimpleNamespace(tp=2, etp=4)
    assert FAMILY_SPLIT == {EXPERTS: "etp", SHARED_EXPERTS: "tp", OTHER: "tp"}
    assert split_of(EXPERTS, topo) == 4
    assert split_of(SHARED_EXPERTS, topo) == 2 and split_of(OTHER, topo) == 2
    assert split_of("a family no rule names", topo) == 2


# --- each kind's rule -------------------------------------------------------------------------

@pytest.mark.parametrize("drops", [True, False])
def test_a_scalar_expert_amax_collides_reshards_and_is_lost_where_the_release_drops_it(drops):
    rule = scalar_rule(drops)
    assert _fields(rule) == (True, drops, PASS, None, None)
    assert "plugins/megatron.py:917-946" in rule.source and "replicated (1,) tensor" in rule.source


def test_a_static_block_expert_amax_collides_keeps_its_amax_and_is_refused_at_another_etp():
    rule = static_block_rule()
    assert _fields(rule) == (True, False, REFUSED, STATIC_REFUSAL, None)
    assert "docs/runs/20261206-0354-recipes.md" in rule.checked_on
    assert "_validate_global_shapes" in rule.source and "Global shape mismatch" in rule.source
    assert static_block_rule("where it was checked").checked_on == "where it was checked"


def test_the_fixed_static_block_expert_amax_reshards_and_may_be_saved_at_etp_above_1():
    rule = fixed_static_block_rule()
    assert _fields(rule) == (True, False, PASS, None, None)
    assert "moe_ckpt_fix/static_block.py" in rule.source
    assert "docs/runs/20261206-202850-recipes-0.47.0-fix.md" in rule.checked_on


def test_a_dense_scalar_amax_keeps_megatrons_replica_ids_and_reshards():
    rule = dense_scalar_rule()
    assert _fields(rule) == (False, False, PASS, None, None)
    assert "plugins/megatron.py:508-551" in rule.source
    assert "docs/runs/20261203-000204-matrix.md" in rule.checked_on


def test_a_dense_static_block_amax_reshards_but_its_calibration_is_refused_at_tp_above_1():
    rule = dense_static_block_rule()
    assert _fields(rule) == (False, False, PASS, STATIC_REFUSAL, None)
    # read where every dense linear's quantizer tensors are built, as the dense scalar rule
    assert "plugins/megatron.py:508-551" in rule.source and "_global_amax skipped" in rule.source
    assert "docs/runs/20261206-234245-recipes-0.48.0rc1-none.md" in rule.checked_on


@pytest.mark.parametrize("kind,reshard,says", [
    (PER_CHANNEL, REFUSED, "'Global shape mismatch for loaded (256, 1) and expected (512, 1)'"),
    (PER_BLOCK, PASS, "the buffer is re-calibrated to the load's local shape")])
@pytest.mark.parametrize("drops", [True, False])
def test_an_integer_expert_amax_collides_and_reshards_as_the_gpu_decided(kind, reshard, says, drops):
    rule = integer_expert_rule(kind, drops, "THE RELEASE'S SOURCE")
    assert _fields(rule) == (True, drops, reshard, None, None)
    # what the kind is, then the release's source, then what the GPU decided at another ETP
    what, rest = rule.source.split("THE RELEASE'S SOURCE")
    assert what.startswith(f"{kind} (") and rest.startswith("; at another expert TP") and says in rest
    assert "docs/runs/20261206-234019-recipes-0.47.0-fix.md" in rule.checked_on
    assert integer_expert_rule(kind, drops, "", RESTORE_DRY_RUN).restore_defect is RESTORE_DRY_RUN


def test_no_amax_has_nothing_to_collide_lose_or_reshard():
    rule = no_amax_rule()
    assert _fields(rule) == (False, False, PASS, None, None)
    assert "MXFP8_DEFAULT_CFG" in rule.source and rule.checked_on == ""


def test_a_dense_per_channel_amax_reshards_through_its_recalibration():
    rule = dense_per_channel_rule()
    assert _fields(rule) == (False, False, PASS, None, None)
    assert rule.source.startswith("0.47.0 plugins/megatron.py:508-551")
    assert "; per-channel: Column axis 0 (0.47.0 plugins/megatron.py:577-578)" in rule.source
    assert "plugins/custom.py:177-181" in rule.source


def test_a_dense_per_block_amax_is_refused_at_another_tp():
    rule = dense_per_block_rule()
    assert _fields(rule) == (False, False, REFUSED, None, None)
    assert "'Global shape mismatch for loaded (256, 1) and expected (256, 2)'" in rule.source
    assert "docs/runs/20261206-234019-recipes-0.47.0-fix.md" in rule.checked_on


@pytest.mark.parametrize("lost", [True, False])
@pytest.mark.parametrize("dry_run", [True, False])
def test_the_routed_experts_rules_per_kind(lost, dry_run):
    rules = expert_kinds(lost, "SRC", dry_run)
    assert set(rules) == {STATIC_BLOCK, PER_CHANNEL, PER_BLOCK, NO_AMAX}
    assert rules[STATIC_BLOCK] == static_block_rule() and rules[NO_AMAX] == no_amax_rule()
    defect = RESTORE_DRY_RUN if dry_run else None
    for kind in (PER_CHANNEL, PER_BLOCK):
        assert rules[kind] == integer_expert_rule(kind, lost, "SRC", defect)
        assert rules[kind].lost_on_reload is lost and rules[kind].restore_defect is defect


def test_the_dry_run_defaults_to_not_met():
    rules = expert_kinds(False, "SRC")
    assert rules[PER_CHANNEL].restore_defect is None and rules[PER_BLOCK].restore_defect is None


# --- the save's reference reload --------------------------------------------------------------

@pytest.mark.parametrize("pp,cuda,measures", [(1, False, True), (1, True, True), (2, True, True),
                                              (2, False, False), (4, False, False)])
def test_logits_are_measured_at_pp_1_or_on_cuda(pp, cuda, measures):
    assert measures_logits(pp, cuda) is measures


KEEPS, LOSES = scalar_rule(False), scalar_rule(True)


def _never():
    raise AssertionError("the routed experts' rules were asked although patched or local decides")


@pytest.mark.parametrize("patched,local", [(True, False), (False, True), (True, True)])
def test_a_patched_or_local_reload_keeps_the_state_without_asking_the_rules(patched, local):
    assert reload_keeps_state(patched, local, _never) is True
    assert reload_keeps_state(patched, local, [LOSES]) is True


@pytest.mark.parametrize("rules,keeps", [([], False), ([None], False), ([LOSES], False),
                                         ([KEEPS, LOSES], False), ([KEEPS, None], False),
                                         ([KEEPS], True), ([KEEPS, KEEPS], True)])
def test_unpatched_the_reload_keeps_the_state_only_if_every_expert_kind_keeps_it(rules, keeps):
    assert reload_keeps_state(False, False, rules) is keeps
    assert reload_keeps_state(False, False, lambda: rules) is keeps


@pytest.mark.parametrize("patched,local,rules,pp,cuda,reloads", [
    (False, False, [KEEPS], 1, False, True),
    (False, False, [KEEPS], 2, False, False),   # no logits measured: no reference reload
    (False, False, [KEEPS], 2, True, True),
    (False, False, [LOSES], 1, True, False),    # the second bug: no trustworthy reference
    (True, False, [LOSES], 1, False, True),
    (False, True, [LOSES], 1, False, True),
    (True, True, [LOSES], 2, False, False)])
def test_the_save_reloads_its_checkpoint_where_it_measures_logits_and_keeps_the_state(
        patched, local, rules, pp, cuda, reloads):
    assert reference_reload(patched, local, rules, pp, cuda) is reloads
