"""GPU packing of a nightly grid: which cell runs on which GPUs (bench/grid.py).

Why: a nightly run on one 8-GPU node is mostly small cells (2 or 4 ranks). Running them one at
a time leaves most GPUs idle; running them at once on overlapping GPUs makes NCCL ranks of two
cells fight over one device. So every cell gets a DISJOINT set of GPUs through
``CUDA_VISIBLE_DEVICES``, biggest cells are placed first (they are the hardest to fit), and a
cell never gets fewer GPUs than its tier needs:

* tier ``gpu`` (NCCL, one rank per GPU) needs exactly R GPUs for R ranks;
* tier ``gpu-shared`` (gloo ranks sharing GPUs) needs at least one GPU;
* tier ``cpu`` needs none and is not constrained by the pool.

A ``gpu`` cell with more ranks than visible GPUs either falls back to ``gpu-shared`` on every
visible GPU or is skipped; either way its ``reason`` names the constraint
(``needs 8 GPUs for tier gpu, 2 visible``) so the report can say why.

"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable

from harness.launch.gpus import Gpus, plural_gpus, visible_gpus
from harness.tiers import TIERS, Tier, facts, gpus_needed


@dataclass(frozen=True)
class CellDemand:
    """What the scheduler needs to know about one cell.

    ``shared_gpus`` is how many GPUs a ``gpu-shared`` cell asks for (at least one; more spreads
    its ranks' memory). ``seconds`` is an estimate, used only to order equal-sized cells and by
    `estimate_wall`.
    """

    cell_id: str
    ranks: int
    tier: str = Tier.GPU
    shared_gpus: int = 1
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"cell {self.cell_id}: unknown tier {self.tier!r}, expected one of {TIERS}")
        if self.ranks < 1:
            raise ValueError(f"cell {self.cell_id}: ranks must be >= 1 (got {self.ranks})")


@dataclass(frozen=True)
class Assignment:
    """One cell's place in the schedule.

    ``tier`` is the tier it will really run on (after a fallback). ``gpus`` are device ids taken
    from the caller's visible list, so a controller that itself sees ``4,5,6,7`` hands a cell
    ``4,5`` and not ``0,1``. ``wave`` numbers the batches of cells that run at the same time when
    all cells take equally long; ``start`` is the estimated start in seconds when ``seconds`` were
    given (in units of one cell when not). ``reason`` explains a fallback or a skip; it is None
    for a cell placed as asked.
    """

    cell_id: str
    tier: str
    ranks: int
    gpus: tuple[str, ...]
    wave: int
    start: float = 0.0
    skipped: bool = False
    reason: str | None = None

    @property
    def cuda_visible_devices(self) -> str:
        """The value to export as ``CUDA_VISIBLE_DEVICES`` for this cell's torchrun."""
        return ",".join(self.gpus)


def _fit(cell: CellDemand, n_visible: int, on_too_big: str) -> tuple[str, int, str | None]:
    """(tier, GPUs, reason) for one cell, or tier "" when it cannot run here at all."""
    need = gpus_needed(cell.tier, cell.ranks, cell.shared_gpus)
    if need <= n_visible:
        return cell.tier, need, None
    why = f"needs {plural_gpus(need)} for tier {cell.tier}, {n_visible} visible"
    if facts(cell.tier).gpu_per_rank and on_too_big == "shared" and n_visible >= 1:
        # Spread the ranks over every visible GPU: the least sharing that is possible here.
        return Tier.GPU_SHARED, n_visible, f"{why}; running as gpu-shared on {plural_gpus(n_visible)}"
    return "", 0, why


def _order_key(cell: CellDemand, gpus: int) -> tuple:
    """Largest first; then longest first; then id, so the plan is deterministic."""
    return (-gpus, -cell.ranks, -cell.seconds, cell.cell_id)


def plan_schedule(
    cells: Iterable[CellDemand], n_gpus: Gpus | None = None, *, on_too_big: str = "shared"
) -> list[Assignment]:
    """Place every cell on disjoint GPUs, largest first.

    A greedy pool: whenever GPUs are free, start the first waiting cell (in largest-first order)
    that fits, on the lowest free device ids. With ``seconds`` all zero every cell counts as
    taking one unit, which turns the plan into waves. ``on_too_big`` is ``"shared"`` (a ``gpu``
    cell wider than the node falls back to ``gpu-shared``) or ``"skip"``. Returns assignments
    in start order, skipped cells last.
    """
    if on_too_big not in ("shared", "skip"):
        raise ValueError(f"on_too_big must be 'shared' or 'skip' (got {on_too_big!r})")
    devices = visible_gpus(n_gpus)
    placed: list[tuple[CellDemand, str, int, str | None]] = []
    skipped: list[Assignment] = []
    for cell in cells:
        tier, width, reason = _fit(cell, len(devices), on_too_big)
        if not tier:
            skipped.append(
                Assignment(cell.cell_id, cell.tier, cell.ranks, (), wave=-1, skipped=True, reason=reason)
            )
        else:
            placed.append((cell, tier, width, reason))
    placed.sort(key=lambda p: _order_key(p[0], p[2]))
    return _simulate(placed, devices) + skipped


def _simulate(placed: list, devices: list[str]) -> list[Assignment]:
    """Event-driven list scheduling of already-fitted cells; see `plan_schedule`."""
    uniform = all(c.seconds <= 0 for c, *_ in placed)
    free = list(range(len(devices)))  # indices into devices, kept sorted
    running: list[tuple[float, int, list[int]]] = []  # heap of (end time, seq, device indices)
    waiting = list(placed)
    started: list[tuple[float, CellDemand, str, tuple[str, ...], str | None]] = []
    now, seq = 0.0, 0
    while waiting:
        for item in list(waiting):
            cell, tier, width, reason = item
            if width > len(free):
                continue
            took, free = free[:width], free[width:]
            length = 1.0 if uniform else max(cell.seconds, 0.0)
            heapq.heappush(running, (now + length, seq, took))
            seq += 1
            started.append((now, cell, tier, tuple(devices[i] for i in took), reason))
            waiting.remove(item)
        if not waiting:
            break
        if not running:  # cannot happen: every placed cell fits an empty node
            raise AssertionError("scheduler stalled with an idle node")
        # Advance to the next finish; free everything that ends at that moment together.
        now, _, took = heapq.heappop(running)
        free.extend(took)
        while running and running[0][0] <= now:
            free.extend(heapq.heappop(running)[2])
        free.sort()
    waves = {t: i for i, t in enumerate(sorted({t for t, *_ in started}))}
    return [
        Assignment(cell.cell_id, tier, cell.ranks, gpus, wave=waves[t], start=t, reason=reason)
        for t, cell, tier, gpus, reason in started
    ]


def estimate_wall(durations: Iterable[tuple[int, float]], n_gpus: int) -> float:
    """Wall seconds to run ``(gpus_needed, seconds)`` jobs on ``n_gpus`` GPUs with packing.

    Uses the same greedy largest-first pool as `plan_schedule`. A job wider than the node is
    counted as taking the whole node (the gpu-shared fallback). Jobs needing 0 GPUs (cpu tier)
    are counted as running one after another beside the GPU work, so the result is the longer
    of the two. Compare with ``sum(seconds)`` for one-cell-at-a-time.
    """
    if n_gpus < 1:
        return sum(s for _, s in durations)
    cells, cpu_total = [], 0.0
    for i, (need, seconds) in enumerate(durations):
        if need <= 0:
            cpu_total += seconds
            continue
        cells.append(CellDemand(f"job{i:05d}", max(1, min(int(need), n_gpus)), Tier.GPU, seconds=max(seconds, 1e-9)))
    plan = plan_schedule(cells, n_gpus)
    by_id = {c.cell_id: c.seconds for c in cells}
    gpu_wall = max((a.start + by_id[a.cell_id] for a in plan), default=0.0)
    return max(gpu_wall, cpu_total)
