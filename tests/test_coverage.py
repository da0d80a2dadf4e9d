"""The "Not covered yet" list of docs/evidence.md is what the committed GPU runs leave uncovered
(harness/report/coverage.py reads tests/data/runs/): a recipe or module that gains a committed
run must leave the list, a known one without a run must be on it."""
from __future__ import annotations

import re

import pytest

from harness.paths import EVIDENCE_PAGE
from harness.report.coverage import MODULES, coverage, not_covered

pytestmark = pytest.mark.cpu


def _page_list() -> list[str]:
    text = EVIDENCE_PAGE.read_text()
    section = re.search(r"^## Not covered yet\n(.*?)(?=^#)", text, re.S | re.M)
    assert section, "docs/evidence.md has no '## Not covered yet' section"
    items = [line[2:].strip() for line in section.group(1).splitlines() if line.startswith("- ")]
    if not items:
        assert "\nnone.\n" in section.group(1), section.group(1)  # said, not left blank
    return items


def test_the_evidence_page_lists_exactly_what_has_no_committed_gpu_run():
    assert _page_list() == not_covered()


def test_every_scenario_recipe_and_module_is_accounted_for():
    """Every recipe a committed GPU scenario names and every module is listed; beyond them only
    recipes a committed GPU cell ran (sampled ones), each covered by that run."""
    from harness.model.recipes import Recipe
    from harness.scenario.scenarios import load_all
    from harness.tiers import on_cuda

    items = coverage()
    gpu = {s.recipe for s in load_all() if on_cuda(s.tier)}
    assert {"mtq:W4A8_AWQ_BETA_CFG", "mtq:NVFP4_FOUR_OVER_SIX_CFG"} <= gpu
    known = {f"recipe {Recipe.parse(ref).label}" for ref in gpu} | set(MODULES)
    assert known <= {i.name for i in items}
    assert all(i.covered_by for i in items if i.name not in known)


def test_a_recipe_with_a_committed_run_leaves_the_list(tmp_path):
    """A results file with one GPU cell of the Super recipe that ran: covered; skipped: not."""
    import json

    from harness.check.recipes import SUPER_MSE

    def write(outcome):
        doc = {"run_id": "t", "created": "now", "versions": {}, "tier": "gpu-shared", "cells": [
            {"scenario": "gpu-super-recipe-witness", "cell_id": "c", "tier": "gpu-shared",
             "backend": "te", "save_topology": "tp1-etp1-ep4-pp1", "load_topology": None,
             "patch": "none", "expected": "pass", "outcome": outcome, "recipe": SUPER_MSE}]}
        (tmp_path / "x.results.json").write_text(json.dumps(doc))

    write("skipped")
    assert "recipe nvfp4-mse" in not_covered(tmp_path)
    write("pass")
    assert "recipe nvfp4-mse" not in not_covered(tmp_path)
