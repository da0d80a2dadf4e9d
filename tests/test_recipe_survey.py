"""The whole library: `python -m harness recipes` enumerates what the installed
ModelOpt ships (never a hand-kept list), forecasts each recipe's amax kinds per module family from
its configuration through ModelOpt's own matching, and a recipe ModelOpt refuses is
`not-quantizable`, carrying ModelOpt's exception, never `rule-unknown` or `unexpected-failure`.

Expectations come from ModelOpt's configs (INT8 SmoothQuant quantizes weights per channel, axis
0; FP8_KV_CFG names only KV-cache quantizers; NVFP4_DEFAULT_CFG dynamic NVFP4 blocks, one scalar
amax each) and from the rules of harness/check/versions.py (a kind with no rule, a rule
that leaves a reshard undecided).
"""
from __future__ import annotations

import os

import pytest

from harness.check import judge
from harness.check.rejudge import rejudge_record
from harness.check.versions import rules_for
from harness.records import CauseKind, CellRecord, StageCause, StageResult
from harness.scenario.scenarios import load_scenario
from tests.helpers import own_recipe_job

pytestmark = pytest.mark.cpu


def test_every_recipe_file_of_the_library_is_enumerated_and_no_fragment(tmp_path, monkeypatch):
    """A file a new release adds is enumerated with no code change; configs/ holds fragments."""
    from harness.model import recipes
    from harness.rank.recipe_survey import library_files

    for rel in ("configs/numerics/nvfp4.yaml", "general/ptq/new_recipe.yaml",
                "models/acme/Big-1T/ptq/nvfp4.yml", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x: 1\n")
    monkeypatch.setattr(recipes, "builtin_library", lambda: tmp_path)
    assert library_files() == ["modelopt:general/ptq/new_recipe", "modelopt:models/acme/Big-1T/ptq/nvfp4"]


def test_every_quantize_config_constant_is_enumerated():
    import modelopt.torch.quantization as mtq

    from harness.rank.recipe_survey import mtq_constants

    got = mtq_constants()
    assert "mtq:NVFP4_DEFAULT_CFG" in got and "mtq:FP8_KV_CFG" in got
    assert all(isinstance(getattr(mtq, r.removeprefix("mtq:")), dict) for r in got)
    assert len(got) == len({n for n in dir(mtq) if n.endswith("_CFG")
                            and "quant_cfg" in (getattr(mtq, n) if isinstance(getattr(mtq, n), dict) else {})})


@pytest.fixture(scope="module")
def rows():
    from harness.rank.recipe_survey import in_own_process

    refs = ["mtq:NVFP4_DEFAULT_CFG", "mtq:FP8_KV_CFG", "mtq:INT8_SMOOTHQUANT_CFG"]
    return {r["recipe"]: r for r in in_own_process(refs, timeout_s=600)["rows"]}


def test_the_survey_forecasts_from_the_config_and_calibrates_on_the_cpu_model(rows):
    every = {"experts": ["scalar"], "other": ["scalar"], "shared_experts": ["scalar"]}
    assert rows["mtq:NVFP4_DEFAULT_CFG"]["forecast"] == every
    assert rows["mtq:NVFP4_DEFAULT_CFG"]["calibrated"] == every
    assert rows["mtq:FP8_KV_CFG"]["left_out"] == "quantizes no routed-expert weight"
    assert rows["mtq:INT8_SMOOTHQUANT_CFG"]["forecast"]["experts"] == ["per-channel"]


def test_the_table_says_what_was_derived_where_and_which_rule_is_missing():
    from harness.report.recipes import table

    doc = {"modelopt": "0.47.0", "model": "cpu tier", "rows": [
        {"recipe": "mtq:A_CFG", "algorithm": "max", "forecast": {"experts": ["scalar"]},
         "calibrated": {"experts": ["scalar"]}},
        {"recipe": "mtq:B_CFG", "algorithm": "awq_lite", "forecast": {"experts": ["per-block"]},
         "refused": "AttributeError: 'X' object has no attribute 'weight'", "needs_gpu": False},
        {"recipe": "mtq:C_CFG", "algorithm": "mse", "forecast": {"experts": ["static-block"]},
         "refused": "RuntimeError: needs triton", "needs_gpu": True},
        {"recipe": "mtq:KV_CFG", "left_out": "quantizes no routed-expert weight"}]}
    text = table(doc, rules_for("0.47.0", "0.19.2"))
    row = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| mtq:")}
    assert "calibrated: as forecast" in row["mtq:A_CFG"] and row["mtq:A_CFG"].endswith("| every kind |")
    assert "not-quantizable: AttributeError" in row["mtq:B_CFG"]
    # the per-block experts' rule, its ETP change decided on the GPU
    assert row["mtq:B_CFG"].endswith("| every kind |")
    assert "needs a GPU" in row["mtq:C_CFG"] and "not-quantizable" not in row["mtq:C_CFG"]
    assert "TE grouped experts" in text and "Distinct kind sets: 3" in text
    # a kind no pair has a rule for is named as such
    doc["rows"] = [{"recipe": "mtq:D_CFG", "algorithm": "max", "forecast": {"experts": ["shaped(8, 1)"]},
                    "calibrated": {"experts": ["shaped(8, 1)"]}}]
    assert "| no rule: shaped(8, 1) experts |" in table(doc, rules_for("0.47.0", "0.19.2"))
    assert "- quantizes no routed-expert weight: 1 (mtq:KV_CFG)" in text


# --- not-quantizable ----------------------------------------------------------------------------

def _raising_in(filename: str, exc: str):
    """A function whose frame lives in ``filename`` (ModelOpt's code, or not), raising ``exc``."""
    ns: dict = {}
    exec(compile(f"def calibrate(*a, **k):\n    raise {exc}\n", filename, "exec"), ns)
    return ns["calibrate"]


@pytest.mark.parametrize("filename, wrapped", [
    ("/site-packages/modelopt/torch/quantization/model_calib.py", True),
    ("/site-packages/megatron/core/transformer/moe/experts.py", False),
])
def test_only_modelopts_own_exception_is_its_refusal(monkeypatch, filename, wrapped):
    import modelopt.torch.quantization as mtq

    from harness.model import quant

    monkeypatch.setattr(mtq, "quantize", _raising_in(
        filename, "AttributeError(\"'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'\")"))
    with pytest.raises(Exception) as err:
        quant.quantize(None, None, None, "mtq:NVFP4_AWQ_LITE_CFG")
    assert isinstance(err.value, quant.NotQuantizable) == wrapped
    if wrapped:
        assert str(err.value).startswith("AttributeError: 'QuantTEColumnParallelGroupedLinear'")


HEAD = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\n'
AWQ = "AttributeError: 'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'"


def _refused_save() -> StageResult:
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION, exc_type="harness.model.quant.NotQuantizable",
                       message=AWQ, key=None)
    return StageResult(stage="save", ok=False, wall_s=1.0, cause=cause,
                       environment={"nvidia-modelopt": "0.47.0", "megatron-core": "0.19.2"})


@pytest.mark.parametrize("recipe", ["mtq:NVFP4_AWQ_LITE_CFG", "mtq:NVFP4_DEFAULT_CFG"])
def test_a_recipe_modelopt_refuses_is_not_quantizable_whatever_was_expected(tmp_path, recipe):
    """No forecast (AWQ-lite: rule-unknown before the save) or a forecast that expects a pass:
    the save stage's refusal is `not-quantizable`, for the save and for every load of it, and
    re-judging keeps it."""
    path = tmp_path / "c.toml"
    path.write_text(HEAD + f'recipe = "{recipe}"\nsaves = ["tp1-etp1-ep4"]\nloads = ["tp1-etp1-ep2"]\n')
    for cell in load_scenario(path).cells():
        rec = CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                         save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
                         patch="none", expected="", modelopt="0.47.0", mcore="0.19.2", recipe=recipe)
        rec = judge.judge_cell(rec, cell.plan, _refused_save(), None)
        assert rec.outcome == "not-quantizable", (rec.outcome, rec.reason)
        assert AWQ in rec.reason and recipe in rec.reason
        assert rejudge_record(rec, cell.plan)["outcome"] == "not-quantizable"


def test_the_verdict_of_a_job_whose_recipe_modelopt_refuses(tmp_path):
    """Nothing about checkpoints can be decided: NOT QUANTIZABLE, naming ModelOpt's exception."""
    from harness.report import verdict

    recipe = "mtq:NVFP4_AWQ_LITE_CFG"
    quarantine, scenarios = own_recipe_job(tmp_path, recipe, "tp1-etp1-ep4", ["tp2-etp1-ep4"])
    records = {}
    for c in scenarios[0].cells():
        records[c.id] = {"cell_id": c.id, "tier": "gpu-shared", "backend": "te", "patch": "none",
                         "save_topology": c.save.id, "load_topology": c.load.id if c.load else None,
                         "modelopt": "0.47.0", "mcore": "0.19.2", "recipe": recipe,
                         "expected": "rule-unknown", "outcome": "rule-unknown", "failed_stage": "save",
                         "exception_type": "harness.model.quant.NotQuantizable", "message": AWQ}
    (v,) = verdict.judge_records(records, quarantine, scenarios)
    assert v.word == verdict.NOT_QUANTIZABLE and AWQ in v.detail, (v.word, v.detail)


# --- whose exception: ModelOpt's refusal or another's (harness/model/quant.py raised_in_modelopt) --
def _raise_from(filename: str, body: str):
    """Run ``body`` (it raises) as code of ``filename``, and return the exception."""
    import torch

    ns = {"torch": torch}
    exec(compile(f"def f():\n    {body}\n", filename, "exec"), ns)
    try:
        ns["f"]()
    except Exception as exc:  # noqa: BLE001 - the exception is what is checked
        return exc
    raise AssertionError("did not raise")


def test_a_torch_refusal_of_modelopts_own_call_is_modelopts():
    """AWQ on TE grouped experts (GPU, 2026-12-06): ModelOpt asks ``module.weight`` and
    ``torch.nn.Module.__getattr__`` raises: the innermost frame is torch's, the caller ModelOpt."""
    from harness.model.quant import raised_in_modelopt

    exc = _raise_from("/site/modelopt/torch/quantization/model_calib.py",
                      "torch.nn.Linear(2, 2, bias=False).bias_missing_attribute")
    assert isinstance(exc, AttributeError) and raised_in_modelopt(exc)


def test_a_failure_of_the_harness_or_megatron_is_not_modelopts():
    from harness.model.quant import raised_in_modelopt

    for filename in ("/repo/harness/model/gpt.py", "/site/megatron/core/models/gpt/gpt_model.py"):
        exc = _raise_from(filename, "torch.nn.Linear(2, 2, bias=False).bias_missing_attribute")
        assert not raised_in_modelopt(exc), filename
    assert raised_in_modelopt(_raise_from("/site/modelopt/torch/opt/dynamic.py",
                                          "raise ValueError('refused')"))


def test_the_survey_process_keeps_the_callers_pythonpath(monkeypatch):
    """A ModelOpt release put ahead of the base one on PYTHONPATH (tools/matrix-env.sh, system
    mode) is the one surveyed: the survey's own process keeps that path after the repository's."""
    import harness.bounded
    from harness.paths import REPO_ROOT
    from harness.rank import recipe_survey

    seen = {}

    def fake_run(argv, timeout_s, **kw):
        seen.update(kw["env"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(harness.bounded, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/opt/modelopt-next")
    with pytest.raises(RuntimeError, match="stop here"):
        recipe_survey.in_own_process(["mtq:NVFP4_DEFAULT_CFG"])
    assert seen["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/opt/modelopt-next"]


def test_a_modelopt_whose_megatron_plugin_did_not_register_is_refused_not_surveyed(monkeypatch):
    """ModelOpt 0.48.0rc1 without Transformer Engine converts no megatron-core linear: the survey
    says so in one line instead of forecasting "no routed-expert weight" for every recipe."""
    import torch

    from harness.rank import recipe_survey

    monkeypatch.setattr(recipe_survey, "survey_model", lambda: (torch.nn.Sequential(), None))
    with pytest.raises(recipe_survey.SurveyImpossible, match="converted none of megatron-core's linear"):
        recipe_survey._check_the_plugin_converts("0.48.0rc1")
