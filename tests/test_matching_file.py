"""harness/check/matching.py as a unit: the forecast file of a ModelOpt release (one per release,
``modelopt-<release>.json``, written by ``python -m harness recipes`` from the survey's document)
and what ``matched`` and ``library`` read from it. The documents are written here by hand in the
survey's own shape (harness/rank/recipe_survey.py ``main``: per row the recipe and its forecast
kinds per family, or why it was left out), so each reason can be checked against the row that
gives it. Pure: no survey runs (tests/test_matching_forecast.py runs a real one). The mutation
run over matching.py (docs/mutation.md) found these branches untested."""
from __future__ import annotations

import json

import pytest

from harness.check import matching
from harness.check.matching import MAKER, Matched, forecast_file, library, matched, write
from harness.model.recipes import EXPERTS, OTHER, SCALAR, SHARED_EXPERTS, STATIC_BLOCK

pytestmark = pytest.mark.cpu

MODEL = "cpu tier: a test's model"
LEFT_OUT = "quantizes no routed-expert weight (kv cache only)"
DEFAULT_WHY = "it configures no routed-expert weight quantizer"


def _doc(modelopt="0.47.0"):
    """A survey's document as harness/rank/recipe_survey.py writes it, rows in no order."""
    return {"modelopt": modelopt, "model": MODEL, "rows": [
        {"recipe": "mtq:ZZ_BOTH", "forecast": {OTHER: [STATIC_BLOCK], EXPERTS: [SCALAR, STATIC_BLOCK]}},
        {"recipe": "mtq:KV_ONLY", "left_out": LEFT_OUT},
        {"recipe": "mtq:DENSE_ONLY", "forecast": {OTHER: [SCALAR]}},
        {"recipe": "mtq:NO_WORDS"},
        {"recipe": "mtq:AA_EXPERTS", "forecast": {EXPERTS: [SCALAR], SHARED_EXPERTS: [SCALAR]}},
    ]}


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "forecasts"
    write(_doc(), root)
    return root


def test_the_forecast_file_is_named_by_the_release_not_the_build(tmp_path):
    assert forecast_file("0.47.0+g1234", tmp_path) == tmp_path / "modelopt-0.47.0.json"
    assert forecast_file("0.48.0rc1.dev3", tmp_path) == tmp_path / "modelopt-0.48.0rc1.json"
    assert forecast_file("0.47.0") == matching.FORECAST_DIR / "modelopt-0.47.0.json"


def test_the_written_file_keeps_each_rows_forecast_or_why_sorted_by_recipe(root):
    path = root / "modelopt-0.47.0.json"
    doc = json.loads(path.read_text())
    assert doc["generated_by"] == MAKER and doc["modelopt"] == "0.47.0" and doc["model"] == MODEL
    assert list(doc["rows"]) == sorted(doc["rows"]) == [
        "mtq:AA_EXPERTS", "mtq:DENSE_ONLY", "mtq:KV_ONLY", "mtq:NO_WORDS", "mtq:ZZ_BOTH"]
    assert doc["rows"]["mtq:KV_ONLY"] == {"left_out": LEFT_OUT}
    assert doc["rows"]["mtq:NO_WORDS"] == {"left_out": ""}
    assert doc["rows"]["mtq:DENSE_ONLY"] == {"forecast": {OTHER: [SCALAR]}}


def test_write_returns_the_release_file(tmp_path):
    assert write(_doc("0.48.0rc1+gabc"), tmp_path) == tmp_path / "modelopt-0.48.0rc1.json"


def test_matched_gives_every_family_the_forecast_names_in_family_order(root):
    got = matched("mtq:ZZ_BOTH", "0.47.0+g1", root=root)
    assert got == Matched({EXPERTS: [SCALAR, STATIC_BLOCK], OTHER: [STATIC_BLOCK]})
    assert got.why is None and list(got.kinds) == [EXPERTS, OTHER]


def test_matched_keeps_only_the_families_the_model_has(root):
    assert matched("mtq:AA_EXPERTS", "0.47.0", (EXPERTS, OTHER), root) == Matched({EXPERTS: [SCALAR]})
    assert matched("mtq:AA_EXPERTS", "0.47.0", (EXPERTS, SHARED_EXPERTS, OTHER), root) == Matched(
        {EXPERTS: [SCALAR], SHARED_EXPERTS: [SCALAR]})


def test_without_the_routed_experts_the_forecast_is_none_and_says_why(root):
    where = f"{root / 'modelopt-0.47.0.json'}, written by `{MAKER}`"
    # a model whose families leave the experts out
    got = matched("mtq:ZZ_BOTH", "0.47.0", (OTHER,), root)
    assert got.kinds is None
    assert got.why == f"ModelOpt 0.47.0's own matching gives the routed experts no kind: {DEFAULT_WHY} ({where})"
    # a recipe that configures only dense linears
    assert matched("mtq:DENSE_ONLY", "0.47.0", None, root).why == got.why
    # a recipe left out: its own words; left out with none: the default
    got = matched("mtq:KV_ONLY", "0.47.0", None, root)
    assert got.kinds is None and got.why == (f"ModelOpt 0.47.0's own matching gives the routed "
                                             f"experts no kind: {LEFT_OUT} ({where})")
    assert matched("mtq:NO_WORDS", "0.47.0", None, root).why.endswith(f": {DEFAULT_WHY} ({where})")


def test_a_recipe_the_library_lacks_is_named(root):
    got = matched("mtq:NOT_THERE", "0.47.0+g1", root=root)
    assert got == Matched(None, f"ModelOpt 0.47.0's library has no recipe mtq:NOT_THERE "
                                f"({root / 'modelopt-0.47.0.json'}, written by `{MAKER}`)")


@pytest.mark.parametrize("modelopt", [None, ""])
def test_an_unknown_release_has_no_matching(root, modelopt):
    assert matched("mtq:AA_EXPERTS", modelopt, root=root) == Matched(
        None, "the ModelOpt release is not known, so neither is its matching")


@pytest.mark.parametrize("content", [None, "[]", '{"rows": []}', '{"rows": null}', "{not json"])
def test_a_release_without_a_readable_forecast_says_it_was_not_computed(tmp_path, content):
    path = tmp_path / "modelopt-0.46.0.json"
    if content is not None:
        path.write_text(content)
    got = matched("mtq:AA_EXPERTS", "0.46.0+g9", root=tmp_path)
    assert got == Matched(None, f"ModelOpt 0.46.0's own matching was not computed here (no {path}, "
                                f"written by `{MAKER}`)")
    with pytest.raises(ValueError) as err:
        library("0.46.0", tmp_path)
    assert str(err.value) == f"no forecast of ModelOpt 0.46.0's library ({path}; run `{MAKER}` under it)"


def test_the_committed_forecast_is_named_relative_to_the_repository():
    got = matched("mtq:NOT_THERE", "0.47.0")
    assert got.why.endswith("(harness/check/forecasts/modelopt-0.47.0.json, written by "
                            "`python -m harness recipes`)")


def test_the_library_is_every_recipe_with_a_routed_expert_kind_sorted(root):
    assert library("0.47.0+g1", root) == ["mtq:AA_EXPERTS", "mtq:ZZ_BOTH"]


def test_writing_a_release_again_is_what_is_read_next(root):
    assert matched("mtq:AA_EXPERTS", "0.47.0", root=root).kinds == {EXPERTS: [SCALAR], SHARED_EXPERTS: [SCALAR]}
    doc = _doc()
    doc["rows"] = [{"recipe": "mtq:AA_EXPERTS", "forecast": {EXPERTS: [STATIC_BLOCK]}}]
    write(doc, root)
    assert matched("mtq:AA_EXPERTS", "0.47.0", root=root).kinds == {EXPERTS: [STATIC_BLOCK]}
    assert library("0.47.0", root) == ["mtq:AA_EXPERTS"]


def test_the_forecast_returned_is_a_copy_of_the_files(root):
    got = matched("mtq:AA_EXPERTS", "0.47.0", root=root)
    got.kinds[EXPERTS].append("changed")
    assert matched("mtq:AA_EXPERTS", "0.47.0", root=root).kinds[EXPERTS] == [SCALAR]


@pytest.mark.parametrize("release", ["0.47.0", "0.48.0rc1"])
def test_rewriting_a_committed_forecast_from_its_own_rows_gives_the_same_bytes(tmp_path, release):
    """``python -m harness recipes`` run again on the same matching leaves the committed file as
    it is (no churn in its key order): the document read back as the survey's rows, written
    again, is byte-equal."""
    committed = matching.FORECAST_DIR / f"modelopt-{release}.json"
    doc = json.loads(committed.read_text())
    survey = {"modelopt": doc["modelopt"], "model": doc["model"],
              "rows": [{"recipe": ref, **row} for ref, row in reversed(doc["rows"].items())]}
    assert write(survey, tmp_path).read_bytes() == committed.read_bytes()
