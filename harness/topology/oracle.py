"""Collision-map oracle: which topologies give each per-expert weight-quantizer amax exactly one
main replica, under each replica_id rule a (ModelOpt, megatron-core) pair can produce.

A fast model of megatron-core's ``validate_sharding_integrity`` for the per-expert ``_amax``
entries only; it is NOT the real thing. It is cross-checked against the real megatron-core
validation (tests/test_oracle_vs_megatron.py) and against metadata recorded on GPUs.

The rules are named by the rank that lands in replica_id[1]; which pair gives which is read from
both packages' sources in harness/check/versions.py:
- dense-tp (alias buggy): replica_id = (0, DENSE tp rank, expert dp rank)  [per-expert amax]
- expert-tp (alias fixed): replica_id = (0, EXPERT tp rank, expert dp rank)  [per-expert amax]
- dense-tp-dense-dp: replica_id = (0, dense tp rank, dense dp rank) for that tensor on
  megatron-core >= 0.16 (no decorator): always one main replica per stage.
- expert-tp-dense-dp: replica_id = (0, EXPERT tp rank, DENSE dp rank) for a tensor that has ONE
  copy per pipeline stage (a grouped linear's shared input_quantizer amax under megatron-core
  < 0.16's expert_dist_ckpt_decorator); ``shared_collisions`` counts it per pp stage.
A ShardedTensor is a main replica when every replica_id entry is 0; validation (global rank 0)
requires exactly one main replica for every global expert of every pipeline stage.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from harness.topology.coords import RankCoords, rank_coords
from harness.topology.topology import Topology, enumerate_topologies

DENSE_TP, EXPERT_TP = "dense-tp", "expert-tp"
EXPERT_TP_DENSE_DP, DENSE_TP_DENSE_DP = "expert-tp-dense-dp", "dense-tp-dense-dp"
ALIASES = {"buggy": DENSE_TP, "fixed": EXPERT_TP}
RULES = ("buggy", "fixed", DENSE_TP, EXPERT_TP, EXPERT_TP_DENSE_DP, DENSE_TP_DENSE_DP)


def replica_id(c: RankCoords, rule: str) -> tuple[int, int, int]:
    rule = ALIASES.get(rule, rule)
    if rule == DENSE_TP:
        return (0, c.tp, c.edp)
    if rule == EXPERT_TP:
        return (0, c.etp, c.edp)
    if rule == EXPERT_TP_DENSE_DP:
        return (0, c.etp, c.dp)
    if rule == DENSE_TP_DENSE_DP:  # megatron-core's defaults outside an expert decorator
        return (0, c.tp, c.dp)
    raise ValueError(f"unknown replica rule {rule!r}; expected one of {RULES}")


def shared_collisions(topo: Topology, rule: str) -> list[Collision]:
    """Main-replica counts that are not 1 for a tensor with one copy per pp stage (every rank of
    the stage holds the same key), reported with ep = -1."""
    counts = Counter()
    for c in rank_coords(topo):
        counts[c.pp] += replica_id(c, rule) == (0, 0, 0)
    return [Collision(pp, -1, n) for pp, n in sorted(counts.items()) if n != 1]


@dataclass
class Collision:
    """One (pp stage, ep rank) whose experts do not have exactly one main replica."""

    pp: int
    ep: int
    main_replicas: int


@dataclass
class MapEntry:
    world: int
    tp: int
    etp: int
    ep: int
    pp: int
    id: str
    buggy_ok: bool
    fixed_ok: bool
    buggy_collisions: list[Collision] = field(default_factory=list)
    fixed_collisions: list[Collision] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)


def collisions(topo: Topology, rule: str) -> list[Collision]:
    """Main-replica counts that are not 1, per (pp stage, ep rank).

    Every local expert of an EP rank is held by the same set of ranks, so counting per
    (pp, ep) is counting per global expert.
    """
    coords = rank_coords(topo)
    counts = Counter()
    for c in coords:
        counts[(c.pp, c.ep)] += replica_id(c, rule) == (0, 0, 0)
    holders = {(c.pp, c.ep) for c in coords}
    return [Collision(pp, ep, counts[(pp, ep)]) for pp, ep in sorted(holders) if counts[(pp, ep)] != 1]


def map_entry(topo: Topology) -> MapEntry:
    bug, fix = collisions(topo, "buggy"), collisions(topo, "fixed")
    return MapEntry(
        topo.world_size, topo.tp, topo.etp, topo.ep, topo.pp, topo.id, not bug, not fix, bug, fix
    )


def collision_map(max_world: int, size=None) -> list[MapEntry]:
    return [map_entry(t) for t in enumerate_topologies(max_world, size)]


def predicts_failure(topo: Topology, rule: str = "buggy") -> bool:
    return bool(collisions(topo, rule))
