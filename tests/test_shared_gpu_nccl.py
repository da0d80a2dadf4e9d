"""NCCL ranks sharing GPUs only when a scenario asks (``shared_gpu_nccl``), said
in the record, refused with one line where it cannot run. The NCCL probe behind it ran on a GPU
(docs/runs/20261206-0354-recipes.md); here, cpu tier, the planning and the rank's settings."""
from __future__ import annotations

import os

import pytest

from harness.rank import shared_gpu
from harness import machine
from harness.scenario.scenarios import load_all_with_errors, load_scenario

pytestmark = pytest.mark.cpu

HEAD = 'backend = "te"\nexpect = "oracle"\nshared_gpu_nccl = true\nsaves = ["tp2-etp1-ep2"]\n'


def test_the_mode_needs_tier_gpu_and_says_so_in_one_line(tmp_path):
    (tmp_path / "bad.toml").write_text('tier = "gpu-shared"\n' + HEAD)
    (tmp_path / "good.toml").write_text('tier = "gpu"\n' + HEAD)
    good, bad = load_all_with_errors(tmp_path)
    assert [s.name for s in good] == ["good"] and good[0].shared_gpu_nccl
    (err,) = bad
    assert "\n" not in str(err) and "bad.toml: shared_gpu_nccl: true needs tier 'gpu'" in str(err)


def test_one_gpu_is_enough_only_in_the_mode(monkeypatch):
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    monkeypatch.setattr(machine, "gpu_memory_mib", lambda: 81559)
    monkeypatch.setattr(machine, "te_import_error", lambda: None)
    assert "one GPU per rank: 8 ranks, 1 GPU(s)" in machine.tier_skip_reason("gpu", 8)
    assert machine.tier_skip_reason("gpu", 8, shared_gpu_nccl=True) is None


def test_asked_for_on_a_machine_without_a_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)
    reason = machine.skip_reason("gpu", 8, shared_gpu_nccl=True)
    assert reason and "\n" not in reason and "needs a CUDA GPU" in reason


def test_a_rank_takes_its_own_host_id_only_when_asked(monkeypatch):
    for key in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", shared_gpu.SHARED_GPU_ENV):
        monkeypatch.delenv(key, raising=False)
    assert not shared_gpu.apply(3) and "NCCL_HOSTID" not in os.environ
    monkeypatch.setenv(shared_gpu.SHARED_GPU_ENV, "1")
    assert shared_gpu.apply(3)
    assert os.environ["NCCL_HOSTID"] == "moe-ckpt-harness-rank3"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo" and os.environ["NCCL_IB_DISABLE"] == "1"
    assert shared_gpu.rank_env(0)["NCCL_HOSTID"] != shared_gpu.rank_env(1)["NCCL_HOSTID"]


def test_the_committed_scenario_plans_the_mode_and_names_it(monkeypatch):
    from harness.paths import SCENARIO_DIR
    from harness.run.cell import _tier_env, new_record

    s = load_scenario(SCENARIO_DIR / "gpu_nccl_shared_witness.toml")
    assert s.tier == "gpu" and s.shared_gpu_nccl
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    cell = next(c for c in s.cells() if c.load is not None and c.load.world_size == 8)
    rec = new_record(cell)
    assert rec.nccl_mode == "NCCL, 8 ranks on 1 GPU(s), socket transport (each rank its own host)"
    assert _tier_env("gpu", True)[shared_gpu.SHARED_GPU_ENV] == "1"
    assert shared_gpu.SHARED_GPU_ENV not in _tier_env("gpu")


def test_run_flag_turns_gpu_scenarios_into_the_mode_under_their_own_names(capfd, tmp_path):
    """``run --nccl-shared-gpu``: the same cells on NCCL, ids unchanged (so they compare with the
    gloo run one for one), and a cpu scenario refused in one line while the others go on."""
    import json

    from harness.cli import main
    from harness.scenario.scenarios import as_nccl_shared, load_all

    by_name = {s.name: s for s in load_all()}
    gloo = by_name["gpu-witness"]
    nccl = as_nccl_shared(gloo)
    assert (nccl.tier, nccl.shared_gpu_nccl, nccl.name) == ("gpu", True, gloo.name)
    assert [c.id for c in nccl.cells()] == [c.id for c in gloo.cells()]
    why = as_nccl_shared(by_name["cpu-reshard"])
    assert isinstance(why, str) and "\n" not in why and "cpu_reshard.toml: tier 'cpu'" in why
    code = main(["--results-root", str(tmp_path), "run", "--nccl-shared-gpu", "--scenario",
                 "cpu-reshard", "--scenario", "gpu-world1"])
    err = capfd.readouterr().err
    assert "scenario skipped: scenarios/cpu_reshard.toml: tier 'cpu'" in err
    found = list(tmp_path.glob("*/results.json"))  # gpu-world1 went on, planned as tier gpu
    if not found:  # no GPU here: none of its cells can run, refused in one line naming the tier
        assert code == 2 and "cells can run here: tier gpu needs" in err, err
        return
    cells = json.loads(found[0].read_text())["cells"]
    assert cells and {c["scenario"] for c in cells} == {"gpu-world1"}
    assert {c["tier"] for c in cells} == {"gpu"}


def test_more_ranks_than_the_gpu_memory_holds_is_one_line(monkeypatch):
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    monkeypatch.setattr(machine, "te_import_error", lambda: None)
    monkeypatch.setattr(machine, "gpu_memory_mib", lambda: 81559)  # an H100 80GB
    assert machine.tier_skip_reason("gpu", 8, shared_gpu_nccl=True) is None
    reason = machine.tier_skip_reason("gpu", 64, shared_gpu_nccl=True)
    assert reason and "\n" not in reason
    assert reason.startswith(f"shared_gpu_nccl: 64 NCCL ranks on one GPU need about {64 * machine.SHARED_GPU_NCCL_RANK_MIB} MiB")
    assert machine.skip_kind(reason) == machine.SkipKind.GPU_MEMORY
