"""Per-rank parallel coordinates, computed by megatron-core's own ``RankGenerator``.

The controller and the collision-map oracle need to know, for every global rank of a topology,
its dense TP/DP rank and its expert TP/EP/DP rank without starting any process. Re-deriving
Megatron's rank layout by hand would silently drift from it, so this asks the real generator
with the same default order ``initialize_model_parallel`` uses: the installed megatron-core's own
``RankGenerator``, run from its source (mcore_source.py) so that judging does not import
megatron.core, else imported.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from harness.topology import mcore_source
from harness.topology.topology import Topology

MEGATRON_DEFAULT_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class RankCoords:
    rank: int
    pp: int
    tp: int  # dense tensor-parallel rank
    dp: int  # dense data-parallel rank
    etp: int  # expert tensor-parallel rank
    ep: int  # expert model-parallel rank
    edp: int  # expert data-parallel rank


def _rank_generator(imported: bool = False) -> type:
    """megatron-core's ``parallel_state.RankGenerator``: run from the installed source, unless
    megatron-core is imported already (a rank) or ``imported`` is asked; else imported."""
    if not imported and "megatron.core.parallel_state" not in sys.modules:
        found = mcore_source.definitions(
            "parallel_state", ("generate_masked_orthogonal_rank_groups", "RankGenerator"))
        if found:
            return found["RankGenerator"]
    from megatron.core.parallel_state import RankGenerator

    return RankGenerator


def rank_coords(topo: Topology, order: str = MEGATRON_DEFAULT_ORDER) -> list[RankCoords]:
    return list(_cached_rank_coords(topo, order))


@functools.lru_cache(maxsize=4096)
def _cached_rank_coords(topo: Topology, order: str) -> tuple[RankCoords, ...]:
    """One generator run per (topology, order) and process: judging the committed records asks
    the same few topologies thousands of times (a third of `harness evidence`'s time)."""
    try:
        return tuple(_rank_coords(topo, order, _rank_generator()))
    except NameError:  # a release whose generator uses more of its module than the source run has
        return tuple(_rank_coords(topo, order, _rank_generator(imported=True)))


def _rank_coords(topo: Topology, order: str, generator: type) -> list[RankCoords]:
    topo.check()
    w = topo.world_size
    dense = generator(tp=topo.tp, ep=1, dp=topo.dp, pp=topo.pp, cp=1, order=order)
    expert = generator(tp=topo.etp, ep=topo.ep, dp=topo.edp, pp=topo.pp, cp=1, order=order)

    def position(gen, token: str) -> dict[int, int]:
        return {r: i for group in gen.get_ranks(token) for i, r in enumerate(group)}

    pp, tp, dp = (position(dense, t) for t in ("pp", "tp", "dp"))
    epp, etp, ep, edp = (position(expert, t) for t in ("pp", "tp", "ep", "dp"))
    if pp != epp:  # megatron-core asserts the same; say it plainly here
        raise AssertionError(f"dense and expert pipeline groups differ for {topo.id}")
    return [RankCoords(r, pp[r], tp[r], dp[r], etp[r], ep[r], edp[r]) for r in range(w)]
