"""The next device session's queue files (tools/gpu-host/queues/next*.txt) name only what exists.

Why: device minutes are the scarcest thing this project has (30 a session). A queue entry with a
misspelt mode, scenario or cell glob runs nothing, and that is found only when the results come
back; here it is found before the machine is started.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.run.cells import select_cells
from harness.scenario.scenarios import load_all
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
GPU_HOST = ROOT / "tools" / "gpu-host"
QUEUES = sorted((GPU_HOST / "queues").glob("*.txt"))  # the queues a user would rerun
SCENARIO_VARS = ("SCENARIOS", "EQ_SCENARIOS", "MAMBA_SCENARIOS", "RECIPE_SCENARIOS_none", "RECIPE_SCENARIOS_fix")
CELL_VARS = ("RECIPE_CELLS", "NCCL_CELLS")
PART_VARS = ("RECIPE_PARTS", "MAMBA_PARTS")
# <modelopt>-<patch>[-mc<megatron-core>], as run.sh recipe_part reads it
PART = re.compile(r"^\d+\.\d+\.\d+(rc\d+)?-(none|fix)(-mc\d+\.\d+\.\d+)?$")


def _entries(path: Path) -> list[tuple[dict[str, str], str]]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        *words, mode = line.split()
        out.append((dict(w.split("=", 1) for w in words), mode))
    return out


def _modes() -> set[str]:
    return set(re.findall(r"^  ([a-z0-9-]+)\)", (GPU_HOST / "run.sh").read_text(), re.M))


def test_there_is_a_next_queue():
    assert any(q.name == "nightly-shards.txt" for q in QUEUES), \
        "tools/gpu-host/queues/nightly-shards.txt: the whole nightly command, shard by shard"


@pytest.mark.parametrize("queue", QUEUES, ids=lambda p: p.name)
def test_each_entry_names_a_mode_scenarios_parts_and_cells_that_exist(queue):
    modes, scenarios = _modes(), load_all()
    names = {s.name for s in scenarios}
    for env, mode in _entries(queue):
        where = f"{queue.name}: entry '{mode}'"
        assert mode in modes, f"{where}: run.sh has no mode {mode}"
        for var in SCENARIO_VARS:
            for name in filter(None, env.get(var, "").split(",")):
                assert name in names, f"{where}: {var} names no scenario {name}"
        for var in PART_VARS:
            for part in filter(None, env.get(var, "").split(",")):
                assert PART.match(part), f"{where}: {var} part {part} is not <modelopt>-<patch>[-mc<mcore>]"
        for var in CELL_VARS:
            for glob in filter(None, env.get(var, "").split(",")):
                assert select_cells(scenarios, [glob]), f"{where}: {var} glob {glob} matches no cell"


def test_the_check_catches_a_misspelt_scenario(tmp_path):
    bad = tmp_path / "next.txt"
    bad.write_text("RECIPE_SCENARIOS_none=gpu-ultra-recipe-witnes recipes\n")
    with pytest.raises(AssertionError, match="names no scenario gpu-ultra-recipe-witnes"):
        test_each_entry_names_a_mode_scenarios_parts_and_cells_that_exist(bad)


def _shell_waits(text: str) -> list[str]:
    """Lines of a shell script that call ``wait`` (comments left out)."""
    return [l.strip() for l in text.splitlines()
            if not l.lstrip().startswith("#") and re.search(r"(^|[;&|{]\s*|\s)wait(\s|;|$)", l)]


def test_run_sh_waits_only_through_wait_jobs():
    """A bare ``wait`` (or ``wait "${PIDS[@]}"`` with no pids) waits for run.sh's memory sampler
    too, forever: nccl-teardown with TEARDOWN_WORLDS=none hung so on the H100 (2026-12-06)."""
    waits = _shell_waits((GPU_HOST / "run.sh").read_text())
    assert waits == ['wait_jobs() { [ $# = 0 ] || wait "$@"; }'], waits


def test_wait_jobs_with_no_pids_returns_while_another_job_runs():
    define = next(l for l in (GPU_HOST / "run.sh").read_text().splitlines() if l.startswith("wait_jobs()"))
    script = f'{define}\nsleep 60 & S=$!\nPIDS=()\nwait_jobs "${{PIDS[@]}}"\nkill $S; echo returned'
    got = bounded(["bash", "-c", script], timeout=20)
    assert got.returncode == 0 and "returned" in got.stdout, got.stderr


def test_the_wait_check_catches_a_bare_wait():
    assert _shell_waits('  done; wait; tail x\n  # wait here\n  wait "${PIDS[@]}" ;;') == [
        "done; wait; tail x", 'wait "${PIDS[@]}" ;;']
