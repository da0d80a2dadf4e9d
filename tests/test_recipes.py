"""The recipe axis: a scenario names its recipe, a bad name is one line, the catalogue
of amax kinds matches what ModelOpt's own recipe files make, and a recipe or kind with no rule
predicts nothing.

Expectations come from ModelOpt itself (its recipe files, its quantizer matching, run here on
the cpu tier's model) and from the rules in harness/check/versions.py, never from a run of the
harness.
"""
from __future__ import annotations

import pytest

from harness.check.recipes import (KNOWN_RECIPES, STATIC_BLOCK, SUPER_MSE, ULTRA_4O6, disagreement,
                                   forecast, recipe_facts)
from harness.check.versions import rules_for
from harness.model.recipes import DEFAULT_RECIPE, Recipe, RecipeError
from harness.records import Expected
from harness.scenario.scenarios import ScenarioError, load_all_with_errors, load_scenario

pytestmark = pytest.mark.cpu

MINE_FILE = "file:tests/data/recipes/nvfp4_static_experts.yaml"
GPU_HEAD = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\n'


@pytest.mark.parametrize("text, words", [
    ("NVFP4_DEFAULT_CFG", "'<kind>:<name>'"),
    ("mtq:nvfp4_default", "upper case, ending in _CFG"),
    ("modelopt:../outside", "built-in recipe library"),
    ("ftp:x", "kind one of mtq, modelopt, file"),
])
def test_a_bad_reference_names_its_form(text, words):
    with pytest.raises(RecipeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Recipe.parse(text)


@pytest.mark.parametrize("recipe, words", [
    ("mtq:NO_SUCH_RECIPE_CFG", "defines no NO_SUCH_RECIPE_CFG"),
    ("modelopt:models/nvidia/no-such-model/ptq/x", "no such recipe in the installed nvidia-modelopt"),
    ("file:scenarios/recipes/missing.yaml", "no such file in the repository"),
])
def test_a_recipe_the_installation_lacks_is_one_line_and_the_rest_load(tmp_path, recipe, words):
    (tmp_path / "bad.toml").write_text(GPU_HEAD + f'recipe = "{recipe}"\nsaves = ["tp1-etp1-ep1"]\n')
    (tmp_path / "good.toml").write_text(GPU_HEAD + 'saves = ["tp1-etp1-ep1"]\n')
    good, bad = load_all_with_errors(tmp_path)
    assert [s.name for s in good] == ["good"]
    (err,) = bad
    assert "\n" not in str(err) and "bad.toml: recipe: " in str(err) and words in str(err), err


def test_a_static_recipe_saved_at_expert_tp_above_one_is_refused_before_any_rank(tmp_path):
    """ModelOpt refuses static NVFP4 calibration at expert TP > 1 (_check_nvfp4_static_tp_supported)."""
    path = tmp_path / "s.toml"
    path.write_text(GPU_HEAD + f'recipe = "{ULTRA_4O6}"\nsaves = ["tp1-etp1-ep4", "tp2-etp2-ep2"]\n')
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert "saves[1]: tp2-etp2-ep2-pp1" in str(err.value) and "expert TP > 1" in str(err.value)
    assert "saves[0]" not in str(err.value)


def test_another_recipe_is_another_checkpoint(tmp_path):
    (tmp_path / "a.toml").write_text(GPU_HEAD + 'saves = ["tp1-etp1-ep4"]\n')
    (tmp_path / "b.toml").write_text(GPU_HEAD + f'recipe = "{SUPER_MSE}"\nsaves = ["tp1-etp1-ep4"]\n')
    a, b = (load_scenario(tmp_path / n).cells()[0] for n in ("a.toml", "b.toml"))
    assert a.scenario.recipe == DEFAULT_RECIPE and b.scenario.recipe == SUPER_MSE
    assert a.save_id != b.save_id


def _cell(tmp_path, recipe, save, load):
    path = tmp_path / "c.toml"
    path.write_text(GPU_HEAD + f'recipe = "{recipe}"\nsaves = ["{save}"]\nloads = ["{load}"]\n')
    return next(c for c in load_scenario(path).cells() if c.load)


@pytest.mark.parametrize("modelopt", ["0.47.0", "0.48.0rc1"])
def test_static_blocks_at_another_expert_tp_are_refused(tmp_path, modelopt):
    """The rule read from the sources and checked on the H100 (versions.py _STATIC_CHECKED)."""
    rules = rules_for(modelopt, "0.19.2")
    assert rules.kind_rule(STATIC_BLOCK).reshard == Expected.RESHARD_REFUSED
    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp2-ep2")
    assert cell.expected_under(rules) == Expected.RESHARD_REFUSED
    same = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp1-etp1-ep2")
    assert same.expected_under(rules) == Expected.PASS


def test_static_blocks_collide_where_the_scalar_amax_does(tmp_path):
    """Same construction (versions.py _STATIC_SOURCE): 0.47.0's dense-TP replica ids refuse a
    TP != ETP load, 0.48.0rc1's expert-TP ids do not; no second bug on complete static state."""
    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp1-ep4")
    assert cell.expected_under(rules_for("0.47.0", "0.19.2")) == Expected.FAIL_LOAD
    assert cell.expected_under(rules_for("0.48.0rc1", "0.19.2")) == Expected.PASS
    same = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp1-etp1-ep2")
    assert same.expected_under(rules_for("0.47.0", "0.19.2")) == Expected.PASS


def test_a_pair_without_a_rule_for_the_kind_predicts_nothing(tmp_path):
    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp1-etp1-ep2")
    assert rules_for("0.47.0", "0.15.3").kind_rule(STATIC_BLOCK) is None
    assert cell.expected_under(rules_for("0.47.0", "0.15.3")) == Expected.RULE_UNKNOWN


def test_a_user_recipe_file_has_no_forecast(tmp_path):
    assert recipe_facts(MINE_FILE) is None  # judged by its recorded kinds (tests/test_kinds.py)
    assert recipe_facts(None) is recipe_facts(DEFAULT_RECIPE)  # records before the axis


def test_the_forecast_is_checked_against_what_the_save_recorded():
    """The catalogue forecasts per family on the model's families; a save that recorded other
    kinds for a family (or a family it does not forecast) disagrees; a forecast family the save
    recorded nothing for does not (the aggressive recipe's Mamba projections on a plain GPT)."""
    plain = ("experts", "other")
    ultra = forecast(ULTRA_4O6, plain)
    assert ultra == {"experts": [STATIC_BLOCK]}  # its FP8 shared experts: not on a plain GPT
    assert disagreement(ULTRA_4O6, ultra, {"experts": [STATIC_BLOCK]}) is None
    assert "the forecast" in disagreement(ULTRA_4O6, ultra, {"experts": ["scalar"]})
    assert disagreement(ULTRA_4O6, ultra, {"experts": [STATIC_BLOCK], "other": ["scalar"]})
    aggressive = "mtq:MAMBA_MOE_NVFP4_AGGRESSIVE_CFG"
    assert disagreement(aggressive, forecast(aggressive, plain), {"experts": ["scalar"]}) is None
    assert disagreement(MINE_FILE, forecast(MINE_FILE, plain), {"experts": ["scalar"]}) is None


@pytest.fixture(scope="module")
def surveyed():
    """What the recipe survey (ModelOpt's own config matching and calibration, in a process of
    its own: harness/rank/recipe_survey.py) makes of each known recipe on the cpu tier's model."""
    from harness.rank.recipe_survey import in_own_process

    return {r["recipe"]: r for r in in_own_process(sorted(KNOWN_RECIPES), timeout_s=600)["rows"]}


@pytest.mark.slow  # a real survey of the hand catalogue; the committed forecast file is ModelOpt's own matching
@pytest.mark.parametrize("ref", sorted(KNOWN_RECIPES))
def test_the_catalogue_says_what_modelopt_configures(surveyed, ref):
    """Every module family the survey model has (routed and shared experts, attention) gets the
    kind the catalogue forecasts for it, or none when the catalogue leaves it unquantized."""
    facts = KNOWN_RECIPES[ref]
    forecast_kinds = surveyed[ref]["forecast"]
    for family, kinds in forecast_kinds.items():
        assert kinds == [facts.kinds.get(family)], (ref, family, kinds, facts.kinds)
    assert "experts" in forecast_kinds, f"{ref} quantizes no expert weight here"


def test_the_recorded_refusal_is_judged_a_known_refusal_not_the_bug():
    """The H100 run's ETP 1 -> 2 load of the Ultra recipe (tests/data/runs) re-judged: the
    global-shape refusal is the limitation the rule predicts, never `bug-reproduced`."""
    from harness.check.refusals import is_bug, is_shape_refusal
    from harness.records import CauseKind, StageCause

    text = ("CheckpointException ranks:dict_keys([0]) ... megatron.core.dist_checkpointing.core."
            "CheckpointingException: Global shape mismatch for loaded (torch.Size([4096, 1])) and "
            "expected ((8192, 1)) tensor for key decoder.layers.0.mlp.experts.experts.1.linear_fc1."
            "weight_quantizer._amax")
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION,
                       exc_type="torch.distributed.checkpoint.api.CheckpointException", message=text,
                       key=None)
    assert is_shape_refusal(cause) and not is_bug(cause, rules_for("0.47.0", "0.19.2"))


def test_a_static_recipe_on_the_cpu_tier_is_refused_before_any_rank(tmp_path):
    """ModelOpt's static block fake quantization needs triton on a GPU (on this machine's cpu
    tier: "RuntimeError static_blockwise_fp4_fake_quant requires triton"): one line, at planning."""
    (tmp_path / "s.toml").write_text(f'tier = "cpu"\nbackend = "local"\nrecipe = "{SUPER_MSE}"\n'
                                     'saves = ["tp1-etp1-ep1"]\n')
    (tmp_path / "good.toml").write_text('tier = "cpu"\nbackend = "local"\nsaves = ["tp1-etp1-ep1"]\n')
    good, bad = load_all_with_errors(tmp_path)
    assert [s.name for s in good] == ["good"]
    (err,) = bad
    assert "\n" not in str(err) and "s.toml: recipe: nvfp4-mse calibrates static NVFP4 experts" in str(err)
    assert "not cpu" in str(err)


# --- the fix's opt-in part (f), asked for by a scenario's fix_parts -----------------------
PART_F = "static-block"  # moe_ckpt_fix UNPROVEN_PARTS / STATIC_BLOCK_PART


def _patched_cell(tmp_path, recipe, save, load, parts=()):
    path = tmp_path / "p.toml"
    asked = f"fix_parts = {list(parts)!r}\n".replace("'", '"') if parts else ""
    path.write_text(GPU_HEAD + f'patch = "fix"\n{asked}recipe = "{recipe}"\nsaves = ["{save}"]\n'
                    f'loads = ["{load}"]\n')
    return next(c for c in load_scenario(path).cells() if c.load)


@pytest.mark.parametrize("modelopt", ["0.47.0", "0.48.0rc1"])
def test_under_part_f_static_blocks_reshard_across_expert_tp(tmp_path, modelopt):
    """Read from moe_ckpt_fix/static_block.py (the block _amax saved whole in ModelOpt's ETP-1
    format, cut to the rank's part at load; calibration allowed at ETP > 1): with part (f) a load
    at another expert TP passes; a patched cell without it keeps the refusal."""
    rules = rules_for(modelopt, "0.19.2")
    fixed = rules.kind_rule(STATIC_BLOCK, "experts", (PART_F,))
    assert fixed.reshard == Expected.PASS and fixed.save_refused_split is None
    for parts in ((), ("expert-amax",)):
        assert rules.kind_rule(STATIC_BLOCK, "experts", parts).reshard == Expected.RESHARD_REFUSED
    assert rules.kind_rule(STATIC_BLOCK, "shared_experts", (PART_F,)) is rules.kind_rule(
        STATIC_BLOCK, "shared_experts")  # part (f) is the routed experts' only
    for save, load in (("tp1-etp1-ep4", "tp2-etp2-ep2"), ("tp2-etp2-ep2", "tp4-etp4-ep1"),
                       ("tp2-etp2-ep2", "tp1-etp1-ep4")):
        assert _patched_cell(tmp_path, ULTRA_4O6, save, load, (PART_F,)).expected_under(rules) == Expected.PASS
    plain = _patched_cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp2-ep2")
    assert plain.expected_under(rules) == Expected.RESHARD_REFUSED
    assert rules_for(modelopt, "0.15.3").kind_rule(STATIC_BLOCK, "experts", (PART_F,)) is None


def test_a_static_recipe_saves_at_expert_tp_above_one_only_when_part_f_is_asked_for(tmp_path):
    body = f'patch = "fix"\nrecipe = "{ULTRA_4O6}"\nsaves = ["tp2-etp2-ep2"]\nloads = ["tp4-etp4-ep1"]\n'
    path = tmp_path / "s.toml"
    path.write_text(GPU_HEAD + body)
    with pytest.raises(ScenarioError, match="refuses at expert TP > 1"):
        load_scenario(path)
    path.write_text(GPU_HEAD + f'fix_parts = ["{PART_F}"]\n' + body)
    assert {c.save.id for c in load_scenario(path).cells()} == {"tp2-etp2-ep2-pp1"}


@pytest.mark.parametrize("text, words", [
    (f'patch = "fix"\nfix_part = ["{PART_F}"]\n', "did you mean 'fix_parts'"),
    ('patch = "fix"\nfix_parts = ["static-blok"]\n', "did you mean 'static-block'"),
    (f'fix_parts = ["{PART_F}"]\n', "needs patch = 'fix'"),
    (f'patch = "fix"\nfix_parts = "{PART_F}"\n', "expected an array"),
])
def test_a_bad_fix_parts_key_is_one_line(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(GPU_HEAD + text + 'saves = ["tp1-etp1-ep4"]\n')
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario(path)
    assert "fix_part" in str(err.value) and "\n" not in str(err.value)


def test_part_f_is_another_checkpoint_and_another_pool(tmp_path):
    """A stage with part (f) installs what one without it does not (the fix cannot be undone in
    a process): never the same save directory, never the same warm pool."""
    from harness.launch.pool import PoolKey
    from harness.run.cell import rank_env

    with_f = _patched_cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp2-ep2", (PART_F,))
    without = _patched_cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp2-ep2")
    assert with_f.save_id != without.save_id
    keys = [PoolKey.of(4, "gpu-shared", "fix", "te", tmp_path, rank_env(c.scenario)) for c in (with_f, without)]
    assert keys[0] != keys[1]
    assert dict(keys[0].env)["MOE_CKPT_FIX_UNPROVEN"] == PART_F
    assert PART_F not in dict(keys[1].env)["MOE_CKPT_FIX_UNPROVEN"].split(",")


def test_the_ranks_are_asked_for_exactly_the_scenarios_parts(monkeypatch):
    """A part the controller's environment names is not passed on unless the scenario asks for
    it; a version it names (0.48.0rc1) is kept."""
    from harness.run.cell import fix_env

    monkeypatch.setenv("MOE_CKPT_FIX_UNPROVEN", f"0.48.0rc1,{PART_F}")
    assert fix_env(()) == {"MOE_CKPT_FIX_UNPROVEN": "0.48.0rc1"}
    assert fix_env((PART_F,)) == {"MOE_CKPT_FIX_UNPROVEN": f"0.48.0rc1,{PART_F}"}
