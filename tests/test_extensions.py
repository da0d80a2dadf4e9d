"""The stages' TORCH_EXTENSIONS_DIR: one directory per ModelOpt version (harness/launch/extensions.py)."""
import sys
from pathlib import Path

import pytest

from harness.launch.command import stage_env
from harness.machine import version
from harness.launch.extensions import extensions_dir

pytestmark = pytest.mark.cpu

NAME = (f"nvidia-modelopt-{version('nvidia-modelopt')}-py{sys.version_info[0]}{sys.version_info[1]}"
        f"-torch{version('torch')}")


def test_a_version_directory_under_the_users_root_or_torchs_default():
    assert extensions_dir({"TORCH_EXTENSIONS_DIR": "/scratch/ext"}) == f"/scratch/ext/{NAME}"
    assert extensions_dir({"XDG_CACHE_HOME": "/c"}) == f"/c/torch_extensions/{NAME}"
    assert extensions_dir({}) == str(Path.home() / ".cache" / "torch_extensions" / NAME)


def test_idempotent_so_a_stage_launched_from_a_stage_env_does_not_nest():
    once = extensions_dir({"TORCH_EXTENSIONS_DIR": "/scratch/ext"})
    assert extensions_dir({"TORCH_EXTENSIONS_DIR": once}) == once


def test_every_stage_gets_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    env = stage_env("save", tmp_path / "stage", 10, None, None)
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / NAME)


def test_only_a_recipe_other_than_the_default_may_build_the_fp8_extension():
    from harness.launch.extensions import may_need_fp8_extension
    from harness.model.recipes import DEFAULT_RECIPE

    assert not may_need_fp8_extension(set())
    assert not may_need_fp8_extension({DEFAULT_RECIPE})
    assert may_need_fp8_extension({DEFAULT_RECIPE, "modelopt:models/nvidia/x/ptq/nvfp4-4o6"})


def _cell(tier, recipe):
    from types import SimpleNamespace
    return SimpleNamespace(world=2, scenario=SimpleNamespace(tier=tier, recipe=recipe, size=None,
                                                             shared_gpu_nccl=False))


def test_run_cells_warms_up_only_for_runnable_cuda_cells(monkeypatch):
    import io

    import harness.launch.extensions as ext
    from harness.run import cells as run_cells

    calls = []
    monkeypatch.setattr(ext, "warm_up", lambda: calls.append(1) or "warmed")
    mse = "mtq:MAMBA_MOE_NVFP4_CONSERVATIVE_CFG"
    run_cells._warm_extensions([_cell("cpu", mse)], io.StringIO())
    assert calls == []  # the cpu tier: no CUDA
    monkeypatch.setattr(run_cells, "skip_reason", lambda *a: "no GPU")
    run_cells._warm_extensions([_cell("gpu-shared", mse)], io.StringIO())
    assert calls == []  # skipped cells build nothing
    monkeypatch.setattr(run_cells, "skip_reason", lambda *a: None)
    out = io.StringIO()
    run_cells._warm_extensions([_cell("gpu-shared", mse)], out)
    assert calls == [1] and out.getvalue() == "warmed\n"


def test_warm_up_is_bounded():
    from harness.launch.extensions import warm_up

    assert "not built within 0 s (killed)" in warm_up(timeout_s=0.01)


@pytest.mark.slow  # imports ModelOpt in a child (10-30 s on 2 cores)
def test_warm_up_says_why_it_built_nothing():
    from harness.launch.extensions import warm_up

    line = warm_up(timeout_s=120)  # no CUDA here: ModelOpt skips the extension
    assert line.startswith("ModelOpt FP8 extension: not available") and "NOT available" in line
