"""On the cpu tier: a stage passes only on evidence that every rank of its world ran
it, a save only when its checkpoint holds what its ranks said they wrote, and two controllers
sharing one run directory (pytest-xdist workers) never share a warm pool.

On the code before this was mended each of these passed a stage that never ran: the second controller's
save came back "ok in 0.0 s (0 ranks)" with no checkpoint, because both controllers' pools were
named ``w2-cpu-none-1`` in the one run directory and the first pool's done files answered the
second's job."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.launch.pool import PoolSet
from harness.launch.torchrun import run_stage
from harness.paths import GOLDEN_DIR, SaveDir
from harness.records import CauseKind, StageResult
from harness.run.saved import verified_save
from tests.helpers import pool_processes
from tests.helpers import pool_key as key, pool_spec as spec

pytestmark = pytest.mark.cpu

SAVE = "tp1-etp1-ep2-pp1"


@pytest.mark.slow  # two whole saves; their pools' directories: the test below
def test_two_controllers_on_one_run_directory_each_run_their_own_save(tmp_path):
    """Two PoolSets (two xdist workers, each with its own counter) on one run directory, one
    save each, one after the other: each save is run by its own 2 ranks into its own pool."""
    first, second = PoolSet(), PoolSet()
    runs = []
    try:
        for pools, name in ((first, "a"), (second, "b")):
            s = spec(tmp_path / name, "save", SAVE)
            runs.append(pools.run(key(tmp_path, 2), s.write(tmp_path / name / "save" / "spec.json"),
                                  "save", tmp_path / name / "save", 240))
    finally:
        first.close_all()
        second.close_all()
    for name, run in zip("ab", runs):
        assert run.ok and sorted(run.rank_results) == [0, 1], (name, run.summary())
        assert (tmp_path / name / "save" / "ckpt" / "metadata.json").is_file(), name
        assert all(r["saved"]["topology"] == SAVE for r in run.rank_results.values())
    assert len(list((tmp_path / "pools").iterdir())) == 2, "the two controllers shared a pool"
    assert pool_processes(tmp_path) == []


def test_two_pool_sets_counting_alike_on_one_run_directory_get_their_own_pool_directories(tmp_path):
    """The `make test` form of the one above (no ranks started): two PoolSets, as two xdist
    workers, each at its first pool of the same key, get two directories."""
    first, second = PoolSet(), PoolSet()
    a, b = first._new_pool(key(tmp_path, 2)), second._new_pool(key(tmp_path, 2))
    assert first.started == second.started == 1
    assert a.dir != b.dir and a.dir.is_dir() and b.dir.is_dir(), (a.dir, b.dir)
    assert {a.dir.parent, b.dir.parent} == {(tmp_path / "pools").resolve()}


def test_a_stage_whose_ranks_exit_0_without_a_result_fails(tmp_path):
    """Ranks that leave cleanly without reporting (and a result left in the directory by some
    other stage, without this stage's token) are no evidence: the stage fails, named so."""
    stage = tmp_path / "stage"
    (stage / "ranks").mkdir(parents=True)
    (stage / "ranks" / "rank0.json").write_text(json.dumps({"verify": {}}))  # not this stage's
    run = run_stage("save", stage, 2, [], 60, rank_module="tests.rank_programs.silent")
    assert not run.ok and run.returncode == 0, run.summary()
    assert run.rank_results == {}
    assert run.cause.kind == CauseKind.NO_RESULT and run.cause.rank == 0, run.summary()
    assert "2 of 2 ranks reported no result" in run.cause.message
    assert run.leftovers == []


def test_a_stage_where_only_some_ranks_reported_fails(tmp_path):
    """Rank 0 reports, rank 1 leaves cleanly without a result: one rank's evidence is not the
    stage's; it fails, naming the silent rank."""
    run = run_stage("save", tmp_path / "stage", 2, [], 60, rank_module="tests.rank_programs.half_silent")
    assert sorted(run.rank_results) == [0] and run.returncode == 0, run.summary()
    assert not run.ok, run.summary()
    assert run.cause.kind == CauseKind.NO_RESULT and run.cause.rank == 1, run.summary()
    assert "1 of 2 ranks reported no result" in run.cause.message


def _save_result(world: int, topology: str = SAVE) -> StageResult:
    saved = {"topology": topology, "world_size": world, "validated": True}
    return StageResult(stage="save", ok=True, wall_s=1.0, summary="save: ok",
                       rank_results={str(r): {"saved": saved} for r in range(world)})


def _golden_save(tmp_path: Path, keys_per_rank: list[list[str]]) -> SaveDir:
    """A save directory whose ckpt/ is a committed golden's (read only) and whose ranks said
    they wrote ``keys_per_rank``."""
    save = SaveDir(tmp_path / "save")
    save.root.mkdir(parents=True)
    (save.root / "ckpt").symlink_to(GOLDEN_DIR / "modelopt-0.47.0-tp1-etp1-ep8" / "ckpt")
    for r, keys in enumerate(keys_per_rank):
        save.saved_keys(r).parent.mkdir(exist_ok=True)
        save.saved_keys(r).write_text("".join(f"{k}\n" for k in keys))
    return save


def test_a_save_passes_only_with_the_checkpoint_it_claims(tmp_path):
    from harness.golden.storage import read_metadata

    _, tensors = read_metadata(GOLDEN_DIR / "modelopt-0.47.0-tp1-etp1-ep8" / "ckpt")
    real = sorted(tensors)
    good = _golden_save(tmp_path / "good", [real[:5], real[5:9]])
    assert verified_save(good, _save_result(2), SAVE, 2).ok

    bad = _golden_save(tmp_path / "bad", [real[:5], ["decoder.layers.9.mlp.experts.experts.3.linear_fc1.weight"]])
    checks = {
        "keys absent": (bad, _save_result(2), "1 key(s) the ranks saved are not in"),
        "no checkpoint": (SaveDir(tmp_path / "empty"), _save_result(2), "no such file or directory"),
        "a rank short": (good, _save_result(1), "rank 1 reported no save at"),
        "another topology": (good, _save_result(2, "tp2-etp1-ep1-pp1"), "rank 0 reported no save at"),
    }
    for what, (save, result, text) in checks.items():
        got = verified_save(save, result, SAVE, 2)
        assert not got.ok and got.cause.kind == CauseKind.UNVERIFIED_SAVE, what
        assert text in got.cause.message, (what, got.cause.message)
    shutil.rmtree(tmp_path / "good")  # the symlink only: the golden stays as committed
    assert (GOLDEN_DIR / "modelopt-0.47.0-tp1-etp1-ep8" / "ckpt" / "metadata.json").is_file()
