"""A save stage that reported success, checked against what it claims before anything trusts it.

Why: a save stage's ranks can all exit 0 without a checkpoint to show for it (on one GPU host,
two pytest-xdist workers once ran their stages on one warm-pool directory, and a save "passed"
with 0 ranks and no ``ckpt/``: two controllers' pools answered each other's jobs); every load of it then failed for a reason that was not
the product's, and a save expected to collide was judged ``unexpected-pass``. So a save passes
only when the checkpoint is there and readable by megatron-core's own metadata reader, and every
ShardedTensor key its ranks said they wrote (harness/rank/stages.py ``record_saved_keys``) is in
that metadata.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.paths import SaveDir
from harness.records import CauseKind, StageCause, StageResult

def checkpoint_amax_keys(ckpt: Path) -> dict | None:
    """The quantizer amax keys of a checkpoint per module family, from its metadata."""
    from harness.check.keys import amax_key_counts
    from harness.golden.storage import NotACheckpoint, read_metadata

    try:
        return amax_key_counts(read_metadata(ckpt)[1])
    except NotACheckpoint:
        return None


def save_problems(save: SaveDir, result: StageResult, topology: str, world: int) -> list[str]:
    """Why ``result`` (a save stage that passed) is no evidence of a checkpoint at ``topology``
    of ``world`` ranks; [] when it is."""
    from harness.golden.storage import NotACheckpoint, read_metadata

    try:
        _, tensors = read_metadata(save.ckpt)
        problems = []
    except NotACheckpoint as exc:
        tensors, problems = {}, [str(exc)]
    ranks = {int(r): doc for r, doc in result.rank_results.items()}
    written: set[str] = set()
    for r in range(world):
        saved = (ranks.get(r) or {}).get("saved") or {}
        if saved.get("topology") != topology or saved.get("world_size") != world:
            problems.append(f"rank {r} reported no save at {topology} on {world} ranks "
                            f"(it reported {saved.get('topology')} on {saved.get('world_size')})")
        try:
            written.update(save.saved_keys(r).read_text().split())
        except OSError:
            problems.append(f"{save.saved_keys(r)}: missing (the keys rank {r} saved)")
    absent = sorted(written - set(tensors))
    if tensors and absent:
        problems.append(f"{len(absent)} key(s) the ranks saved are not in {save.ckpt}'s metadata, "
                        f"first {absent[0]}")
    if not written and not problems:
        problems.append(f"the ranks saved no tensor into {save.ckpt}")
    return problems


def verified_save(save: SaveDir, result: StageResult, topology: str, world: int) -> StageResult:
    """``result`` with the amax keys its checkpoint holds (per family) when it is not a pass or
    its checkpoint holds what it claims; otherwise the same stage as failed, its cause the first
    problem (every problem in the message)."""
    if not result.ok:
        return result
    problems = save_problems(save, result, topology, world)
    if not problems:
        return replace(result, amax_keys=checkpoint_amax_keys(save.ckpt))
    cause = StageCause(rank=None, kind=CauseKind.UNVERIFIED_SAVE, exc_type="SaveNotVerified",
                       message="; ".join(problems), key=None)
    summary = (f"{result.stage}: FAILED: the save reported success without the checkpoint it "
               f"claims: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    return replace(result, ok=False, cause=cause, summary=summary)
