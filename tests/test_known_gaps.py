"""A scenario written from the docs: docs/scenarios.md's example is a valid scenario,
and a cpu scenario without ``known_gaps`` is judged with the local backend's own gap
(harness/check/gaps.py), so its reloads do not fail on the LayerNorm input-quantizer amax that
ModelOpt 0.47.0 does not restore. Judged by the one judge on stage results, no stage run.
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from harness.check import judge, rejudge
from harness.check.gaps import BACKEND_GAPS, known_gaps
from harness.paths import REPO_ROOT, SCENARIO_DIR
from harness.records import CellRecord, StageResult
from harness.scenario.scenarios import load_scenario

pytestmark = pytest.mark.cpu

# What a cpu reload of the 2-layer local-spec model lacks (a real cell of this scenario,
# tp1-etp1-ep2 -> tp1-etp1-ep1, modelopt 0.47.0: "5 saved key(s) absent" before the default gap)
NORM_AMAX = ["decoder.final_layernorm.input_quantizer._amax"] + [
    f"decoder.layers.{l}.{m}.layer_norm_input_quantizer._amax"
    for l in (0, 1) for m in ("mlp.linear_fc1", "self_attention.linear_qkv")]
MINIMAL_CPU = """name = "my-cpu"
tier = "cpu"
backend = "local"
patch = "none"
expect = "pass"
saves = ["tp1-etp1-ep2"]
loads = ["tp1-etp1-ep1", "tp1-etp1-ep1-pp2"]
"""


def _docs_toml() -> str:
    section = (REPO_ROOT / "docs" / "scenarios.md").read_text().split("## Scenario files", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    return block


def test_the_docs_example_read_literally_is_the_scenario_it_quotes(tmp_path):
    path = tmp_path / "from_docs.toml"
    path.write_text(_docs_toml())
    got = load_scenario(path)
    quoted = load_scenario(SCENARIO_DIR / "gpu_fix.toml")  # "From scenarios/gpu_fix.toml"
    assert replace(got, source="", description="") == replace(quoted, source="", description="")
    assert len(got.cells()) == 4 + 4 * 7


def _judged(cell, missing: list[str], modelopt: str = "0.47.0") -> CellRecord:
    env = {"nvidia-modelopt": modelopt}
    verify = {"mismatch_count": 0, "mismatches": [], "missing_keys": missing, "unexpected_keys": []}
    rec = CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier=cell.scenario.tier,
                     backend=cell.scenario.backend, save_topology=cell.save.id,
                     load_topology=cell.load.id, patch="none", expected="", modelopt=modelopt)
    return judge.judge_cell(rec, cell.plan, StageResult("save", True, 1.0, environment=env),
                            StageResult("load", True, 1.0, environment=env,
                                        rank_results={"0": {"verify": verify}}))


@pytest.fixture
def cpu_cells(tmp_path):
    path = tmp_path / "my_cpu.toml"
    path.write_text(MINIMAL_CPU)
    scenario = load_scenario(path)
    assert scenario.known_gaps == ()  # the file declares none
    return [c for c in scenario.cells() if c.load is not None]


def test_a_cpu_scenario_without_known_gaps_gets_the_local_backends_gap(cpu_cells):
    assert len(cpu_cells) == 2
    for cell in cpu_cells:
        assert known_gaps(cell.scenario) == BACKEND_GAPS["local"]
        assert all(any(g.matches(k) for g in known_gaps(cell.scenario)) for k in NORM_AMAX)
        rec = _judged(cell, NORM_AMAX)
        assert (rec.expected, rec.outcome) == ("pass", "pass"), rec.message


def test_the_gap_covers_only_the_norms(cpu_cells):
    lost = "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight_quantizer._amax"
    rec = _judged(cpu_cells[0], NORM_AMAX + [lost])
    assert rec.outcome == "unexpected-failure"
    assert f"1 saved key(s) absent after load, first {lost}" in rec.message


def test_backend_te_has_no_such_gap(cpu_cells):
    te = replace(cpu_cells[0], scenario=replace(cpu_cells[0].scenario, tier="gpu-shared", backend="te"))
    assert known_gaps(te.scenario) == ()
    rec = _judged(te, NORM_AMAX)
    assert rec.outcome == "unexpected-failure" and "5 saved key(s) absent" in rec.message


def test_a_scenarios_own_gaps_come_first_and_are_not_repeated(cpu_cells):
    own = BACKEND_GAPS["local"][1:]
    s = replace(cpu_cells[0].scenario, known_gaps=own)
    assert known_gaps(s) == own + BACKEND_GAPS["local"][:1]


def test_a_recorded_cpu_cell_no_scenario_holds_is_rejudged_with_the_gap(cpu_cells):
    """``verdict`` / ``equivalence --rejudge`` judge a record whose scenario is gone by the record
    alone: the backend's gap still applies."""
    rec = _judged(cpu_cells[0], NORM_AMAX).as_dict()
    again = rejudge.rejudge_record(rec, None)
    assert again["outcome"] == "pass", again.get("message")
