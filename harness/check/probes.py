"""A validation probe judged: megatron-core's real error (or none) on per-expert amax built by one
rule, against what the collision oracle predicts for that rule at that topology.

The probe (harness/rank/validation_probes.py ``oracle``) is the cpu tier's witness of the bug:
its ranks build the amax ShardedTensors with ModelOpt 0.47.0's replica ids and with the fix's,
and run the real ``validate_sharding_integrity``. The outcome words are a cell's: the error where
the oracle predicts one is the bug reproduced; an error elsewhere, or none where one is
predicted, is unexpected.
"""
from __future__ import annotations

import re

from harness.records import Outcome, ProbeRecord
from harness.topology.oracle import predicts_failure
from harness.topology.topology import Topology

_KEY = re.compile(r"ShardedTensor\(key='([^']+)'")
_MAIN_REPLICAS = re.compile(r"\): tensor\(\[(\d+)\]")  # the count after each key's ShardedTensor
MESSAGE_CHARS = 300  # the error repeats every key: its start says what it is


def judge_probe(topology: str, rule: str, world: int, error: str | None) -> ProbeRecord:
    """The record of one probe result (``error``: the validation's text, None when valid)."""
    predicted = predicts_failure(Topology.parse(topology), rule)
    if error is None:
        return ProbeRecord(topology, rule, world,
                           Outcome.UNEXPECTED_PASS if predicted else Outcome.PASS)
    keys = _KEY.findall(error)
    replicas = _MAIN_REPLICAS.findall(error)
    return ProbeRecord(
        topology, rule, world,
        Outcome.BUG_REPRODUCED if predicted else Outcome.UNEXPECTED_FAILURE,
        exception_type=error.split(":", 1)[0], failing_key=keys[0] if keys else None,
        failing_keys=len(keys), main_replicas=int(replicas[0]) if replicas else None,
        message=error[:MESSAGE_CHARS])
