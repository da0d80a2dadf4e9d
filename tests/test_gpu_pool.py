"""GPU packing on fake nodes of 1, 2 and 8 GPUs: no GPU is handed to two running cells, big
cells go first, no cell gets fewer GPUs than its tier needs, and cells that do not fit say why."""
from __future__ import annotations

import pytest

from bench.packing import Assignment, CellDemand, estimate_wall, plan_schedule
from harness.launch.gpus import visible_gpus, worker_visible_devices
from harness.tiers import gpus_needed

pytestmark = pytest.mark.cpu


def mixed_cells() -> list[CellDemand]:
    return [
        CellDemand("save-tp1-etp2-ep1", 2),
        CellDemand("reshard-tp4-etp1-ep8", 8),
        CellDemand("save-tp2-etp1-ep2", 2),
        CellDemand("shared-tp2-etp2-ep2", 4, "gpu-shared"),
        CellDemand("mid-tp2-etp1-ep4", 4),
        CellDemand("cpu-tp2-etp1-ep2", 2, "cpu"),
        CellDemand("save-tp2-etp2-ep1", 2),
        CellDemand("single", 1),
    ]


def assert_disjoint_per_wave(plan: list[Assignment]) -> None:
    by_wave: dict[int, list[str]] = {}
    for a in plan:
        if not a.skipped:
            by_wave.setdefault(a.wave, []).extend(a.gpus)
    for wave, gpus in by_wave.items():
        assert len(gpus) == len(set(gpus)), f"wave {wave} hands a GPU out twice: {gpus}"


@pytest.mark.parametrize("n_gpus", [1, 2, 8])
def test_disjoint_and_never_fewer_than_needed(n_gpus):
    plan = plan_schedule(mixed_cells(), n_gpus)
    assert {a.cell_id for a in plan} == {c.cell_id for c in mixed_cells()}
    assert_disjoint_per_wave(plan)
    for a in plan:
        if a.skipped:
            continue
        assert len(a.gpus) >= gpus_needed(a.tier, a.ranks)
        assert len(a.gpus) <= n_gpus
        if a.tier == "gpu":
            assert len(a.gpus) == a.ranks
        assert set(a.gpus) <= set(visible_gpus(n_gpus))


def test_largest_first():
    plan = plan_schedule(mixed_cells(), 8)
    gpu_cells = [a for a in plan if a.tier != "cpu"]
    # The 8-wide cell starts first and owns wave 0 alone; after it, widths never grow.
    assert [a.cell_id for a in gpu_cells if a.wave == 0] == ["reshard-tp4-etp1-ep8"]
    assert gpu_cells[1].cell_id == "mid-tp2-etp1-ep4"
    widths = [len(a.gpus) for a in gpu_cells]
    assert widths == sorted(widths, reverse=True)


def test_eight_gpu_node_runs_four_two_rank_cells_at_once():
    cells = [CellDemand(f"pair{i}", 2) for i in range(8)]
    plan = plan_schedule(cells, 8)
    waves = sorted({a.wave for a in plan})
    assert waves == [0, 1]
    first = [a for a in plan if a.wave == 0]
    assert len(first) == 4
    assert sorted(g for a in first for g in a.gpus) == [str(i) for i in range(8)]
    assert_disjoint_per_wave(plan)


def test_gpu_cell_too_wide_falls_back_to_shared_with_reason():
    plan = plan_schedule([CellDemand("wide", 8)], 2)
    (a,) = plan
    assert not a.skipped
    assert a.tier == "gpu-shared"
    assert a.gpus == ("0", "1")
    assert a.reason.startswith("needs 8 GPUs for tier gpu, 2 visible")


def test_gpu_cell_too_wide_skipped_with_reason():
    (a,) = plan_schedule([CellDemand("wide", 8)], 2, on_too_big="skip")
    assert a.skipped and a.gpus == ()
    assert a.reason == "needs 8 GPUs for tier gpu, 2 visible"


def test_one_gpu_node():
    plan = plan_schedule([CellDemand("two", 2), CellDemand("one", 1), CellDemand("sh", 4, "gpu-shared")], 1)
    by_id = {a.cell_id: a for a in plan}
    assert by_id["one"].tier == "gpu" and by_id["one"].gpus == ("0",)
    assert by_id["two"].tier == "gpu-shared"
    assert "needs 2 GPUs for tier gpu, 1 visible" in by_id["two"].reason
    assert by_id["sh"].gpus == ("0",) and by_id["sh"].reason is None
    assert_disjoint_per_wave(plan)
    assert len({a.wave for a in plan}) == 3  # one GPU: one cell at a time


def test_no_gpus_skips_gpu_tiers_keeps_cpu():
    plan = plan_schedule([CellDemand("g", 2), CellDemand("s", 2, "gpu-shared"), CellDemand("c", 2, "cpu")], 0)
    by_id = {a.cell_id: a for a in plan}
    assert by_id["g"].skipped and by_id["g"].reason == "needs 2 GPUs for tier gpu, 0 visible"
    assert by_id["s"].skipped and by_id["s"].reason == "needs 1 GPU for tier gpu-shared, 0 visible"
    assert not by_id["c"].skipped and by_id["c"].gpus == ()


def test_real_device_ids_are_handed_out():
    plan = plan_schedule([CellDemand("a", 2), CellDemand("b", 2)], "4,5,6,7")
    assert sorted(a.cuda_visible_devices for a in plan) == ["4,5", "6,7"]


def test_visible_gpus_parsing():
    assert visible_gpus(3) == ["0", "1", "2"]
    assert visible_gpus("GPU-aa, GPU-bb") == ["GPU-aa", "GPU-bb"]
    assert visible_gpus("0,1,-1,2") == ["0", "1"]
    assert visible_gpus("") == []
    assert visible_gpus(None, environ={}) == []
    assert visible_gpus(None, environ={"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]


def test_unknown_tier_rejected():
    with pytest.raises(ValueError, match="unknown tier"):
        CellDemand("x", 2, "tpu")


@pytest.mark.parametrize(
    "n_gpus,n_workers,expected",
    [
        (8, 4, ["0,1", "2,3", "4,5", "6,7"]),
        (8, 2, ["0,1,2,3", "4,5,6,7"]),
        (8, 3, ["0,1,2", "3,4,5", "6,7"]),
        (2, 2, ["0", "1"]),
        (1, 1, ["0"]),
    ],
)
def test_worker_visible_devices_disjoint(n_gpus, n_workers, expected):
    got = [worker_visible_devices(f"gw{k}", n_gpus, n_workers) for k in range(n_workers)]
    assert got == expected
    flat = [g for block in got for g in block.split(",")]
    assert len(flat) == len(set(flat)) == n_gpus


def test_worker_visible_devices_edges():
    assert worker_visible_devices("master", 2, 1) == "0,1"
    assert worker_visible_devices("gw1", "4,5,6,7", 2) == "6,7"
    assert worker_visible_devices("gw3", 0, 4) == ""
    with pytest.raises(ValueError, match="run with -n 2 or fewer"):
        worker_visible_devices("gw0", 2, 4)
    with pytest.raises(ValueError, match="not a pytest-xdist worker id"):
        worker_visible_devices("worker0", 2, 1)


def test_estimate_wall_packing_beats_serial():
    durations = [(2, 10.0)] * 8
    assert estimate_wall(durations, 8) == pytest.approx(20.0)
    assert estimate_wall(durations, 2) == pytest.approx(80.0)
    assert estimate_wall([(8, 30.0), (2, 10.0), (2, 10.0)], 8) == pytest.approx(40.0)
    # Wider than the node: runs shared on the whole node, never dropped.
    assert estimate_wall([(8, 5.0)], 2) == pytest.approx(5.0)
    assert estimate_wall([], 8) == 0.0
