"""Topologies as data, rank coordinates from megatron-core, and the oracle against the facts
measured in findings.md (not against values the oracle produced itself)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.model.gpt import GPU_SIZE
from harness.topology.oracle import collision_map, collisions, map_entry
from harness.topology.coords import rank_coords
from harness.scenario.scenarios import ScenarioError, load_scenario
from harness.topology.topology import Topology, TopologyError
from tests.helpers import bounded

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cpu


def test_ids_round_trip_and_world_sizes():
    t = Topology.parse("tp4-etp1-ep8")
    assert (t.id, t.world_size, t.dp, t.edp) == ("tp4-etp1-ep8-pp1", 8, 2, 1)
    assert Topology.parse("tp1-etp1-ep1-pp1-w2").world_size == 2
    assert Topology.parse(t.id) == Topology(4, 1, 8, 1)


@pytest.mark.parametrize("text", ["tp4-ep8", "tp-etp1-ep1", "4/1/8"])
def test_unreadable_id_names_the_format(text):
    with pytest.raises(TopologyError, match=r"expected tp<N>-etp<N>-ep<N>"):
        Topology.parse(text)


def test_impossible_topology_names_each_broken_constraint():
    with pytest.raises(TopologyError) as exc:
        Topology.parse("tp3-etp1-ep3-pp4").check(GPU_SIZE)
    msg = str(exc.value)
    for part in ("num_attention_heads 4 is not divisible by tp 3",
                 "num_experts 8 is not divisible by ep 3", "num_layers 2 is not divisible by pp 4"):
        assert part in msg


def test_rank_coords_follow_megatron_default_order():
    # tp2-etp1-ep2 on 2 ranks: rank 1 is dense TP rank 1 and expert EP rank 1 (findings.md:
    # the expert on EP rank 1 has replica_id (0, 1, 0) under the buggy rule).
    c = rank_coords(Topology.parse("tp2-etp1-ep2"))
    assert [(x.tp, x.etp, x.ep, x.edp) for x in c] == [(0, 0, 0, 0), (1, 0, 1, 0)]


@pytest.mark.parametrize("topo,count", [("tp2-etp1-ep2", 0), ("tp1-etp2-ep1", 2), ("tp4-etp1-ep8", 0)])
def test_failing_shapes_from_findings(topo, count):
    bug = collisions(Topology.parse(topo), "buggy")
    assert bug and {c.main_replicas for c in bug} == {count}
    assert not collisions(Topology.parse(topo), "fixed")


@pytest.mark.parametrize("topo", ["tp2-etp1-ep1", "tp1-etp1-ep1", "tp1-etp1-ep8", "tp2-etp2-ep4"])
def test_passing_shapes_from_findings(topo):
    assert map_entry(Topology.parse(topo)).buggy_ok


def test_world_one_never_fails_and_fix_never_fails():
    entries = collision_map(8)
    assert all(e.buggy_ok for e in entries if e.world == 1)
    assert all(e.fixed_ok for e in entries)
    # TP == ETP never collides under either rule (the replica ids coincide)
    assert all(e.buggy_ok for e in entries if e.tp == e.etp)


@pytest.mark.slow  # the whole map through the CLI; the oracle's rules stay
def test_map_json_has_the_promised_fields():
    done = bounded([sys.executable, "-m", "harness", "map", "--max-world", "4", "--json"], 120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = json.loads(out)
    assert rows and {"world", "tp", "etp", "ep", "pp", "buggy_ok", "fixed_ok"} <= set(rows[0])
    assert max(r["world"] for r in rows) == 4


def test_cli_refuses_impossible_topology_without_a_traceback():
    r = bounded([sys.executable, "-m", "harness", "dump-metadata", "--topology",
                 "tp3-etp1-ep2", "--out", "/tmp/unused.json"], 120, cwd=REPO)
    assert r.returncode == 2
    assert "num_attention_heads 4 is not divisible by tp 3" in r.stderr
    assert "Traceback" not in r.stderr


def test_scenario_with_bad_topology_fails_at_collection(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('tier = "gpu-shared"\nbackend = "te"\nsaves = ["tp1-etp1-ep3"]\n')
    with pytest.raises(ScenarioError, match=r"bad.toml: .*num_experts 8 is not divisible by ep 3"):
        load_scenario(f)


@pytest.mark.parametrize("topo", ["tp2-etp1-ep4-pp2-w4", "tp1-etp1-ep2-pp2-w2"])
def test_a_world_that_divides_by_etp_ep_but_not_by_etp_ep_pp_is_refused(topo):
    """megatron-core's initialize_model_parallel (parallel_state.py) divides the world by
    expert_tensor_model_pipeline_parallel_size = etp * ep * pp and raises where it does not: the
    topology is refused before any rank starts, naming that product, though the world divides by
    tp * pp and by etp * ep."""
    t = Topology.parse(topo)
    assert t.world_size % (t.tp * t.pp) == 0 and t.world_size % (t.etp * t.ep) == 0
    with pytest.raises(TopologyError, match=r"etp\*ep\*pp"):
        t.check()
