"""Stage mode fork (issue 55) without a stage: what the warm parent says about itself, and the
lines its stage agents write that the watcher reads. The stages themselves: tests/test_teardown.py
(every failure kind in both modes), tests/test_interrupts.py, tests/test_pool_prestart.py."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from harness.launch import failures as F
from harness.rank import warm
from harness.tiers import TABLE, Tier

pytestmark = pytest.mark.cpu


def test_the_warm_parent_names_the_import_that_makes_it_unforkable(tmp_path, monkeypatch):
    """A tier whose preload list holds a module that starts a thread at import: the parent's
    ready.json names that module, and stops importing there."""
    if threading.active_count() > 1:
        pytest.skip("this pytest process runs other threads already")
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading\nstop = threading.Event()\nthreading.Thread(target=stop.wait, daemon=True).start()\n")
    (tmp_path / "never_imported.py").write_text("raise AssertionError('imported after the refusal')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TABLE, Tier.GPU, dataclasses.replace(
        TABLE[Tier.GPU], fork_preload=("json", "starts_a_thread", "never_imported")))
    try:
        ready = warm.preload("gpu", "none")
    finally:
        import starts_a_thread

        starts_a_thread.stop.set()
    assert ready["preload_failed"] is None
    assert ready["refuses_fork"].startswith("after importing starts_a_thread: Python threads"), ready


def test_the_agents_exit_blocks_and_close_lines_read_as_torchruns():
    """report_exits' block and torch's two wordings for signalling a forked rank."""
    text = ("[warm] rank exit seen by the stage agent:\n[3]:\n  rank      : 3 (local_rank: 3)\n"
            "  exitcode  : -9 (pid: 4242)\n"
            "W1206 api.py:900] Closing process 4243 via signal SIGTERM\n"
            "W1206 spawn.py:165] Terminating process 4244 via signal SIGTERM\n"
            "W1206 api.py:900] Sending process 4245 closing signal SIGTERM\n")
    assert F.parse_elastic_failures(text) == {3: (-9, 4242)}
    assert F.parse_elastic_signalled(text) == {4243, 4244, 4245}
