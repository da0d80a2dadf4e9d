"""Which pool a stage gets (harness/launch/pool.py PoolSet): a busy warm pool of its key is
waited for; without one a stage starts its own pool. cpu tier, no processes: torchrun's start
and the stage watch are replaced by stand-ins, the PoolSet and RankPool code is the real one."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from harness.launch import pool as pool_mod
from harness.launch.pool import PoolKey, PoolSet

pytestmark = pytest.mark.cpu


class FakeProc:
    def poll(self):
        return None

    def wait(self, timeout=None):
        return 0


@pytest.fixture
def fake_launch(monkeypatch):
    """Stages named ``ok-<seconds>`` pass after that long; ``fail-<seconds>`` fail."""
    monkeypatch.setattr(pool_mod, "start_torchrun", lambda *a, **k: FakeProc())
    monkeypatch.setattr(pool_mod, "end_session", lambda *a, **k: [])
    monkeypatch.setattr(pool_mod, "pool_processes", lambda *a, **k: [])

    def supervise(stage, stage_dir, proc, t0, timeout_s, grace_s, **_):
        verdict, seconds = stage.split("-")
        time.sleep(float(seconds))
        return SimpleNamespace(ok=verdict == "ok", stage=stage)

    monkeypatch.setattr(pool_mod, "supervise", supervise)


def key(tmp_path, world=2, tier="cpu"):
    return PoolKey(world, tier, "fix", "local", str(tmp_path))


def run(pools, k, tmp_path, stage, name):
    return pools.run(k, tmp_path / "spec.json", stage, tmp_path / name, timeout_s=60)


def at_once(*calls):
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
        time.sleep(0.05)  # in this order
    for t in threads:
        t.join(10)


def test_a_stage_waits_for_the_busy_warm_pool_of_its_key(tmp_path, fake_launch):
    pools, k = PoolSet(), key(tmp_path)
    assert run(pools, k, tmp_path, "ok-0", "first").ok  # the pool is warm and idle now
    got = []
    at_once(lambda: got.append(run(pools, k, tmp_path, "ok-0.5", "a").ok),
            lambda: got.append(run(pools, k, tmp_path, "ok-0", "b").ok))
    assert got == [True, True]
    assert (pools.started, pools.waited, pools.stages) == (1, 1, 3)
    pools.close_all()


def test_without_a_warm_pool_stages_start_their_own(tmp_path, fake_launch):
    pools, k = PoolSet(), key(tmp_path)
    at_once(lambda: run(pools, k, tmp_path, "ok-0.5", "a"),
            lambda: run(pools, k, tmp_path, "ok-0.5", "b"))
    assert (pools.started, pools.waited) == (2, 0)
    pools.close_all()


def test_another_key_does_not_wait(tmp_path, fake_launch):
    pools = PoolSet()
    assert run(pools, key(tmp_path), tmp_path, "ok-0", "first").ok
    at_once(lambda: run(pools, key(tmp_path), tmp_path, "ok-0.5", "a"),
            lambda: run(pools, key(tmp_path, world=4), tmp_path, "ok-0", "b"))
    assert (pools.started, pools.waited) == (2, 0)
    pools.close_all()


def test_a_waiting_stage_gets_a_new_pool_when_the_warm_one_fails(tmp_path, fake_launch):
    pools, k = PoolSet(), key(tmp_path)
    assert run(pools, k, tmp_path, "ok-0", "first").ok
    got = {}
    at_once(lambda: got.update(a=run(pools, k, tmp_path, "fail-0.3", "a").ok),
            lambda: got.update(b=run(pools, k, tmp_path, "ok-0", "b").ok))
    assert got == {"a": False, "b": True}
    assert (pools.started, pools.waited) == (2, 1)
    pools.close_all()


def test_an_interrupt_ends_the_wait_without_a_stage(tmp_path, fake_launch, monkeypatch):
    pools, k = PoolSet(), key(tmp_path)
    assert run(pools, k, tmp_path, "ok-0", "first").ok
    stop = threading.Event()
    monkeypatch.setattr(pool_mod, "shutdown_signal", lambda: "SIGINT" if stop.is_set() else None)
    monkeypatch.setattr(pool_mod, "not_started", lambda stage, d: SimpleNamespace(ok=False, stage="not started"))
    got = {}
    t = threading.Thread(target=lambda: got.update(a=run(pools, k, tmp_path, "ok-1", "a")))
    t.start()
    time.sleep(0.1)
    waiter = threading.Thread(target=lambda: got.update(b=run(pools, k, tmp_path, "ok-0", "b")))
    waiter.start()
    time.sleep(0.2)
    stop.set()
    waiter.join(3)
    assert not waiter.is_alive() and got["b"].stage == "not started"
    t.join(5)
    assert pools.started == 1
    pools.close_all()


def test_taking_one_idle_pool_leaves_the_other_idle_pools_of_its_key_running(tmp_path, fake_launch):
    pools, k = PoolSet(), key(tmp_path)
    at_once(lambda: run(pools, k, tmp_path, "ok-0.3", "a"),
            lambda: run(pools, k, tmp_path, "ok-0.3", "b"))  # two warm idle pools now
    assert pools.started == 2
    at_once(lambda: run(pools, k, tmp_path, "ok-0.3", "c"),
            lambda: run(pools, k, tmp_path, "ok-0.3", "d"))
    assert (pools.started, pools.waited) == (2, 0)
    pools.close_all()


def test_a_phase_starts_with_the_stages_that_have_an_idle_pool(monkeypatch):
    """Then a stage that starts a pool cannot first close (off the cpu tier) the idle pools
    the save phase left for them; within each part, stages stay grouped by world size."""
    from harness.run import cells as cells_mod
    from harness.scenario.scenarios import load_all

    loads = [c for s in load_all() if s.name == "cpu-reshard" for c in s.cells() if c.load]
    monkeypatch.setenv("HARNESS_STAGE_MODE", "pool")
    monkeypatch.setattr(cells_mod.POOLS, "idle_shapes", lambda: {("cpu", "none", "local", 4)})
    worlds = [c.load.world_size for c in cells_mod._phase_order(loads, "load")]
    assert worlds[0] == 4 and worlds[1:] == sorted(worlds[1:]) and 4 not in worlds[1:], worlds


def test_idle_shapes_name_the_live_idle_pools(tmp_path, fake_launch):
    pools = PoolSet()
    assert run(pools, key(tmp_path), tmp_path, "ok-0", "a").ok
    assert not run(pools, key(tmp_path, world=4), tmp_path, "fail-0", "b").ok  # dead: not idle
    assert pools.idle_shapes() == {("cpu", "fix", "local", 2)}
    pools.close_all()


def test_the_default_stage_mode_is_warm_only_where_its_equivalence_was_shown(monkeypatch):
    """fork on cpu (docs/benchmarks.md, "Ranks forked from a warm parent"), the pool on
    gpu-shared (docs/runs/README.md); tier gpu (NCCL): none yet."""
    monkeypatch.delenv("HARNESS_STAGE_MODE", raising=False)
    assert [pool_mod.stage_mode(t) for t in ("cpu", "gpu-shared", "gpu")] == ["fork", "pool", "fresh"]
    assert pool_mod.stage_mode() == "fresh"  # no tier named: the reference
    monkeypatch.setenv("HARNESS_STAGE_MODE", "fresh")
    assert {pool_mod.stage_mode(t) for t in ("cpu", "gpu-shared", "gpu")} == {"fresh"}
    monkeypatch.setenv("HARNESS_STAGE_MODE", "pool")
    assert pool_mod.stage_mode("gpu") == "pool"


def test_the_record_says_how_its_stages_started(monkeypatch):
    from harness.run.cell import new_record
    from harness.run.cells import select_cells
    from harness.scenario.scenarios import load_all

    monkeypatch.delenv("HARNESS_STAGE_MODE", raising=False)
    cell = select_cells([s for s in load_all() if s.name == "cpu-reshard"])[0]
    assert new_record(cell).stage_mode == "fork"
    monkeypatch.setenv("HARNESS_STAGE_MODE", "fresh")
    assert new_record(cell).stage_mode == "fresh"
