"""MTP at pipeline depth > 1: the model's position embedding is a scenario's
choice, every record names it, and megatron-core's own refusal of a learned absolute one at
pp > 1 with MTP is a rule of its own (harness/check/versions.py MTP_POSITION_EMBEDDING), judged
``known-refusal``, never ``unexpected-failure`` and never the collision.

Expectations come from megatron-core 0.19.2's code (paths under megatron/core/): the MTP block
sits on the last pipeline stage (transformer/multi_token_prediction.py:651-656), which builds its
own LanguageModelEmbedding (models/gpt/gpt_model.py:167-175); a learned absolute position
embedding is a parameter of it (models/common/embeddings/language_model_embedding.py:44, :66-69)
that LanguageModule.sharded_state_dict does not tie to the first stage's (language_module.py:
441-449 ties the word embedding only), so both stages hold it with replica id (0, tp, dp)
(utils.py:1149-1150) and validation counts two main replicas (dist_checkpointing/validation.py:
437-443). With no position embedding (``none``) there is no such key. Nothing here is taken from
the harness's own output.
"""
from __future__ import annotations

import io

import pytest

from harness.check import judge
from harness.check.decision import decide
from harness.model.gpt import ModelSize
from harness.records import CauseKind, CellRecord, StageCause, StageResult
from harness.scenario.scenarios import load_scenario

pytestmark = pytest.mark.cpu

KEY = "embedding.position_embeddings.weight"
MCORE_EXC = "megatron.core.dist_checkpointing.core.CheckpointingException"
TE = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\n'


def _scenario(tmp_path, save, loads, mtp=1, position=None, patch="none", name="m", head=TE):
    model = (f"mtp_num_layers = {mtp}\n" if mtp else "")
    model += f'position_embedding_type = "{position}"\n' if position else ""
    path = tmp_path / f"{name}.toml"
    path.write_text(head + f'name = "{name}"\npatch = "{patch}"\nsaves = ["{save}"]\n'
                    f"loads = [{', '.join(repr(t) for t in loads)}]\n"
                    + (f"[model]\n{model}" if model else "").replace("'", '"'))
    return load_scenario(path)


def _cell(scenario, load=None):
    return next(c for c in scenario.cells() if (c.load.id if c.load else None) == load)


# --- the rule fires only for MTP + learned absolute + a stage at pp > 1 --------------------------

@pytest.mark.parametrize("mtp, position, save, load, modelopt, mcore, word", [
    # the issue's cell: saved at pp 1, reloaded at pp 2, the default (learned absolute) embedding
    (1, None, "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.19.2", "mtp-embedding-refused"),
    (1, "learned_absolute", "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.19.2", "mtp-embedding-refused"),
    # no position embedding (Nemotron-3): no second replica, nothing refused
    (1, "none", "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.19.2", "pass"),
    # no MTP: the last stage builds no embedding (gpt_model.py:167: pre_process or mtp_process)
    (None, None, "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.19.2", "pass"),
    # pp 1: the MTP block sits on the only stage, which is the first (one embedding)
    (1, None, "tp1-etp1-ep2", "tp1-etp1-ep2", "0.48.0rc1", "0.19.2", "pass"),
    # a save at pp 2 meets it at the save: the save-only cell and the load cell alike
    (1, None, "tp1-etp1-ep1-pp2", None, "0.48.0rc1", "0.19.2", "mtp-embedding-refused"),
    (1, None, "tp1-etp1-ep1-pp2", "tp1-etp1-ep2", "0.48.0rc1", "0.19.2", "mtp-embedding-refused"),
    # 0.47.0 collides at a TP != ETP save first: the save is refused before any pp-2 load
    (1, None, "tp2-etp1-ep2", "tp2-etp1-ep2-pp2", "0.47.0", "0.19.2", "fail-save"),
    # the same save with the fix passes; the pp-2 reload meets megatron-core's refusal
    (1, None, "tp2-etp1-ep2", "tp2-etp1-ep2-pp2", "0.47.0+fix", "0.19.2", "mtp-embedding-refused"),
    # a megatron-core whose sources were not read for it: nothing is predicted
    (1, None, "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.16.1", "rule-unknown"),
    (1, "none", "tp1-etp1-ep2", "tp1-etp1-ep1-pp2", "0.48.0rc1", "0.16.1", "pass"),
])
def test_the_rule_fires_only_for_mtp_with_a_learned_position_embedding_at_pp2(
        tmp_path, mtp, position, save, load, modelopt, mcore, word):
    modelopt, _, fix = modelopt.partition("+")
    scenario = _scenario(tmp_path, save, [load] if load else [], mtp, position,
                         patch="fix" if fix else "none")
    d = decide(_cell(scenario, scenario.loads[0].id if load else None).plan, modelopt, mcore)
    assert d.expected == word, (d.expected, d.notice)
    if word == "rule-unknown":
        assert "learned absolute position embedding" in d.notice and "0.19.2" in d.notice, d.notice


# --- judged by megatron-core's words on that key --------------------------------------------------

def _record(cell) -> CellRecord:
    return CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                      save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
                      patch=cell.scenario.patch, expected="", modelopt="0.48.0rc1", mcore="0.19.2")


ENV = {"nvidia-modelopt": "0.48.0rc1", "megatron-core": "0.19.2"}


def _ran(stage, topo, ok=True, key=None):
    """A stage every rank of ``topo`` ran with validation on; failed: megatron-core's validation
    message on ``key`` (dist_checkpointing/validation.py:441 and :403)."""
    cause = None
    if not ok:
        cause = StageCause(rank=0, kind=CauseKind.EXCEPTION, exc_type=MCORE_EXC, key=key,
                           message="Invalid sharding pattern validation. Errors: Invalid access "
                                   f"pattern for ShardedTensor(key='{key}', ...): tensor([[2]])")
    ran = {"topology": topo.id, "validated": True, "expert_weight_amax_keys": 16}
    verify = {"mismatch_count": 0, "mismatches": [], "missing_keys": [], "unexpected_keys": []}
    ranks = {str(r): {("saved" if stage == "save" else "loaded"): ran, "verify": verify}
             for r in range(topo.world_size)}
    return StageResult(stage=stage, ok=ok, wall_s=1.0, environment=ENV, cause=cause, rank_results=ranks)


def test_a_pp2_reload_refused_on_the_position_embedding_is_a_known_refusal(tmp_path):
    cell = _cell(_scenario(tmp_path, "tp1-etp1-ep2", ["tp1-etp1-ep1-pp2"]), "tp1-etp1-ep1-pp2")
    rec = judge.judge_cell(_record(cell), cell.plan, _ran("save", cell.save),
                           _ran("load", cell.load, ok=False, key=KEY))
    assert (rec.expected, rec.outcome, rec.failing_key) == ("mtp-embedding-refused", "known-refusal", KEY)
    assert "language_module.py:441-449" in rec.reason and "not the collision" in rec.reason


def test_another_key_refused_there_is_not_the_known_refusal(tmp_path):
    """The rule names one key: megatron-core refusing any other at that load is unexpected."""
    cell = _cell(_scenario(tmp_path, "tp1-etp1-ep2", ["tp1-etp1-ep1-pp2"]), "tp1-etp1-ep1-pp2")
    other = "decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_quantizer._amax"
    rec = judge.judge_cell(_record(cell), cell.plan, _ran("save", cell.save),
                           _ran("load", cell.load, ok=False, key=other))
    assert rec.outcome == "unexpected-failure", rec.reason


def test_the_same_refusal_without_a_position_embedding_is_unexpected(tmp_path):
    """A model with none cannot have the key: a refusal naming it is no known refusal."""
    cell = _cell(_scenario(tmp_path, "tp1-etp1-ep2", ["tp1-etp1-ep1-pp2"], position="none"),
                 "tp1-etp1-ep1-pp2")
    rec = judge.judge_cell(_record(cell), cell.plan, _ran("save", cell.save),
                           _ran("load", cell.load, ok=False, key=KEY))
    assert (rec.expected, rec.outcome) == ("pass", "unexpected-failure")


def test_a_pp2_reload_that_passes_where_the_refusal_was_expected_is_unexpected_pass(tmp_path):
    cell = _cell(_scenario(tmp_path, "tp1-etp1-ep2", ["tp1-etp1-ep1-pp2"]), "tp1-etp1-ep1-pp2")
    rec = judge.judge_cell(_record(cell), cell.plan, _ran("save", cell.save), _ran("load", cell.load))
    assert rec.outcome == "unexpected-pass" and "defect is gone" in rec.reason


def test_a_pp2_save_refused_refuses_its_loads_as_known(tmp_path):
    scenario = _scenario(tmp_path, "tp1-etp1-ep1-pp2", ["tp1-etp1-ep2"])
    save_only, load = _cell(scenario), _cell(scenario, scenario.loads[0].id)
    refused = _ran("save", save_only.save, ok=False, key=KEY)
    rec = judge.judge_cell(_record(save_only), save_only.plan, refused, None)
    assert rec.outcome == "known-refusal" and rec.failed_stage == "save"
    rec = judge.judge_cell(_record(load), load.plan, refused, None)
    assert rec.outcome == "known-refusal" and rec.reason.startswith("blocked by the save at tp1-etp1-ep1-pp2")


# --- the record names the model's position embedding ----------------------------------------------

def test_every_record_names_the_position_embedding_and_older_records_read_as_the_kinds_own():
    gpt, none = ModelSize(), ModelSize(position_embedding_type="none")
    assert gpt.record()["position_embedding_type"] == "learned_absolute"
    assert none.record()["position_embedding_type"] == "none"
    assert ModelSize(kind="hybrid", hybrid_layer_pattern="M*ME").record()["position_embedding_type"] == "none"
    # the default named explicitly is the same model: same save id, same golden manifests
    assert repr(ModelSize(position_embedding_type="learned_absolute")) == repr(gpt)
    assert "position_embedding_type" not in gpt.as_dict()
    # a record made before the field built the GPT model's learned absolute embedding
    before = {k: v for k, v in gpt.record().items() if k != "position_embedding_type"}
    assert gpt.difference(before) is None
    assert none.difference(before) == "position_embedding_type learned_absolute recorded, none in the profile"


def test_the_scenarios_standing_for_the_jobs_modules_have_no_position_embedding():
    """The Nemotron-3 modules' scenarios build the jobs' model where it matters (MTP), the issue's
    cell among them; the plain and golden scenarios keep the learned absolute default."""
    from harness.scenario.scenarios import load_all

    by_name = {s.name: s for s in load_all()}
    for name in ("gpu-modules", "gpu-ultra-modules-witness", "gpu-super-modules-pp",
                 "gpu-super-modules-pp-witness"):
        assert by_name[name].size.position_embedding == "none", name
    assert by_name["gpu-super-modules-pp-learned-witness"].size.position_embedding == "learned_absolute"
    mtp = [s.name for s in by_name.values() if s.size.mtp_num_layers
           and s.size.position_embedding != "none" and not s.name.endswith("-learned-witness")]
    assert mtp == [], mtp
    issue = by_name["gpu-super-modules-pp"]
    assert [c.id for c in issue.cells()] == [
        "gpu-super-modules-pp[save=tp2-etp1-ep2-pp1,save-only]",
        "gpu-super-modules-pp[save=tp2-etp1-ep2-pp1,load=tp2-etp1-ep2-pp1]",
        "gpu-super-modules-pp[save=tp2-etp1-ep2-pp1,load=tp2-etp1-ep2-pp2]"]


# --- the cpu tier: megatron-core's real validation on gloo ranks -----------------------------------

CPU = 'tier = "cpu"\nbackend = "local"\nexpect = "oracle"\n'


@pytest.mark.parametrize("position", [pytest.param("none", marks=pytest.mark.slow), "learned_absolute"])
def test_cpu_tier_reloads_mtp_at_pp2_and_megatron_refuses_only_the_learned_embedding(tmp_path, position):
    """Saved at tp1-etp1-ep2 on 2 gloo ranks, reloaded at pp 2 (the MTP block on the second
    stage): with no position embedding every tensor loads (-m slow; an MTP layer saved and
    reloaded intact in `make test`: tests/test_modules.py); with the learned absolute one
    megatron-core's validation refuses its key, two main replicas, and the cell is the known
    refusal."""
    from harness import machine
    from harness.run.cells import run_cells

    reason = machine.tier_skip_reason("cpu", 2)
    if reason:
        pytest.skip(reason)
    s = _scenario(tmp_path, "tp1-etp1-ep2", ["tp1-etp1-ep1-pp2"], position=position,
                  name=f"cpu-mtp-{position.replace('_', '-')}", head=CPU)
    doc = run_cells([_cell(s, "tp1-etp1-ep1-pp2")], tmp_path / "results", "mtp", jobs=1, out=io.StringIO())
    (got,) = [c for c in doc["cells"] if c["load_topology"]]
    if position == "none":
        assert got["outcome"] == "pass", (got["outcome"], got.get("message"), got.get("reason"))
        assert got["verify"]["mismatch_count"] == 0 and got["model"]["position_embedding_type"] == "none"
        return
    assert (got["expected"], got["outcome"], got["failing_key"]) == (
        "mtp-embedding-refused", "known-refusal", KEY), got
    assert "tensor([[2]]" in got["message"]  # two main replicas of the one shard
    assert got["model"]["position_embedding_type"] == "learned_absolute"
