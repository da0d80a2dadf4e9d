"""Bare ``python -m harness verdict`` on a machine without a GPU: the committed records decide.

Why: nothing of the jobs' cells runs here, but the committed records (tests/data/runs/) of the
installed (nvidia-modelopt, megatron-core) pair decide both jobs; one NO EVIDENCE line and exit 4
told a job owner nothing. Expected words come from the records, read with plain json and each
re-judged by today's judge under the verdict's rules (tests/helpers.py ``expected_verdict``); the
exit codes from the README's table for bare ``verdict`` (harness/cli.py EXIT_CODES).
"""
from __future__ import annotations

import importlib.metadata as md
from types import SimpleNamespace

import pytest
from packaging.version import Version

from harness import commands
from harness.machine import tier_skip_reason
from harness.report import verdict
from tests.helpers import committed_cells, expected_verdict

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(tier_skip_reason("gpu-shared", 8) is None,
                                 reason="a GPU is here: bare verdict runs the cells (tier gpu-shared)")]


def _installed_release(dist: str) -> str:
    return Version(md.version(dist)).base_version  # the records name releases; these have no rc


def test_bare_verdict_without_a_gpu_judges_the_committed_records_of_the_installed_pair(tmp_path, capsys):
    pair = (_installed_release("nvidia-modelopt"), _installed_release("megatron-core"))
    raw = committed_cells()
    assert any((c["modelopt"], c["mcore"]) == pair for _, _, cells in raw for c in cells), pair
    args = SimpleNamespace(results=[], results_root=str(tmp_path), job=None, gate=False, patched=False)
    rc = commands.cmd_verdict(args)
    out = capsys.readouterr().out
    assert not any(tmp_path.iterdir()), "no run directory: nothing ran"
    words = {}
    for job in verdict.load_quarantine().jobs:
        want = expected_verdict(raw, job, pair)
        words[job.id] = want
        assert f"== {job.id} on " in out, out
        block = out.split(f"== {job.id} on ", 1)[1].split("\n== ", 1)[0]
        line = next(x for x in block.splitlines() if x.startswith(f"  {job.id}: "))
        if want is None:
            assert line.split(": ", 1)[1].split(" - ")[0] in verdict.UNDECIDED + ("RULE UNKNOWN",), line
        else:
            assert line.startswith(f"  {job.id}: {want} - "), line
        assert "what would change it: " in block, block
    # README: 1 for an UNEXPECTED FAILURE, 0 when a verdict decides for at least one job, else 4
    if verdict.UNEXPECTED in words.values():
        assert rc == 1
    else:
        assert rc == (0 if any(w is not None for w in words.values()) else 4), (words, out)
    assert len([w for w in words.values() if w is not None]) >= 1, "the committed records decide a job"


def test_bare_verdict_names_the_change_that_would_let_a_job_out(tmp_path, capsys):
    """A SAFE WITH PATCH job: the fix in its pipeline; a BLOCKED or SAFE one: another release."""
    pair = (_installed_release("nvidia-modelopt"), _installed_release("megatron-core"))
    raw = committed_cells()
    commands.cmd_verdict(SimpleNamespace(results=[], results_root=str(tmp_path), job=None,
                                         gate=False, patched=False))
    out = capsys.readouterr().out
    for job in verdict.load_quarantine().jobs:
        want = expected_verdict(raw, job, pair)
        block = out.split(f"== {job.id} on ", 1)[1].split("\n== ", 1)[0]
        change = next(x for x in block.splitlines() if "what would change it: " in x)
        if want == verdict.SAFE_WITH_PATCH:
            assert "the fix in the job's pipeline" in change and "--patched" in change, change
        elif want in (verdict.BLOCKED, verdict.SAFE):
            assert "another release" in change and "--gate --modelopt" in change, change
