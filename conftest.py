"""Thin pytest glue: options, one shared run directory, scenario cells as parametrized tests.

Every cell of every ``scenarios/*.toml`` becomes one test id such as
``test_cell[cpu-reshard[save=tp1-etp1-ep2-pp1,load=tp1-etp1-ep4-pp1]]``, marked with its tier.
Cells that share a save run in one xdist group so the save torchrun happens once.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

MARK_FOR_TIER = {"cpu": "cpu", "gpu-shared": "gpu_shared", "gpu": "gpu"}


def pytest_addoption(parser):
    g = parser.getgroup("moe-ckpt-harness")
    g.addoption("--scenario", action="append", default=[],
                help="run only cells of these scenario names (repeatable)")
    g.addoption("--results-root", default=os.environ.get("HARNESS_RESULTS_ROOT", "results"),
                help="where results/<run-id>/ is written")


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # xdist worker: use the controller's run directory
        config.harness_run_dir = Path(config.workerinput["harness_run_dir"])
        return
    from harness.results import new_run_dir

    config.harness_run_dir = new_run_dir(Path(config.getoption("--results-root")), "pytest")


def pytest_configure_node(node):  # xdist hook: hand the run directory to each worker
    node.workerinput["harness_run_dir"] = str(node.config.harness_run_dir)


def pytest_generate_tests(metafunc):
    if "cell" not in metafunc.fixturenames:
        return
    from harness.scenarios import load_all

    wanted = set(metafunc.config.getoption("--scenario"))
    params = []
    for scenario in load_all():
        if wanted and scenario.name not in wanted:
            continue
        marks = [getattr(pytest.mark, MARK_FOR_TIER[scenario.tier])]
        marks += [getattr(pytest.mark, m) for m in scenario.markers if m not in MARK_FOR_TIER.values()]
        for cell in scenario.cells():
            group = pytest.mark.xdist_group(cell.save_id)
            params.append(pytest.param(cell, id=cell.id, marks=[*marks, group]))
    metafunc.parametrize("cell", params)


@pytest.fixture(scope="session")
def run_dir(request) -> Path:
    return request.config.harness_run_dir


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    run = session.config.harness_run_dir
    if any(run.glob("cells/*/record.json")):
        from harness.environment import versions
        from harness.results import collect

        collect(run, versions())
