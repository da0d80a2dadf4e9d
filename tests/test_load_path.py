"""Loads as the jobs load. megatron-core's StrictHandling (Megatron-LM's
--dist-ckpt-strictness; Nano QAD reloads with log_all) and Megatron-LM's non-strict retry of
``load_state_dict``, through harness.model.checkpoint on a real gloo rank: what the jobs' path
only logs or retries must land in the load's notes (the record's verify.load_warnings)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness import bounded
from harness.paths import REPO_ROOT

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def loads(tmp_path_factory) -> dict:
    """One rank, one save, a load per mode (tests/rank_programs/load_strictness.py MODES)."""
    tmp = tmp_path_factory.mktemp("load-path")
    r = bounded.run([sys.executable, "-m", "tests.rank_programs.load_strictness", str(tmp / "ckpt"),
                     str(tmp / "init")], timeout_s=240, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True).raise_if_timed_out()
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # real loads at each strictness
def test_the_default_strictness_refuses_a_key_the_checkpoint_lacks(loads):
    got = loads["assume_ok_unexpected"]
    assert got["raised"] == "CheckpointException" and got["b"] == [1.0 + ord("b")] * 4


@pytest.mark.slow  # real loads at each strictness
def test_log_all_only_logs_it_and_the_model_keeps_its_own_value(loads):
    got = loads["log_all+megatron-lm"]
    assert got["raised"] is None
    assert got["a"] == [1.0 + ord("a")] * 4  # loaded from the checkpoint
    assert got["b"] == [1.0 + ord("b")] * 4  # never in the checkpoint: the model's own value
    assert any(n.startswith("dist_checkpointing (log_all):") and "'b'" in n for n in got["notes"])
    assert any("Megatron-LM's load_checkpoint loads once more non-strict" in n for n in got["notes"])


@pytest.mark.slow  # real loads at each strictness
def test_without_megatron_lm_mode_the_strict_load_state_dict_raises(loads):
    assert loads["log_all"]["raised"] == "RuntimeError"


def test_an_unknown_strictness_is_one_line_at_planning(tmp_path):
    from harness.scenario.scenarios import load_all_with_errors

    (tmp_path / "s.toml").write_text('tier = "cpu"\nbackend = "local"\nsaves = ["tp1-etp1-ep1"]\n'
                                     'dist_ckpt_strictness = "log_some"\n')
    _, (err,) = load_all_with_errors(tmp_path)
    assert "\n" not in str(err)
    assert "dist_ckpt_strictness: 'log_some' is not one of megatron-core's StrictHandling values" in str(err)
    assert "log_all" in str(err)


def test_megatron_core_0_19_2_has_no_modelopt_state_restore_of_its_own():
    """Item 6 asks for megatron-core's own ModelOpt-state restore where the installed version has
    one besides ModelOpt's. 0.19.2 (megatron.core and the megatron.training it ships) defines none:
    Megatron-LM calls ModelOpt's restore_sharded_modelopt_state, as harness/model/checkpoint.py
    does. Megatron-LM main after 0.19 copies `_load_extra_state_from_sharded_checkpoint`
    (Megatron-LM #6324): a version that defines it fails here, and needs that path."""
    import importlib.metadata
    import re
    from pathlib import Path

    import megatron

    if importlib.metadata.version("megatron-core") != "0.19.2":
        pytest.skip("read for megatron-core 0.19.2 only")
    root = Path(megatron.__path__[0])
    defined = re.compile(r"^\s*def (_load_extra_state_from_sharded_checkpoint|restore_sharded_modelopt_state"
                         r"|restore_modelopt_state|load_modelopt_state)\b", re.M)
    hits = [f"{p.relative_to(root)}: {m.group(1)}" for p in root.rglob("*.py")
            for m in defined.finditer(p.read_text(errors="replace"))]
    assert hits == []
