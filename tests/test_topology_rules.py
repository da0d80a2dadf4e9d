"""Each validity rule of harness/topology/topology.py on its own, with its exact line, and the
enumeration of every topology up to a world size, counted by hand. The mutation run over
topology.py (docs/mutation.md) found rules whose breaking no other test noticed. Pure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.topology.topology import (
    Topology, TopologyError, _divisors, enumerate_topologies, mamba_heads, module_problems,
)

pytestmark = pytest.mark.cpu


def _size(**kw):
    base = dict(num_experts=8, num_attention_heads=4, moe_ffn_hidden_size=64, num_layers=4,
                vocab_size=128)
    base.update(kw)
    return SimpleNamespace(**base)


def test_ids_worlds_and_data_parallel_sizes():
    t = Topology.parse(" tp2-etp1-ep2-pp2 ")
    assert (t.tp, t.etp, t.ep, t.pp, t.world) == (2, 1, 2, 2, 0)
    assert (t.world_size, t.dp, t.edp, t.id, str(t)) == (4, 1, 1, "tp2-etp1-ep2-pp2", "tp2-etp1-ep2-pp2")
    w = Topology.parse("tp1-etp1-ep2-pp1-w4")
    assert (w.world_size, w.dp, w.edp, w.id) == (4, 4, 2, "tp1-etp1-ep2-pp1-w4")
    # an explicit world equal to the implicit one is not spelled
    assert Topology.parse("tp2-etp1-ep2-w2").id == "tp2-etp1-ep2-pp1"
    assert Topology.parse("tp3-etp1-ep2").world_size == 6  # lcm(3, 2)
    assert Topology.parse("tp1-etp1-ep1").pp == 1
    with pytest.raises(TopologyError) as exc:
        Topology.parse("tp1-etp1-ep1-px")
    assert str(exc.value) == ("cannot read topology 'tp1-etp1-ep1-px': expected "
                              "tp<N>-etp<N>-ep<N>[-pp<N>][-w<N>], e.g. tp4-etp1-ep8 or tp2-etp2-ep2-pp2")


def test_sizes_below_one_are_named_and_nothing_else():
    assert Topology(0, 1, 1, 1, 2).problems(_size()) == ["tp must be >= 1 (got 0)"]
    assert Topology(1, 0, 0, 0, 2).problems() == [
        "etp must be >= 1 (got 0)", "ep must be >= 1 (got 0)", "pp must be >= 1 (got 0)"]


def test_the_world_must_divide_by_both_model_sizes():
    assert Topology(2, 1, 1, 1, 3).problems() == [
        "world size 3 is not divisible by tp*pp = 2"]
    assert Topology(1, 2, 2, 1, 2).problems() == [
        "world size 2 is not divisible by etp*ep*pp = 4"]
    assert Topology(1, 1, 1, 1, 3).problems() == []
    # with a size, its rules come after the world's, which stay
    assert Topology(2, 1, 1, 1, 3).problems(_size(vocab_size=127)) == [
        "world size 3 is not divisible by tp*pp = 2",
        "vocab_size 127 is not divisible by tp 2 (embedding and output layer split the vocabulary over tp)"]
    with pytest.raises(TopologyError) as exc:
        Topology(2, 1, 1, 1, 3).check(_size(vocab_size=127))
    assert str(exc.value) == (
        "topology tp2-etp1-ep1-pp1-w3 cannot run: world size 3 is not divisible by tp*pp = 2; "
        "vocab_size 127 is not divisible by tp 2 (embedding and output layer split the vocabulary over tp)")


@pytest.mark.parametrize("topo,size,line", [
    ("tp1-etp1-ep3", {}, "num_experts 8 is not divisible by ep 3 (each expert-parallel rank holds "
                         "num_experts/ep experts)"),
    ("tp3-etp1-ep1", {"vocab_size": 129}, "num_attention_heads 4 is not divisible by tp 3 (each "
                                          "tensor-parallel rank holds num_attention_heads/tp heads)"),
    ("tp1-etp3-ep1", {}, "moe_ffn_hidden_size 64 is not divisible by etp 3 (each expert-tensor-"
                         "parallel rank holds moe_ffn_hidden_size/etp columns of every expert)"),
    ("tp1-etp1-ep1-pp3", {}, "num_layers 4 is not divisible by pp 3 (each pipeline stage builds "
                             "num_layers/pp layers)"),
    ("tp2-etp1-ep1", {"vocab_size": 127}, "vocab_size 127 is not divisible by tp 2 (embedding and "
                                          "output layer split the vocabulary over tp)"),
])
def test_each_size_rule_alone(topo, size, line):
    t = Topology.parse(topo)
    problems = t.problems(_size(**size))
    assert line in problems
    if topo != "tp3-etp1-ep1":
        assert problems == [line]
    with pytest.raises(TopologyError) as exc:
        t.check(_size(**size))
    assert str(exc.value).startswith(f"topology {t.id} cannot run: ") and line in str(exc.value)


def test_a_topology_that_fits_is_returned_by_check():
    t = Topology.parse("tp2-etp2-ep4-pp2")
    assert t.problems(_size()) == [] and t.check(_size()) is t
    assert t.check() is t


def test_the_shared_expert_splits_over_tp():
    t = Topology.parse("tp2-etp1-ep2")
    assert module_problems(t, _size(moe_shared_expert_intermediate_size=30)) == []
    assert module_problems(t, _size(moe_shared_expert_intermediate_size=31)) == [
        "moe_shared_expert_intermediate_size 31 is not divisible by tp 2"]
    assert t.problems(_size(moe_shared_expert_intermediate_size=31)) == [
        "moe_shared_expert_intermediate_size 31 is not divisible by tp 2"]


def test_hybrid_rules():
    hybrid = dict(kind="hybrid", hidden_size=96)  # 96 * 2 / 64 = 3 Mamba heads
    assert mamba_heads(96) == 3 and mamba_heads(128) == 4
    t2 = Topology.parse("tp2-etp1-ep1")
    assert module_problems(t2, _size(hybrid_layer_pattern="M*E*", **hybrid)) == [
        "hidden_size 96 gives 3 Mamba heads (hidden_size * 2 / 64), not divisible by tp 2"]
    # no Mamba layer before "/" (the MTP depths): no Mamba rule
    assert module_problems(t2, _size(hybrid_layer_pattern="*E*E/M", **hybrid)) == []
    # a GPT model's pattern is not read
    assert module_problems(t2, _size(hybrid_layer_pattern="M*E*", kind="gpt", hidden_size=96)) == []
    t16 = Topology(16, 1, 1, 1, 16)
    assert module_problems(t16, _size(hybrid_layer_pattern="M", kind="hybrid", hidden_size=512)) == [
        "mamba_num_groups 8 (megatron-core's default) is not divisible by tp 16"]
    pp2 = Topology.parse("tp1-etp1-ep1-pp2")
    assert module_problems(pp2, _size(hybrid_layer_pattern="*E|*E|*E", **hybrid)) == [
        "hybrid_layer_pattern '*E|*E|*E': its 3 '|' segments are not divisible by pp 2"]
    assert module_problems(pp2, _size(hybrid_layer_pattern="*E|*E", **hybrid)) == []
    assert module_problems(Topology.parse("tp1-etp1-ep1-pp3"), _size(hybrid_layer_pattern="*E|*E", **hybrid)) == [
        "hybrid_layer_pattern '*E|*E': its 2 '|' segments are not divisible by pp 3"]
    assert module_problems(pp2, _size(hybrid_layer_pattern="*E*E*E", **hybrid)) == []


def test_divisors():
    assert _divisors(1) == [1]
    assert _divisors(12) == [1, 2, 3, 4, 6, 12]


def test_every_topology_up_to_two_ranks_counted_by_hand():
    """world 1: tp1-etp1-ep1; world 2 at pp 1: tp 1 or 2 times (etp, ep) in (1,1), (1,2), (2,1);
    world 2 at pp 2: tp1-etp1-ep1-pp2."""
    want = {Topology(1, 1, 1, 1, 1)} | {Topology(tp, etp, ep, 1, 2) for tp in (1, 2)
                                         for etp, ep in ((1, 1), (1, 2), (2, 1))}
    got = list(enumerate_topologies(2, with_pp=False))
    assert len(got) == len(set(got)) and set(got) == want
    assert set(enumerate_topologies(2)) == want | {Topology(1, 1, 1, 2, 2)}
    # a pipeline depth that does not divide the world is passed over, not the end of the depths
    four = set(enumerate_topologies(4))
    assert Topology(1, 1, 1, 4, 4) in four and Topology(1, 1, 1, 2, 4) in four
    assert not any(t.pp == 3 and t.world == 4 for t in four)
    # a size's rules prune: 3 experts allow ep 1 only
    assert set(enumerate_topologies(2, _size(num_experts=3), with_pp=False)) == {
        t for t in want if t.ep == 1}
