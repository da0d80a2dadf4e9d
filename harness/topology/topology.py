"""Parallel topologies as data: ids like ``tp4-etp1-ep8-pp1``, validity against a model's sizes.

Validity is checked here, in the controller, before any rank starts, so an impossible topology
is reported as the constraint it breaks instead of an assertion deep inside megatron-core.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_ID_RE = re.compile(r"^tp(\d+)-etp(\d+)-ep(\d+)(?:-pp(\d+))?(?:-w(\d+))?$")


class TopologyError(ValueError):
    """A topology that cannot run; the message names the broken constraint."""


@dataclass(frozen=True, order=True)
class Topology:
    tp: int
    etp: int
    ep: int
    pp: int = 1
    world: int = 0  # 0: the smallest world that fits (see `world_size`)

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """``tp2-etp1-ep2``, ``tp2-etp1-ep2-pp2`` or ``tp1-etp1-ep2-pp1-w4`` (explicit world)."""
        m = _ID_RE.match(text.strip())
        if not m:
            raise TopologyError(
                f"cannot read topology {text!r}: expected tp<N>-etp<N>-ep<N>[-pp<N>][-w<N>], "
                "e.g. tp4-etp1-ep8 or tp2-etp2-ep2-pp2"
            )
        tp, etp, ep, pp, world = (int(g) if g else 0 for g in m.groups())
        return cls(tp, etp, ep, pp or 1, world)

    @property
    def world_size(self) -> int:
        """Explicit world, else the least common multiple of the dense and expert model sizes."""
        if self.world:
            return self.world
        dense, expert = self.tp * self.pp, self.etp * self.ep * self.pp
        return _lcm(dense, expert)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    @property
    def edp(self) -> int:
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def id(self) -> str:
        base = f"tp{self.tp}-etp{self.etp}-ep{self.ep}-pp{self.pp}"
        implicit = Topology(self.tp, self.etp, self.ep, self.pp).world_size
        return base if self.world_size == implicit else f"{base}-w{self.world_size}"

    def __str__(self) -> str:
        return self.id

    def problems(self, size: "ModelSizeLike | None" = None) -> list[str]:
        """Every broken constraint, each named; empty when the topology can run."""
        out = []
        for name in ("tp", "etp", "ep", "pp"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if out:
            return out
        w = self.world_size
        if w % (self.tp * self.pp):
            out.append(f"world size {w} is not divisible by tp*pp = {self.tp * self.pp}")
        if w % (self.etp * self.ep * self.pp):
            out.append(
                f"world size {w} is not divisible by etp*ep*pp = {self.etp * self.ep * self.pp}"
            )
        if size is None:
            return out
        out += module_problems(self, size)  # the optional modules' rules, below
        # Each rule is megatron-core 0.19.2's own check (file:line under megatron/core/), so an
        # impossible (size, topology) is refused here, before any rank starts. Not here: hidden_size
        # and ffn_hidden_size, which no TP/ETP/EP/PP split divides in this model (no sequence
        # parallelism, every layer MoE), and rules of the size alone (ModelSize.problems).
        # moe/moe_layer.py:185 `assert num_moe_experts % ep_size == 0` (BaseMoELayer)
        if size.num_experts % self.ep:
            out.append(f"num_experts {size.num_experts} is not divisible by ep {self.ep} "
                       "(each expert-parallel rank holds num_experts/ep experts)")
        # transformer_config.py:1323 ValueError (TransformerConfig.__post_init__); attention.py:365
        # divide(num_attention_heads, tp); num_query_groups = heads, so :1338 follows
        if size.num_attention_heads % self.tp:
            out.append(f"num_attention_heads {size.num_attention_heads} is not divisible by tp "
                       f"{self.tp} (each tensor-parallel rank holds num_attention_heads/tp heads)")
        # tensor_parallel/layers.py:965 divide(output_size, etp) (expert linear_fc1, SequentialMLP)
        # and :1328 divide(input_size, etp) (linear_fc2); extensions/transformer_engine.py:1010,
        # :1012 the same for TEGroupedMLP
        if size.moe_ffn_hidden_size % self.etp:
            out.append(f"moe_ffn_hidden_size {size.moe_ffn_hidden_size} is not divisible by etp "
                       f"{self.etp} (each expert-tensor-parallel rank holds moe_ffn_hidden_size/etp "
                       "columns of every expert)")
        # transformer/transformer_block.py:150 `assert num_layers % pipeline_model_parallel_size == 0`
        if size.num_layers % self.pp:
            out.append(f"num_layers {size.num_layers} is not divisible by pp {self.pp} "
                       "(each pipeline stage builds num_layers/pp layers)")
        # tensor_parallel/utils.py:118 divide(global_vocab_size, tp) (VocabParallelEmbedding);
        # tensor_parallel/layers.py:965 for the output layer
        if size.vocab_size % self.tp:
            out.append(f"vocab_size {size.vocab_size} is not divisible by tp {self.tp} "
                       "(embedding and output layer split the vocabulary over tp)")
        return out

    def check(self, size: "ModelSizeLike | None" = None) -> "Topology":
        problems = self.problems(size)
        if problems:
            raise TopologyError(f"topology {self.id} cannot run: " + "; ".join(problems))
        return self


class ModelSizeLike:  # typing aid only: anything with these attributes
    num_experts: int
    num_attention_heads: int
    moe_ffn_hidden_size: int
    num_layers: int
    vocab_size: int


# --- Optional modules (harness/model/modules.py): the topology rules megatron-core 0.19.2 enforces
# on them, kept apart from the size rules above. Paths are under megatron/core/.

# Mamba layers at megatron-core's defaults, which the harness keeps (transformer_config.py:1182,
# 1185; the mixer's expand=2, ssm/mamba_mixer.py:179): hidden_size * 2 / 64 heads in 8 groups.
MAMBA_EXPAND, MAMBA_HEAD_DIM, MAMBA_NUM_GROUPS = 2, 64, 8


def mamba_heads(hidden_size: int) -> int:
    return MAMBA_EXPAND * hidden_size // MAMBA_HEAD_DIM


def module_problems(topo: Topology, size) -> list[str]:
    """Each broken rule of an optional module at this topology, one line each: field, value, rule.
    ``size`` is read with getattr (a module it lacks is off): ``kind``, ``hybrid_layer_pattern``,
    ``moe_shared_expert_intermediate_size``, ``hidden_size``.

    MTP layers add none: without a pipeline layout megatron-core builds every MTP layer on the
    last pipeline stage (transformer/multi_token_prediction.py:651-655, :707-710). A hybrid
    pattern without "|" is split evenly over pp (hybrid_layer_allocation.py:436-441): the
    num_layers rule above, as num_layers is the pattern's length (harness/model/modules.py)."""
    out = []
    shared = getattr(size, "moe_shared_expert_intermediate_size", None)
    # The shared expert is a dense MLP over the TP group: its fc1 output and fc2 input are split
    # by tp (transformer/moe/shared_experts.py:127-129, tensor_parallel/layers.py:965 and :1328).
    if shared and shared % topo.tp:
        out.append(f"moe_shared_expert_intermediate_size {shared} is not divisible by tp {topo.tp}")
    pattern = getattr(size, "hybrid_layer_pattern", None)
    if getattr(size, "kind", "gpt") == "hybrid" and pattern:
        main = pattern.split("/")[0]  # "/" starts the MTP depths (hybrid_layer_allocation.py:25)
        segments = main.split("|")
        # With "|", the stage segments must divide by pp (hybrid_layer_allocation.py:459-464).
        if len(segments) > 1 and len(segments) % topo.pp:
            out.append(f"hybrid_layer_pattern {pattern!r}: its {len(segments)} '|' segments are "
                       f"not divisible by pp {topo.pp}")
        if "M" in main:
            heads = mamba_heads(size.hidden_size)
            # Every TP rank needs whole Mamba heads and groups (ssm/mamba_mixer.py:260 and :268).
            if heads % topo.tp:
                out.append(f"hidden_size {size.hidden_size} gives {heads} Mamba heads "
                           f"(hidden_size * {MAMBA_EXPAND} / {MAMBA_HEAD_DIM}), not divisible by "
                           f"tp {topo.tp}")
            if MAMBA_NUM_GROUPS % topo.tp:
                out.append(f"mamba_num_groups {MAMBA_NUM_GROUPS} (megatron-core's default) is not "
                           f"divisible by tp {topo.tp}")
    return out


def _lcm(a: int, b: int) -> int:
    from math import gcd

    return a * b // gcd(a, b)


def enumerate_topologies(max_world: int, size=None, with_pp: bool = True) -> Iterable[Topology]:
    """Every (tp, etp, ep, pp, world) up to ``max_world`` ranks that passes `problems`."""
    for world in range(1, max_world + 1):
        for pp in range(1, world + 1) if with_pp else (1,):
            if world % pp:
                continue
            per_stage = world // pp
            for tp in _divisors(per_stage):
                for etp in _divisors(per_stage):
                    for ep in _divisors(per_stage // etp):
                        topo = Topology(tp, etp, ep, pp, world)
                        if not topo.problems(size):
                            yield topo


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
