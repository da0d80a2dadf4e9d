"""The harness's refusals of a (model size, topology) against the installed packages' own code.

Each case is one rule of ``ModelSize.problems``, ``Topology.problems`` or
``quant.topology_problems``: a size/topology that breaks it must be refused by the harness AND
raise in the megatron-core (or ModelOpt) code the rule cites, and its neighbour that keeps it must
pass both. So a harness rule that is stricter or looser than the package's shows up here. The
package code runs on CPU without a process group: megatron-core asks a group its ``size()``
only once ``torch.distributed`` is initialized, so those probes say it is and pass stand-in
groups of the wanted size.
"""
from __future__ import annotations

import types
from dataclasses import replace
from unittest import mock

import pytest
import torch

from harness.model.gpt import ModelSize, transformer_config
from harness.model.quant import topology_problems
from harness.tiers import Backend
from harness.topology.topology import Topology

pytestmark = pytest.mark.cpu


class _Group:
    """A process group of ``n`` ranks, as megatron-core's get_pg_size/get_pg_rank read one."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


def _groups_initialized():
    return mock.patch.object(torch.distributed, "is_initialized", return_value=True)


def _config(topo, size):
    return transformer_config(topo, size, Backend.LOCAL)


def _probe_config(topo, size):  # TransformerConfig.__post_init__
    _config(topo, size)


def _probe_kv_channels(topo, size):
    """megatron-core does not refuse hidden % heads != 0: it floors kv_channels. The probe shows
    the attention it builds is then narrower than hidden_size (what the harness rule is for)."""
    cfg = _config(topo, size)
    assert cfg.kv_channels * cfg.num_attention_heads == size.hidden_size, "attention width"


def _probe_vocab(topo, size):  # VocabParallelEmbedding's split
    from megatron.core.tensor_parallel.utils import VocabUtility

    VocabUtility.vocab_range_from_global_vocab_size(size.vocab_size, 0, topo.tp)


def _probe_layers(topo, size):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    get_num_layers_to_build(_config(topo, size), pp_rank=0)


def _probe_expert_fc1(topo, size):  # an expert's linear_fc1 on the expert TP group
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    cfg = _config(topo, size)
    with _groups_initialized():
        ColumnParallelLinear(size.hidden_size, size.moe_ffn_hidden_size, config=cfg,
                             init_method=lambda w: None, bias=False, is_expert=True,
                             tp_group=_Group(topo.etp), skip_weight_param_allocation=True)


def _probe_moe_layer(topo, size):
    from megatron.core.transformer.moe.moe_layer import BaseMoELayer

    class _Layer(BaseMoELayer):
        def forward(self, hidden_states):
            return hidden_states

    cfg = _config(Topology(topo.tp, topo.etp, 1, topo.pp), size)  # EP comes from the group
    with _groups_initialized():
        _Layer(cfg, 1, types.SimpleNamespace(ep=_Group(topo.ep), tp=_Group(topo.tp)))


def _probe_router_topk(topo, size):
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    topk_routing_with_score_function(torch.randn(4, size.num_experts), size.moe_router_topk)


def _probe_modelopt_sequential_mlp(topo, size):
    from modelopt.torch.quantization.plugins.megatron import _MegatronSequentialMLP

    module = types.SimpleNamespace(config=_config(topo, size), parallel_state=object(),
                                   local_experts=[])
    _MegatronSequentialMLP._setup(module)


BASE = ModelSize()
# id, (size, topology) that breaks the rule, (size, topology) that keeps it, the package's code,
# what it raises, the field the harness's line must name
CASES = [
    ("heads-vs-tp", (replace(BASE, num_attention_heads=6, hidden_size=96), "tp4-etp1-ep1"),
     (replace(BASE, num_attention_heads=8), "tp4-etp1-ep1"), _probe_config, ValueError,
     "num_attention_heads 6"),
    ("topk-1", (replace(BASE, moe_router_topk=1), "tp1-etp1-ep1"), (BASE, "tp1-etp1-ep1"),
     _probe_config, ValueError, "moe_router_topk 1"),
    ("hidden-vs-heads", (replace(BASE, hidden_size=66), "tp1-etp1-ep1"),
     (replace(BASE, hidden_size=68), "tp1-etp1-ep1"), _probe_kv_channels, AssertionError,
     "hidden_size 66"),
    ("vocab-vs-tp", (replace(BASE, vocab_size=130), "tp4-etp1-ep1"),
     (replace(BASE, vocab_size=132), "tp4-etp1-ep1"), _probe_vocab, AssertionError, "vocab_size 130"),
    ("layers-vs-pp", (replace(BASE, num_layers=3), "tp1-etp1-ep1-pp2"),
     (replace(BASE, num_layers=4), "tp1-etp1-ep1-pp2"), _probe_layers, AssertionError, "num_layers 3"),
    ("moe-ffn-vs-etp", (replace(BASE, moe_ffn_hidden_size=66), "tp1-etp4-ep1"),
     (replace(BASE, moe_ffn_hidden_size=68), "tp1-etp4-ep1"), _probe_expert_fc1, AssertionError,
     "moe_ffn_hidden_size 66"),
    ("experts-vs-ep", (BASE, "tp1-etp1-ep3"), (replace(BASE, num_experts=9), "tp1-etp1-ep3"),
     _probe_moe_layer, AssertionError, "num_experts 8"),
    ("topk-over-experts", (replace(BASE, moe_router_topk=9), "tp1-etp1-ep1"),
     (replace(BASE, moe_router_topk=8), "tp1-etp1-ep1"), _probe_router_topk, RuntimeError,
     "moe_router_topk 9"),
    ("tp-and-ep-local", (BASE, "tp2-etp1-ep2"), (BASE, "tp2-etp2-ep1"),
     _probe_modelopt_sequential_mlp, ValueError, "tp 2 with ep 2"),
]


def _harness_problems(size: ModelSize, topo: Topology) -> list[str]:
    return size.problems() + topo.problems(size) + topology_problems(topo, Backend.LOCAL)


@pytest.mark.parametrize("bad, good, probe, raised, names", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_harness_rule_matches_the_package(bad, good, probe, raised, names):
    bad_size, bad_topo = bad[0], Topology.parse(bad[1])
    good_size, good_topo = good[0], Topology.parse(good[1])

    refused = _harness_problems(bad_size, bad_topo)
    assert len(refused) == 1 and names in refused[0], refused
    with pytest.raises(raised):
        probe(bad_topo, bad_size)

    assert _harness_problems(good_size, good_topo) == []
    probe(good_topo, good_size)  # the package accepts what the harness accepts
