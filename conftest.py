"""Thin pytest glue: options, one shared run directory, scenario cells as parametrized tests.

Every cell of every ``scenarios/*.toml`` becomes one test id such as
``test_cell[cpu-reshard[save=tp1-etp1-ep2-pp1,load=tp1-etp1-ep4-pp1]]``, marked with its tier.
Cells that share a save run in one xdist group so the save torchrun happens once. A bad
scenario file becomes one erroring item, ``test_cell[scenario-file[<file>]]``, whose message is
the file's one line; the other files' cells still run. ``HARNESS_SCENARIO_DIR`` points collection
at another scenario directory (tests of the collection itself use it).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.tiers import MARKS


def pytest_addoption(parser):
    g = parser.getgroup("moe-ckpt-harness")
    g.addoption("--scenario", action="append", default=[],
                help="run only cells of these scenario names (repeatable)")
    g.addoption("--results-root", default=os.environ.get("HARNESS_RESULTS_ROOT", "results"),
                help="where results/<run-id>/ is written")
    g.addoption("--shard", default="", metavar="K/N",
                help="run only the K-th of N shards (whole work units, the cells deciding a "
                     "quarantined job first; harness/scenario/shards.py)")


def _controller_gpus() -> str:
    """The GPUs this run may use, found WITHOUT initialising CUDA in the controller."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return os.environ["CUDA_VISIBLE_DEVICES"]
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""
    return ",".join(line.strip() for line in out.splitlines() if line.strip())


def give_workers_their_gpus(config) -> None:
    """Each xdist worker's interpreter starts with its own ``CUDA_VISIBLE_DEVICES``: its ``--tx``
    spec starts it through ``env`` (``popen//python=env CUDA_VISIBLE_DEVICES=... python``), so no
    test process ever writes ``os.environ`` for it and nothing can initialise CUDA first (the
    JAX-Toolbox way). Not execnet's ``env:`` keys: those are set by a remote_exec after start,
    and under load xdist's own remote_exec then came within execnet's 1 s window and the worker
    refused it ("concurrent remote_exec would cause deadlock", a fresh clone's ``make test``). A
    disjoint block of GPUs per worker; with fewer GPUs than workers they share them (cells then
    run on gpu-shared, or skip with the reason when they need one GPU per rank). Only plain
    ``popen`` specs (what ``-n N`` makes) are changed.
    """
    import shlex
    import sys

    from harness.launch.gpus import visible_gpus, worker_visible_devices

    specs = list(config.getoption("tx", None) or [])
    if not specs or any(spec != "popen" for spec in specs):
        return
    gpus = config.harness_gpus
    workers = len(specs)
    shared = 0 < len(visible_gpus(gpus)) < workers
    python = shlex.quote(sys.executable)
    config.option.tx = [
        f"popen//python=env CUDA_VISIBLE_DEVICES="
        f"{gpus if shared else worker_visible_devices(f'gw{k}', gpus, workers)} {python}"
        for k in range(workers)]


TEST_REQUIREMENTS = Path(__file__).parent / "requirements" / "test.txt"


def wrong_test_stack() -> list[str]:
    """The pins of requirements/test.txt this interpreter does not have, as ``name==pin (found
    X)``. The suite relies on them: the group-id workaround below reads pytest 9.2's private
    node ids, and every test's bound is pytest-timeout's."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    wrong = []
    for line in TEST_REQUIREMENTS.read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if not pin:
            continue
        try:
            found = version(pin[1])
        except PackageNotFoundError:
            found = "not installed"
        if found != pin[2]:
            wrong.append(f"{pin[1]}=={pin[2]} (found {found})")
    return wrong


def pytest_configure(config):
    from harness.launch.signals import exit_cleanly_on_sigterm

    wrong = wrong_test_stack()
    if wrong:
        raise pytest.UsageError(f"requirements/test.txt: this suite needs {', '.join(wrong)}; "
                                "install them: python -m pip install -r requirements/test.txt")
    if config.getoption("--shard"):
        from harness.scenario.shards import parse_shard

        try:
            parse_shard(config.getoption("--shard"))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    exit_cleanly_on_sigterm()
    if hasattr(config.option, "loadscopereorder"):  # xdist keeps the order conftest gives
        config.option.loadscopereorder = False
    if hasattr(config, "workerinput"):  # xdist worker: the controller's run dir
        config.harness_run_dir = Path(config.workerinput["harness_run_dir"])
        return
    config.harness_gpus = _controller_gpus()
    give_workers_their_gpus(config)
    # Reserved now, exclusively (xdist workers share it; another session never does); removed
    # at the end when no cell ran, so --collect-only leaves no empty results/<ts>-pytest behind.
    from harness.paths import RunDir

    config.harness_run_dir = RunDir.new(Path(config.getoption("--results-root")), "pytest").root


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` runs without it
def pytest_configure_node(node):  # xdist hook: hand the run directory to each worker
    node.workerinput["harness_run_dir"] = str(node.config.harness_run_dir)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """``--shard K/N``: only the K-th shard's work units. ``--dist loadgroup``: suffix each
    grouped item's id with ``@group`` on the worker.

    pytest-xdist 3.8 does this by setting ``item._nodeid``, which pytest 9 no longer reads (the
    id lives in ``item._id``), so every ``xdist_group`` was ignored: the cells of one save ran
    on both workers, each starting the same save, and two workers installed gitlab-ci-local at
    once. Done here only where xdist's own suffix is missing.
    """
    if config.getoption("--shard"):
        _keep_shard(config, items)
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = _group_names(item)
        nodeid = item.nodeid
        if names and _work_unit(nodeid) == nodeid:
            item._id = NodeId.parse(f"{nodeid}@{'_'.join(names)}")
    items[:] = _longest_units_first(items)


def _group_names(item) -> list[str]:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return names or _module_fixture_group(item)


def _unit_name(item) -> str:
    """The item's work unit, the same before and after xdist's ``@group`` suffix."""
    names = _group_names(item)
    return "_".join(names) if names else _work_unit(item.nodeid)


def _scenario_name(item) -> str | None:
    """The scenario of a cell's item (None for any other test, or a bad scenario file's item)."""
    cell = getattr(item, "callspec", None) and item.callspec.params.get("cell")
    return getattr(getattr(cell, "scenario", None), "name", None)


def _keep_shard(config, items: list) -> None:
    from harness.report.jobs import deciding_scenarios
    from harness.scenario.shards import parse_shard, split

    k, n = parse_shard(config.getoption("--shard"))
    units = _unit_costs(items, _unit_name)
    deciding = deciding_scenarios()
    first = {_unit_name(i) for i in items if _scenario_name(i) in deciding}
    kept = set(split(units, first, n)[k - 1])
    config.hook.pytest_deselected(items=[i for i in items if _unit_name(i) not in kept])
    items[:] = [i for i in items if _unit_name(i) in kept]


def _work_unit(nodeid: str) -> str:
    """xdist's unit of work under ``--dist loadgroup``: the group after the last ``@`` that
    follows the parameters, else the test itself (the rule of its LoadGroupScheduling)."""
    return nodeid[nodeid.rfind("@") + 1:] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


DURATIONS = Path(__file__).parent / "tests" / "durations.json"
UNKNOWN_TEST_S = 0.2  # a test not in DURATIONS: most tests take less than a second
UNKNOWN_CELL_S = 30.0  # a cell not in DURATIONS: about a GPU cell's (tests/durations.json)


def _unit_costs(items: list, unit_of) -> dict[str, float]:
    """Work unit -> its estimated seconds (tests/durations.json, written by
    `bench/junit_times.py --write-durations`), in the items' order."""
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    cost: dict[str, float] = {}
    for i in items:
        default = UNKNOWN_CELL_S if i.name.startswith("test_cell[") else UNKNOWN_TEST_S
        key = f"{i.path.relative_to(i.config.rootpath).as_posix()}::{i.name}"
        cost[unit_of(i)] = cost.get(unit_of(i), 0.0) + known.get(key, default)
    return cost


def _longest_units_first(items: list) -> list:
    """The xdist work units (a group, or a test of its own), longest first by their estimated
    seconds. Workers take units in this order, so the run ends on short tests that fill both
    cores, not on a worker alone with a 20 s teardown test while the others are idle. Tests
    keep their order within a unit."""
    cost = _unit_costs(items, lambda i: _work_unit(i.nodeid))
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_work_unit(item.nodeid), []).append(item)
    return [i for name in sorted(units, key=lambda n: -cost[n]) for i in units[name]]


def _module_fixture_group(item) -> list[str]:
    """An ungrouped test that uses a module-scoped fixture of its own module goes with that
    module's other tests: the fixture's set-up (a torchrun, a golden copy) then runs once per
    run, not once per worker that happens to get one of its tests."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        base = defs[-1].baseid
        if defs[-1].scope == "module" and base.endswith(".py") and item.nodeid.startswith(base + "::"):
            return [base]
    return []


def _scenario_dir() -> Path:
    from harness.paths import SCENARIO_DIR

    return Path(os.environ.get("HARNESS_SCENARIO_DIR") or SCENARIO_DIR)


# Beyond its stages' own timeouts (each torn down within seconds of it): starting the run, a
# golden copy, judging, writing the record.
CELL_MARGIN_S = 180


def cell_timeout_s(cell) -> float:
    """The test's bound (pytest-timeout): its save and its load may each run to the scenario's
    stage timeout. Past it the controller itself is stuck: its stacks are printed, the test
    fails and the run goes on (a hang must not eat the CI job's 90 minutes)."""
    stages = 1 if cell.load is None else 2
    return stages * cell.scenario.stage_timeout_s + CELL_MARGIN_S


def _registered_markers(config) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


def pytest_generate_tests(metafunc):
    if "cell" not in metafunc.fixturenames:
        return
    from harness.scenario.scenarios import ScenarioError, load_all_with_errors, shown_path

    wanted = set(metafunc.config.getoption("--scenario"))
    registered = _registered_markers(metafunc.config)
    scenarios, errors = load_all_with_errors(_scenario_dir())
    params = []
    for scenario in scenarios:
        if wanted and scenario.name not in wanted:
            continue
        src = Path(scenario.source)
        unknown = [m for m in scenario.markers if m not in registered]
        try:
            if unknown:  # --strict-markers would stop the whole collection on it
                raise ScenarioError(f"markers: {unknown[0]!r} is not a registered pytest marker "
                                    "(pyproject.toml [tool.pytest.ini_options] markers)")
            cells = scenario.cells()
        except ScenarioError as exc:
            errors.append(exc if exc.path else ScenarioError(f"{shown_path(src)}: {exc}", src, scenario.name))
            continue
        marks = [getattr(pytest.mark, MARKS[scenario.tier])]
        marks += [getattr(pytest.mark, m) for m in scenario.markers if m not in MARKS.values()]
        for cell in cells:
            group = pytest.mark.xdist_group(cell.save_id)
            bound = pytest.mark.timeout(cell_timeout_s(cell))
            params.append(pytest.param(cell, id=cell.id, marks=[*marks, group, bound]))
    every_tier = [getattr(pytest.mark, m) for m in MARKS.values()]  # shown under any -m tier
    for exc in errors:
        if wanted and exc.name not in wanted:
            continue
        params.append(pytest.param(exc, id=f"scenario-file[{Path(exc.path).name}]", marks=every_tier))
    metafunc.parametrize("cell", params, indirect=True)


@pytest.fixture
def baseline_profiles(monkeypatch):
    """The quarantined jobs judged on the profile the committed runs were earned with
    (NVFP4_DEFAULT_CFG on the plain GPT, tests/data/quarantine-nvfp4-default.toml): tests that
    judge committed runs for a verdict use it; scenarios/quarantine.toml holds the jobs' own."""
    from harness.paths import BASELINE_QUARANTINE

    monkeypatch.setenv("HARNESS_QUARANTINE", str(BASELINE_QUARANTINE))


@pytest.fixture(scope="session")
def made_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The small torch_dist checkpoints of tests/test_golden.py and tests/test_inspect_ckpt.py,
    written by ONE world-1 make-ckpt torchrun (its imports are most of its time); both files are
    in one xdist group, so one worker makes them once. name -> directory (tests/helpers.py)."""
    from tests.helpers import make_checkpoints, made_checkpoint_specs

    return make_checkpoints(tmp_path_factory.mktemp("made-ckpts"), made_checkpoint_specs())


COVERAGE_CONTEXTS = os.environ.get("HARNESS_COVERAGE_CONTEXTS") == "1"  # tools/coverage-split.sh


if COVERAGE_CONTEXTS:
    @pytest.fixture(autouse=True)
    def coverage_context_per_test(request, monkeypatch):
        """Under tools/coverage-split.sh: the lines each test runs are recorded under its node
        id, in this worker and in every process it starts (coverage's patch=subprocess hands
        children the serialized config, whose static ``context`` is set here), so
        tools/coverage_split.py can tell which test alone reaches a line. Defined only then."""
        import base64
        import json

        import coverage

        cov, config = coverage.Coverage.current(), os.environ.get("COVERAGE_PROCESS_CONFIG")
        if cov is not None:
            cov.switch_context(request.node.nodeid)
        if config is not None:
            doc = json.loads(base64.b64decode(config))
            doc["context"] = request.node.nodeid
            monkeypatch.setenv("COVERAGE_PROCESS_CONFIG", base64.b64encode(json.dumps(doc).encode()).decode())
        yield
        if cov is not None:
            cov.switch_context("")


@pytest.fixture(scope="session", autouse=True)
def warm_parents_per_worker(tmp_path_factory):
    """Each fork-mode run (the cpu tier's default) would start a warm parent that
    imports the stack (6-10 core-seconds here) and close it at the run's end; this worker keeps
    them across its runs instead, in its own basetemp, outside every test's tmp_path (no test's
    process search finds them there), and closes them at the end. A test about a run's own
    parent uses ``own_warm_parent``. In-process only: a CLI the tests start keeps the default."""
    from harness.launch.warm import WARM

    if not COVERAGE_CONTEXTS:  # a parent kept across tests would count its ranks' lines as its first test's
        WARM.keep_across_runs(tmp_path_factory.mktemp("warm-parents", numbered=False))
    yield
    WARM.close_all()
    WARM.keep_across_runs(None)


@pytest.fixture
def own_warm_parent(monkeypatch):
    """A run of this test starts its own warm parent in its pools directory and closes it at
    its end, as outside pytest: for tests about that parent (its start, refusal, teardown)."""
    from harness.launch.warm import WARM

    monkeypatch.setattr(WARM, "kept_in", None)


@pytest.fixture
def cell(request):
    """The parametrized cell; a bad scenario file's item fails here with the file's one line."""
    if isinstance(request.param, Exception):
        pytest.fail(str(request.param), pytrace=False)
    return request.param


@pytest.fixture
def run_dir(request, cell) -> Path:
    """After ``cell``: a bad scenario file's item fails first."""
    return request.config.harness_run_dir


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    run = session.config.harness_run_dir
    from harness.paths import RunDir

    if RunDir(run).records():
        from harness.machine import versions
        from harness.run.results import collect

        from harness.launch.signals import shutdown_signal

        collect(run, versions(), interrupted=shutdown_signal())
    elif run.is_dir() and not any(run.iterdir()):  # no cell ran: leave no empty run dir
        run.rmdir()
