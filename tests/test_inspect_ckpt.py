"""The checkpoint inspector on real torch_dist checkpoints built from the GPU recordings.

Keys, shapes and dtypes come from tests/data/recorded (TE TEGroupedMLP + ModelOpt 0.47.0 on an
H200); one world-1 gloo rank on CPU writes them with megatron-core's real torch_dist save
(tests/rank_programs/make_ckpt.py). Variants: the 0.47.0 per-expert layout as recorded, the
pre-0.47 shared layout (per-expert amax keys folded into one key per grouped linear), and a
per-expert checkpoint with some experts' amax missing (what a TP != ETP save with validation
off leaves behind).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.golden.inspect import main
from harness.golden.layout import classify, inspect_checkpoint
from tests.helpers import MAKE_CKPT_GROUP, RECORDED, as_shared, recorded_tensors

pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group(MAKE_CKPT_GROUP)]


@pytest.fixture(scope="module")
def ckpts(made_checkpoints) -> dict[str, Path]:
    """Four checkpoints (per-expert, shared, missing, unquantized) of the session's one make-ckpt
    torchrun rank (conftest.py ``made_checkpoints``; about 30 s, mostly imports)."""
    return {name.split("/", 1)[1]: path for name, path in made_checkpoints.items()
            if name.startswith("inspect/")}


def test_per_expert_layout(ckpts):
    lay = inspect_checkpoint(ckpts["per-expert"])
    assert lay.kind == "per-expert"
    assert (lay.num_layers, lay.num_experts, lay.experts_seen) == (2, 8, list(range(8)))
    assert lay.backend == "torch_dist"
    assert lay.missing == {}
    assert [(li.layer, li.linear, len(li.present)) for li in lay.linears] == [
        (0, "linear_fc1", 8), (0, "linear_fc2", 8), (1, "linear_fc1", 8), (1, "linear_fc2", 8)]
    assert lay.amax_dtypes == ["torch.bfloat16"]
    assert lay.dtypes == {"torch.bfloat16": 94, "torch.float32": 1}  # position embedding is fp32


def test_shared_layout(ckpts):
    lay = inspect_checkpoint(ckpts["shared"])
    assert lay.kind == "shared"
    assert lay.shared_keys == [f"decoder.layers.{l}.mlp.experts.linear_fc{f}.weight_quantizer._amax"
                               for l in (0, 1) for f in (1, 2)]
    assert lay.num_experts == 8 and lay.linears == [] and lay.missing == {}


def test_missing_experts_are_listed(ckpts, capsys):
    lay = inspect_checkpoint(ckpts["missing"])
    assert lay.kind == "per-expert"
    assert lay.missing == {"0.linear_fc1": [1, 3], "1.linear_fc2": [5]}
    assert main(SimpleNamespace(ckpt=str(ckpts["missing"]))) == 1
    out = capsys.readouterr().out
    assert "layer 0 linear_fc1: 6/8 experts with amax, MISSING experts [1, 3]" in out
    assert "3 expert weight-quantizer amax missing" in out


def test_unquantized(ckpts):
    assert inspect_checkpoint(ckpts["unquantized"]).kind == "unquantized"


def test_main_report_and_clean_errors(ckpts, tmp_path, capsys):
    assert main(SimpleNamespace(ckpt=str(ckpts["per-expert"]))) == 0
    out = capsys.readouterr().out
    assert "layout:     per-expert" in out and "experts: 8" in out
    assert main(SimpleNamespace(ckpt=str(tmp_path / "nope"))) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "Traceback" not in err
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.pt").write_bytes(b"\0")
    assert main(SimpleNamespace(ckpt=str(tmp_path / "plain"))) == 2
    assert "not a megatron-core distributed checkpoint" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    assert main(SimpleNamespace(ckpt=str(tmp_path / "broken"))) == 2
    assert "tensor metadata is unreadable" in capsys.readouterr().err


@pytest.mark.parametrize("recording", sorted(p.name for p in RECORDED.glob("*.json")))
def test_every_recording_classifies_per_expert(recording):
    """Pure classification of every recorded topology's keys (no save): all are 0.47.0 per-expert."""
    ts = recorded_tensors(RECORDED / recording)
    lay = classify({t["key"]: (t["dtype"], tuple(t["shape"])) for t in ts})
    assert lay.kind == "per-expert" and lay.num_experts == 8
    assert lay.missing == {}, lay.missing
    assert classify({t["key"]: (t["dtype"], tuple(t["shape"])) for t in as_shared(ts)}).kind == "shared"
