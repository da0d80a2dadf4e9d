"""The randomized sampler (harness/scenario/sample.py), cpu tier, no ranks.

Expectations: the issue's constraints (experts 8-128, ETP <= 4, PP <= 2, a rank budget, none of
the committed grid's cells, the same seed the same cells) and the topology rules of
harness/topology/topology.py; expectations of the drawn cells come from the oracle.
"""
from __future__ import annotations

import pytest

from harness import cli
from harness.check.gaps import known_gaps
from harness.scenario.sample import committed_cells, draw_cells, sample_scenarios

pytestmark = pytest.mark.cpu


def test_the_same_seed_draws_the_same_cells_and_another_seed_others():
    a, b = draw_cells(25, 40), draw_cells(25, 40)
    assert [d.key for d in a] == [d.key for d in b]
    assert [d.key for d in draw_cells(26, 40)] != [d.key for d in a]


@pytest.mark.parametrize("ranks, loads_per_save", [(8, 1), (8, 3), (4, 2)])
def test_draws_are_valid_distinct_within_budget_and_off_the_committed_grid(ranks, loads_per_save):
    draws = draw_cells(7, 60, max_ranks=ranks, loads_per_save=loads_per_save)
    committed = committed_cells()
    assert len(draws) == 60 and len({d.key for d in draws}) == 60
    for d in draws:
        assert d.key not in committed and d.save != d.load
        assert 8 <= d.size.num_experts <= 128 and d.size.moe_router_topk <= d.size.num_experts
        for t in (d.save, d.load):
            assert not t.problems(d.size), (t, d.size)
            assert t.world_size <= ranks and t.etp <= 4 and t.pp <= 2
    per_save = {}
    for d in draws:
        per_save[(d.save, d.size)] = per_save.get((d.save, d.size), 0) + 1
    assert max(per_save.values()) <= loads_per_save


def test_the_grid_its_excluded_from_is_the_committed_one():
    """The issue's own 64-expert pair is committed (scenarios/gpu_cross_topology.toml)."""
    keys = {(s, l) for s, l, size, _ in committed_cells() if size.num_experts == 64 and size.num_layers == 4}
    assert ("tp2-etp2-ep2-pp1", "tp4-etp2-ep1-pp1") in keys


def test_sampled_scenarios_are_ordinary_oracle_scenarios():
    from harness.check.versions import installed_mcore, rules_for

    scenarios = sample_scenarios(25, 30, loads_per_save=3, patch="none")
    cells = [c for s in scenarios for c in s.cells()]
    assert sum(c.load is not None for c in cells) == 30
    assert all(s.expect == "oracle" and s.tier == "gpu-shared" and s.backend == "te" for s in scenarios)
    assert len({c.id for c in cells}) == len(cells)
    assert len({c.save_id for c in cells if c.load is None}) == len(scenarios)  # one save each
    # the unpatched 0.47.0 witness has cells the rules expect to fail, 0.48.0rc1 expects none
    under = {v: {c.expected_under(rules_for(v, installed_mcore())) for c in cells} for v in ("0.47.0", "0.48.0rc1")}
    assert under["0.48.0rc1"] == {"pass"} and {"fail-save", "fail-load"} & under["0.47.0"]


def test_cpu_tier_draws_keep_tp_and_etp_at_1_with_the_cpu_grid_gaps():
    scenarios = sample_scenarios(3, 10, max_ranks=4, tier="cpu")
    assert all(s.backend == "local" and known_gaps(s) for s in scenarios)  # the backend's own
    assert all(t.tp == t.etp == 1 and t.pp == 1 for s in scenarios for t in s.saves + s.loads)


def test_cli_lists_the_draw_and_refuses_a_bad_budget(capsys):
    assert cli.main(["sample", "--seed", "25", "--cells", "5", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and out[0].startswith("sample-s25-000: save ")
    with pytest.raises(SystemExit) as exc:
        cli.main(["sample", "--seed", "25", "--ranks", "0", "--list"])
    assert exc.value.code == 2 and "outside 1..64" in capsys.readouterr().err
    assert cli.main(["sample", "--seed", "1", "--cells", "50", "--ranks", "1", "--list"]) == 2
    assert "cannot draw 50 distinct cells within 1 ranks" in capsys.readouterr().err


def test_slices_split_the_draw_by_whole_saves_and_together_are_the_draw(capsys):
    """--slice K/N spreads one draw over N runs: no save in two slices, no cell lost or repeated."""
    from harness.scenario.sample import slice_of

    whole = sample_scenarios(25, 50, loads_per_save=5)
    parts = [slice_of(whole, k, 3) for k in (1, 2, 3)]
    assert sorted(s.name for p in parts for s in p) == sorted(s.name for s in whole)
    saves = [{(s.saves, s.size) for s in p} for p in parts]
    assert not (saves[0] & saves[1] or saves[1] & saves[2] or saves[0] & saves[2])
    listed = []
    for k in (1, 2):
        assert cli.main(["sample", "--seed", "25", "--cells", "12", "--loads-per-save", "3",
                         "--slice", f"{k}/2", "--list"]) == 0
        listed += capsys.readouterr().out.splitlines()
    assert cli.main(["sample", "--seed", "25", "--cells", "12", "--loads-per-save", "3", "--list"]) == 0
    assert sorted(listed) == sorted(capsys.readouterr().out.splitlines())
    for bad in ("3/2", "0/2", "1-2"):
        assert cli.main(["sample", "--seed", "25", "--cells", "5", "--slice", bad, "--list"]) == 2
        assert "--slice" in capsys.readouterr().err


def test_a_library_draw_takes_recipes_and_modules_from_the_release_library():
    """--library: each save's recipe is one of the release's library recipes that quantize routed
    experts (its committed forecast file), and its optional modules vary; the same seed, the
    same draw."""
    from harness.check.matching import library
    from harness.scenario.sample import MODULE_DRAWS

    recipes = library("0.47.0")
    assert "modelopt:models/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16/ptq/nvfp4-4o6" in recipes
    assert "modelopt:general/auto_quantize/nvfp4_fp8_at_5p4bits" not in recipes  # no quantize section
    a = sample_scenarios(7, 40, loads_per_save=2, library="0.47.0")
    assert [(s.recipe, s.size) for s in a] == [(s.recipe, s.size) for s in
                                              sample_scenarios(7, 40, loads_per_save=2, library="0.47.0")]
    assert {s.recipe for s in a} <= set(recipes) and len({s.recipe for s in a}) >= 8
    module_fields = {f for m in MODULE_DRAWS for f in m}
    drawn = [set(s.size.as_dict()) & module_fields for s in a]
    assert any(drawn) and not all(drawn)  # some saves have modules, some none
    assert all(field in set().union(*drawn) for field in module_fields)
    for s in a:
        assert s.source == "harness sample --seed 7 --library 0.47.0"
        for t in s.saves + s.loads:
            assert not t.problems(s.size), (t, s.size)


def test_a_library_draw_without_that_release_forecast_is_one_line(capsys):
    assert cli.main(["sample", "--seed", "7", "--cells", "4", "--library", "0.1.0", "--list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no forecast of ModelOpt 0.1.0's library" in err and "modelopt-0.1.0.json" in err
