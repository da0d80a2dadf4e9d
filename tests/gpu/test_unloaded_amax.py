"""Part (g) of harness.fix on a real Transformer Engine grouped linear (tier gpu-shared, one GPU).

The finding it pins (docs/findings.md, "Integer expert amax at the restore"): an integer recipe's
load dies of a device-side assert inside ModelOpt's grouped post-restore on 0.48.0rc1 and on
0.47.0 + parts (a)-(f), because the per-expert dry run reads ``_amax`` that ``torch.empty`` made
and nothing loaded yet (moe_ckpt_fix/unloaded_amax.py has the source lines). Each case runs in a
child process (tests/gpu/unloaded_amax_child.py): a device-side assert leaves the CUDA context
unusable. The expectations come from the sources read, per release: unpatched 0.47.0 deletes
experts >= 1's amax before the dry run (the second bug, a strict load then refuses their keys),
0.48.0rc1 keeps them (plugins/custom.py:180-186), part (b) puts them back.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import bounded
from harness.launch.command import STRIP_ENV

pytestmark = pytest.mark.gpu_shared

pytest.importorskip("transformer_engine.pytorch", reason="Transformer Engine is not importable")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

CHILD = Path(__file__).with_name("unloaded_amax_child.py")
# The kernel's assert (tensor_quant_gpu.cu:44), or tensor_quant.py's check without the extension.
DRY_RUN_DEATH = ("device-side assert", "Negative values in amax")


def _child(mode: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = {**{k: v for k, v in os.environ.items() if k not in STRIP_ENV}, "CUDA_LAUNCH_BLOCKING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = bounded.run([sys.executable, str(CHILD), mode], timeout_s=300, env=env, cwd=root,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert not done.timed_out, f"{mode}: no answer in 300 s"
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.startswith("{")]
    assert lines, f"{mode}: rc {done.returncode}, no result line; stderr:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


def _modelopt() -> str:
    from harness.check.versions import installed_modelopt

    return installed_modelopt()


def test_unpatched_load_of_integer_expert_amax():
    got = _child("none")
    if _modelopt() == "0.48.0rc1":  # keeps the members: the dry run reads the unloaded buffers
        assert not got["ok"] and any(t in got["error"] for t in DRY_RUN_DEATH), got
    else:  # 0.47.0: experts >= 1 lose their buffer first; strict load_state_dict refuses
        assert not got["ok"] and "Unexpected key" in got["error"], got


def test_the_fix_without_part_g_meets_the_dry_run():
    got = _child("fix")
    assert "unloaded-amax" not in got["parts"], got
    assert not got["ok"] and any(t in got["error"] for t in DRY_RUN_DEATH), got


def test_part_g_loads_every_expert_amax():
    got = _child("fix-g")
    assert "unloaded-amax" in got["parts"], got
    assert got["ok"] and got["amax_equal"], got
