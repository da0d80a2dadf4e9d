"""Teardown after the bug's REAL failure on the cpu tier: a dist_checkpointing.save whose
per-expert amax follow modelopt 0.47.0's replica rule. Global rank 0 raises megatron's
CheckpointingException; the other ranks die in the save's next collective. The harness must
name rank 0's exception as the cause, label the rest secondary, and leave nothing running.
"""
from __future__ import annotations

import pytest

from harness.run.validation_probes import run_probe

TEARDOWN_LIMIT_S = 5.0


def _save(tmp_path, topology: str, rule: str, world: int):
    return run_probe({"probe": "save", "topology": topology, "rule": rule, "num_experts": 8,
                      "ckpt": str(tmp_path / "ckpt")}, world, tmp_path / "stage", timeout_s=180)


def _assert_bug_cause(run, world: int) -> None:
    assert not run.ok
    cause = run.cause
    assert cause is not None and cause.rank == 0 and not cause.secondary, run.summary()
    assert cause.exc_type.endswith("CheckpointingException"), run.summary()
    assert "Invalid access pattern" in cause.message
    assert cause.key and cause.key.endswith("weight_quantizer._amax"), cause.key
    assert {f.rank for f in run.secondaries} <= set(range(1, world))
    assert all(f.secondary for f in run.secondaries)
    assert run.teardown_s is not None and run.teardown_s <= TEARDOWN_LIMIT_S, run.teardown_s
    assert run.leftovers == []
    assert not run.timed_out


@pytest.mark.cpu
# the 2-rank shape in `make test`; the 4-rank one (tp < etp) under -m slow
@pytest.mark.parametrize("topology,world", [
    ("tp2-etp1-ep2", 2), pytest.param("tp1-etp2-ep2", 4, marks=pytest.mark.slow)])
def test_buggy_save_names_rank0_exception_and_tears_down(tmp_path, topology, world):
    _assert_bug_cause(_save(tmp_path, topology, "buggy", world), world)


@pytest.mark.slow  # the control: the fixed rule's replica ids are tests/test_fix_patch.py's
@pytest.mark.cpu
def test_fixed_rule_saves_at_the_same_topology(tmp_path):
    run = _save(tmp_path, "tp2-etp1-ep2", "fixed", 2)
    assert run.ok, run.summary()
    assert (tmp_path / "ckpt" / "metadata.json").is_file()


@pytest.mark.cpu
@pytest.mark.slow
def test_buggy_save_report_topology_8_ranks(tmp_path):
    _assert_bug_cause(_save(tmp_path, "tp4-etp1-ep8", "buggy", 8), 8)
