"""What a cell record keeps of each stage (harness/run/cell.py _note_stage): rank 0's phase
durations and, per stage, the largest rank's and the summed peak memory."""
from __future__ import annotations

import pytest

from harness.records import CellRecord, StageResult
from harness.run.cell import _note_stage

pytestmark = pytest.mark.cpu


def test_durations_of_rank0_and_memory_over_all_ranks():
    rec = CellRecord(scenario="s", cell_id="c", tier="gpu-shared", backend="te",
                     save_topology="tp1-etp1-ep2-pp1", load_topology=None, patch="fix", expected="pass")
    stage = StageResult(stage="save", ok=True, wall_s=12.5, rank_results={
        "0": {"durations": {"imports": 3.0}, "memory": {"rss_peak_mib": 100.0, "gpu_peak_reserved_mib": 20.0}},
        "1": {"durations": {"imports": 9.0}, "memory": {"rss_peak_mib": 300.5}},
        "2": {"durations": {"imports": 1.0}},  # a rank that reported no memory is not counted
    })
    _note_stage(rec, "save", stage)
    assert rec.durations == {"save_stage": 12.5, "save.imports": 3.0}
    assert rec.memory == {"save": {"ranks": 2, "rss_peak_mib_max": 300.5, "rss_peak_mib_sum": 400.5,
                                   "gpu_peak_reserved_mib_max": 20.0, "gpu_peak_reserved_mib_sum": 20.0}}


def test_start_and_exit_frame_rank0_phases_so_they_add_up_to_the_stage_wall():
    rec = CellRecord(scenario="s", cell_id="c", tier="cpu", backend="local",
                     save_topology="tp1-etp1-ep2-pp1", load_topology=None, patch="fix", expected="pass")
    t0 = 1_000_000.0
    stage = StageResult(stage="save", ok=True, wall_s=20.0, started_at=t0, rank_results={
        "0": {"durations": {"imports": 8.0, "save": 5.0}, "clock_started_at": t0 + 4.0,
              "result_written_at": t0 + 17.5},
        "1": {"durations": {"imports": 9.0}, "clock_started_at": t0 + 1.0, "result_written_at": t0 + 19.0},
    })
    _note_stage(rec, "save", stage)
    assert rec.durations == {"save_stage": 20.0, "save.start": 4.0, "save.imports": 8.0,
                             "save.save": 5.0, "save.exit": 2.5}
    assert list(rec.durations) == ["save_stage", "save.start", "save.imports", "save.save", "save.exit"]


def test_older_stage_records_without_epochs_keep_only_the_phases():
    rec = CellRecord(scenario="s", cell_id="c", tier="cpu", backend="local",
                     save_topology="tp1-etp1-ep2-pp1", load_topology=None, patch="fix", expected="pass")
    _note_stage(rec, "load", StageResult(stage="load", ok=True, wall_s=3.0,
                                         rank_results={"0": {"durations": {"load": 1.0}}}))
    assert rec.durations == {"load_stage": 3.0, "load.load": 1.0}


def test_a_stage_past_its_limit_is_noted_as_a_fact_of_the_cell():
    """CellRecord.timed_out: what re-judging reads (harness/check/rejudge.py), not the reason."""
    rec = CellRecord(scenario="s", cell_id="c", tier="cpu", backend="local",
                     save_topology="tp1-etp1-ep2-pp1", load_topology="tp1-etp1-ep1-pp1", patch="fix",
                     expected="pass")
    _note_stage(rec, "save", StageResult(stage="save", ok=True, wall_s=3.0))
    assert rec.timed_out is False and rec.as_dict()["timed_out"] is False
    _note_stage(rec, "load", StageResult(stage="load", ok=False, wall_s=300.0, timed_out=True))
    assert rec.timed_out is True


def test_the_peaks_scope_is_kept_as_a_word_not_summed():
    rec = CellRecord(scenario="s", cell_id="c", tier="cpu", backend="local",
                     save_topology="tp1-etp1-ep2-pp1", load_topology=None, patch="none", expected="pass")
    stage = StageResult(stage="load", ok=True, wall_s=1.0, rank_results={
        str(r): {"memory": {"rss_peak_mib": 100.0 + r, "rss_peak_scope": "since-reset"}} for r in range(2)})
    _note_stage(rec, "load", stage)
    assert rec.memory["load"] == {"ranks": 2, "rss_peak_mib_max": 101.0, "rss_peak_mib_sum": 201.0,
                                  "rss_peak_scope": "since-reset"}


def test_a_stage_reports_its_own_host_peak_not_its_predecessors():
    """A warm pool rank runs stage after stage; getrusage's peak is its whole life's.
    After reset_peak_memory (rank/serve.py, before every stage but the first) the peak is the
    stage's own: 300 MiB touched before the reset are not in it."""
    from harness.rank.setup import peak_memory, reset_peak_memory

    before = bytearray(300 * 2**20)
    before[::4096] = b"\1" * len(before[::4096])  # touch every page: resident
    high = peak_memory()["rss_peak_mib"]
    del before
    reset_peak_memory()
    after = peak_memory()
    assert after["rss_peak_scope"] == "since-reset"
    assert after["rss_peak_mib"] < high - 250, (high, after)
