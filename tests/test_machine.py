"""harness/machine.py: what code asks of a skip reason or a version problem is typed
(a kind, a fatal flag), while the text a reader sees stays as it was written."""
from __future__ import annotations

import pytest

from harness import machine
from harness.machine import SKIP_TEXTS, SkipKind, skip_kind

pytestmark = pytest.mark.cpu

FIELDS = {"tier": "gpu-shared", "tiers": "cpu, gpu-shared, gpu", "world": 8, "gpus": 2,
          "error": "Transformer Engine unavailable (RuntimeError: no GPU here)",
          "need": 70656, "per": 2208, "total": 81559}


@pytest.mark.parametrize("kind", list(SkipKind))
def test_each_reason_is_read_back_as_its_kind(kind):
    text = SKIP_TEXTS[kind].format(**FIELDS)
    assert skip_kind(text) is kind
    assert skip_kind(f"{text}; needs mamba-ssm: the hybrid model, and it is not installed") is kind


def test_only_missing_gpus_lack_gpus_and_other_reasons_have_no_kind():
    assert {k for k in SkipKind if k.lacks_gpus} == {SkipKind.NO_GPU, SkipKind.TOO_FEW_GPUS}
    # a Transformer Engine error may say "GPU": the kind, not the words, decides
    assert not skip_kind(SKIP_TEXTS[SkipKind.NO_TE].format(**FIELDS)).lacks_gpus
    for other in ("blocked by the save at tp4-etp1-ep8-pp1, which failed; not run",
                  "needs 8 GPUs for tier gpu, 2 visible", "", None):
        assert skip_kind(other) is None


def test_recorded_reasons_keep_their_words():
    """The texts as the committed runs recorded them (tests/data/runs/, tests/test_matrix.py)."""
    assert SKIP_TEXTS[SkipKind.NO_GPU].format(tier="gpu-shared") == (
        "tier gpu-shared needs a CUDA GPU; none visible (run the cpu tier here)")
    assert SKIP_TEXTS[SkipKind.TE_ON_CPU].startswith(
        "tier cpu runs where Transformer Engine is not installed: with TE, megatron-core routes")


@pytest.mark.parametrize("mcore, modelopt, override, fatal", [
    (None, "0.47.0", "", True),  # megatron-core missing
    ("0.17.0", "0.47.0", "", True),  # untested megatron-core, no override
    ("0.17.0", "0.47.0", "1", False),  # ... with HARNESS_ANY_MCORE=1: a warning
    ("0.19.2", None, "", True),  # nvidia-modelopt missing
    ("0.19.2", "9.9.9", "", False),  # a pair without a rule: its cells are rule-unknown
    ("0.19.2", "0.47.0", "", None),  # the reference pair: no problem
])
def test_a_version_problem_says_whether_it_stops_the_run(monkeypatch, mcore, modelopt, override,
                                                          fatal):
    versions = {"megatron-core": mcore, "nvidia-modelopt": modelopt}
    monkeypatch.setattr(machine, "version", versions.get)
    monkeypatch.setenv(machine.MCORE_OVERRIDE, override)
    problem = machine.version_problem()
    assert (problem.fatal if problem else None) is fatal
    assert problem is None or problem.line
