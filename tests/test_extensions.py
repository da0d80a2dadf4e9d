"""The stages' TORCH_EXTENSIONS_DIR: one directory per ModelOpt version (harness/model/extensions.py)."""
from pathlib import Path

import pytest

from harness.launch.command import stage_env
from harness.machine import version
from harness.model.extensions import extensions_dir

pytestmark = pytest.mark.cpu

NAME = f"nvidia-modelopt-{version('nvidia-modelopt') or 'absent'}"


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
