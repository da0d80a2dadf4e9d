"""Bad inputs to the command line, its switches and its data files: each is refused
with ONE line naming the option, variable or file and the constraint, and a non-zero exit; never
a traceback, never silence.

Why: a typo that is read as a default (``GATE_PATCHED=yes`` meant unpatched), or an error that
ends in a traceback, costs a job owner a night of GPU time or a wrong gate.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from harness import machine, switches
from harness.paths import REPO_ROOT
from tests.helpers import bounded, harness_cli, one_error_line

pytestmark = pytest.mark.cpu

RUNS = REPO_ROOT / "tests" / "data" / "runs"
PATCHED_EVIDENCE = RUNS / "20261203-100332-eq-fresh.results.json"  # both jobs SAFE WITH PATCH
BASELINE_PROFILES = REPO_ROOT / "tests" / "data" / "quarantine-nvfp4-default.toml"


# --- yes/no switches: one set of words (harness/switches.py), anything else refused ------------

def test_every_switch_takes_moe_ckpt_fix_words():
    from moe_ckpt_fix import autoload

    assert (switches.ON, switches.OFF) == (autoload.ON, autoload.OFF) == (("1", "true", "yes"),
                                                                          ("0", "false", "no"))


@pytest.mark.parametrize("raw, on", [("1", True), ("YES", True), (" true ", True), ("no", False),
                                     ("False", False), ("0", False), ("", False)])
def test_a_switch_reads_the_words(raw, on):
    assert switches.switch("X", environ={"X": raw}) is on


def test_a_switch_refuses_any_other_word_in_one_line():
    with pytest.raises(switches.SwitchError) as err:
        switches.switch("HARNESS_ANY_MCORE", environ={"HARNESS_ANY_MCORE": "on"})
    line = str(err.value)
    assert "\n" not in line and "HARNESS_ANY_MCORE='on'" in line
    assert "1/true/yes" in line and "0/false/no" in line


def test_any_mcore_override_takes_yes(monkeypatch):
    """HARNESS_ANY_MCORE=yes runs on an untested megatron-core (it was read as no)."""
    monkeypatch.setattr(machine, "version", {"megatron-core": "0.17.0", "nvidia-modelopt": "0.47.0"}.get)
    monkeypatch.setenv(machine.MCORE_OVERRIDE, "yes")
    assert machine.version_problem().fatal is False


def test_a_bad_switch_stops_the_cli_in_one_line():
    done = harness_cli("run", "--cells", "nothing*", env={machine.MCORE_OVERRIDE: "sure"})
    assert done.returncode == 2
    one_error_line(done, "HARNESS_ANY_MCORE='sure'", "1/true/yes")


def _gate(results: Path, patched: str):
    run = results / "nightly"
    run.mkdir(parents=True, exist_ok=True)
    shutil.copy(PATCHED_EVIDENCE, run / "results.json")
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(results), "GATE_PATCHED": patched,
           "HARNESS_QUARANTINE": str(BASELINE_PROFILES)}
    return bounded(["bash", "tools/unquarantine-gate.sh"], 300, cwd=REPO_ROOT, env=env)


def test_gate_patched_yes_means_patched(tmp_path):
    """Both jobs are SAFE WITH PATCH in the evidence: patched, both gates pass (exit 0)."""
    done = _gate(tmp_path, "Yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("-> exit 0") == 2, done.stdout


def test_gate_patched_refuses_a_word_it_does_not_know(tmp_path):
    done = _gate(tmp_path, "patched")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gate" not in done.stdout  # refused before any job is judged
    one_error_line(done, "GATE_PATCHED='patched'", "1/true/yes", "0/false/no")


# --- an option that does nothing with the others given is refused -----------------------------

WITNESS = RUNS / "20261202-122731-witness.results.json"


@pytest.mark.parametrize("args, words", [
    (["verdict", "--patched", "--results", str(WITNESS)], ["--patched needs --gate"]),
    (["equivalence", "--rejudge", str(WITNESS), "--outcomes-only"], ["--outcomes-only", "--rejudge"]),
    (["equivalence", str(WITNESS), str(WITNESS), "--rejudge", str(WITNESS)],
     ["REFERENCE/CANDIDATE", "--rejudge"]),
    (["sample", "--seed", "1", "--list", "--jobs", "4"], ["--jobs", "--list runs nothing"]),
])
def test_an_idle_option_is_refused_in_one_line(args, words):
    done = harness_cli(*args)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    one_error_line(done, *words)


# --- --results-root: a file, or a directory nobody may write in --------------------------------

def _unprivileged() -> list[str]:
    """The command prefix that drops root (who may write anywhere) to nobody, or []."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: no user to whom a directory is read-only")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # A checkout under a directory only root may enter (mktemp -d makes one) cannot be run as
    # nobody at all: that is the machine's layout, not the harness's answer to a read-only root.
    reach = bounded([*drop, sys.executable, "-c", "import harness"], 120, cwd=REPO_ROOT)
    if reach.returncode != 0:
        pytest.skip(f"nobody cannot import the harness from {REPO_ROOT} (a parent directory only "
                    f"root may enter): {reach.stderr.strip().splitlines()[-1:]}")
    return drop


@pytest.fixture
def open_dir():
    """A directory every user may enter (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    path.chmod(0o755)
    yield path
    for p in path.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(path)


def test_a_read_only_results_root_is_one_line_before_anything_runs(open_dir):
    root = open_dir / "read-only"
    root.mkdir(mode=0o555)
    root.chmod(0o555)
    done = bounded([*_unprivileged(), sys.executable, "-W", "ignore", "-m", "harness",
                    "--results-root", str(root), "repro", "--gpu", "no"], 120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "", "nothing ran"
    one_error_line(done, f"--results-root {root}: no permission to write in it")
    assert not any(root.iterdir())


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_results_root_that_is_a_file_is_one_line(tmp_path, under):
    afile = tmp_path / "results.json"
    afile.write_text("{}")
    root = afile / under if under else afile
    done = harness_cli("--results-root", str(root), "repro", "--gpu", "no")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "", "nothing ran"
    what = "it" if not under else str(afile)
    one_error_line(done, f"--results-root {root}: {what} is a file, not a directory")


def test_a_report_beside_results_nobody_may_write_is_one_line(open_dir):
    run = open_dir / "run"
    run.mkdir()
    shutil.copy(RUNS / "20261203-004730-density.results.json", run / "results.json")
    run.chmod(0o555)
    done = bounded([*_unprivileged(), sys.executable, "-W", "ignore", "-m", "harness", "report",
                    str(run / "results.json")], 120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    one_error_line(done, f"{run / 'summary.md'}: cannot write the report beside", "PermissionError")


# --- Ctrl-C during make repro's first phase (the probe of the real validation, cpu tier) -------

@pytest.mark.slow  # the signal path stays in tests/test_interrupts.py
def test_ctrl_c_during_the_repro_probe_leaves_its_results_marked_interrupted(tmp_path):
    """The signal's line promises a partial results.json: the probe's run directory gets one,
    marked incomplete, as a stopped cell run's is; no traceback, no later phase started."""
    import json
    import signal

    from tests.helpers import interrupt_once_staged, stage_processes, start_cli

    # the probe's rank 1 stuck before its first step keeps the probe running (forked ranks
    # finish it in about a second) until the signal; its sibling would name it after 20 s
    proc = start_cli(tmp_path, "repro", "--gpu", "no", env={"HARNESS_INJECT": "hang:1:forked"})
    proc, out, _ = interrupt_once_staged(proc, tmp_path, signal.SIGINT)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "partial results.json" in out, out
    assert stage_processes(tmp_path) == [], "probe ranks outlived the controller"
    (run,) = tmp_path.glob("*-repro-cpu")  # the probe runs first in the cpu repro's run
    doc = json.loads((run / "results.json").read_text())
    assert doc["incomplete"] is True and doc["interrupted_by"] == "SIGINT", doc
    assert f"results: {run / 'results.json'}" in out
    assert "repro interrupted (SIGINT)" in out
    assert not (run / "cells").exists(), "the grid phase started after the signal"


# --- a file: recipe that ModelOpt's loader cannot read stops at collection ----------------------

GPU_SCENARIO = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\nsaves = ["tp1-etp1-ep1"]\n'


@pytest.mark.parametrize("text, words", [
    ("metadata:\n  recipe_type: ptq\nquantize: {algorithm: max\n", "invalid YAML at line 4, column 1"),
    ("", "not a PTQ recipe"),
    ("- a list\n", "not a PTQ recipe"),
    ("metadata:\n  recipe_type: speculative_eagle\neagle: {}\n", "not a PTQ recipe"),
])
def test_a_file_recipe_modelopt_cannot_load_is_one_line_at_collection(tmp_path, monkeypatch, text, words):
    """As a recipe the installed ModelOpt lacks: the file is skipped with one line naming the
    scenario, the key and the recipe (`run --scenario` on it exits 2), its neighbour loads."""
    from harness.scenario import scenarios

    monkeypatch.setattr(scenarios, "REPO_ROOT", tmp_path)  # file: recipes are repository paths
    (tmp_path / "mine.yaml").write_text(text)
    (tmp_path / "bad.toml").write_text(GPU_SCENARIO + 'recipe = "file:mine.yaml"\n')
    (tmp_path / "good.toml").write_text(GPU_SCENARIO)
    good, bad = scenarios.load_all_with_errors(tmp_path)
    assert [s.name for s in good] == ["good"]
    (err,) = bad
    assert "\n" not in str(err) and "bad.toml: recipe: file:mine.yaml: " in str(err), err
    assert words in str(err), err


def test_a_well_formed_file_recipe_loads(tmp_path, monkeypatch):
    from harness.scenario import scenarios

    monkeypatch.setattr(scenarios, "REPO_ROOT", tmp_path)
    (tmp_path / "mine.yaml").write_text("metadata:\n  recipe_type: ptq\nquantize:\n  algorithm: max\n")
    (tmp_path / "ok.toml").write_text(GPU_SCENARIO + 'recipe = "file:mine.yaml"\n')
    assert scenarios.load_scenario(tmp_path / "ok.toml").recipe == "file:mine.yaml"


# --- --scenario: a typo or a path ---------------------------------------------------------------

def test_an_unknown_scenario_is_no_such_scenario_with_the_known_names():
    done = harness_cli("run", "--scenario", "cpu-reshardd")
    assert done.returncode == 2 and done.stdout == ""
    one_error_line(done, "--scenario 'cpu-reshardd': no such scenario",
                    "did you mean 'cpu-reshard'?", "known: cpu-reshard, ")


@pytest.mark.parametrize("asked", ["cpu-reshard", "scenarios/cpu_reshard.toml",
                                   str(REPO_ROOT / "scenarios" / "cpu_reshard.toml")])
def test_a_scenario_is_named_by_its_name_or_its_file(asked, monkeypatch):
    from harness.scenario.scenarios import load_all_with_errors, scenario_name

    monkeypatch.chdir(REPO_ROOT)
    good, bad = load_all_with_errors()
    assert scenario_name(asked, good, bad) == "cpu-reshard"


@pytest.mark.parametrize("asked, words", [
    ("cpu_reshard", "no such scenario (did you mean 'cpu-reshard'?"),
    ("scenarios/quarantine.toml", "not a scenario file"),  # a data file beside them
    ("scenarios", "no such scenario"),  # a directory
])
def test_what_names_no_scenario_is_one_line(asked, words, monkeypatch):
    from harness.scenario.scenarios import ScenarioError, load_all_with_errors, scenario_name

    monkeypatch.chdir(REPO_ROOT)
    good, bad = load_all_with_errors()
    with pytest.raises(ScenarioError) as err:
        scenario_name(asked, good, bad)
    assert "\n" not in str(err.value) and f"--scenario {asked!r}: {words}" in str(err.value)


# --- scenarios/quarantine.toml (and --quarantine FILE) is checked like a scenario file ----------

QUARANTINE = REPO_ROOT / "scenarios" / "quarantine.toml"


def _quarantine(tmp_path, old: str, new: str, count: int = 1) -> Path:
    """The committed quarantine file with one edit, in tmp_path."""
    text = QUARANTINE.read_text()
    assert old in text, old
    path = tmp_path / "quarantine.toml"
    path.write_text(text.replace(old, new, count))
    return path


@pytest.mark.parametrize("old, new, words", [
    ('failing_stage = "load"', 'failing_stag = "load"',
     "jobs[0].failing_stag: unknown key (did you mean 'failing_stage'?"),
    ('witness_scenario = "gpu-nano-recipe-witness"', 'witness_scenarios = "gpu-nano-recipe-witness"',
     "jobs[0].profile.witness_scenarios: unknown key (did you mean 'witness_scenario'?"),
    ('goldens_scenario = ', 'golden_scenario = ', "golden_scenario: unknown key (did you mean 'goldens_scenario'?"),
    ('recipe = "mtq:MAMBA_MOE_NVFP4_CONSERVATIVE_CFG"\n', '', "jobs[0].profile.recipe: required key missing"),
    ('pipeline = "examples', 'pipelin = "examples', "jobs[0].pipeline: required key missing"),
    ('\nsave = "tp1-etp1-ep8"', '\nsave = "tp1-etp1"', "jobs[0].save: cannot read topology 'tp1-etp1'"),
    ('failing_stage = "load"', 'failing_stage = "reload"', "jobs[0].failing_stage: 'reload' is not one of"),
    ('loads = ["tp4-etp1-ep8", "tp2-etp2-ep4"', 'loads = ["tp4-etp1-ep8", "tp2-etp2-epX"',
     "jobs[0].profile.loads[1]: cannot read topology 'tp2-etp2-epX'"),
    ('id = "ultra-550b-a55b-nvfp4-ptq"', 'id = "nano-30b-a3b-qad"', "jobs[1].id: 'nano-30b-a3b-qad' is"),
])
def test_a_bad_quarantine_file_is_one_line_naming_file_and_key(tmp_path, old, new, words):
    from harness.report.jobs import ProfileError, load_quarantine

    path = _quarantine(tmp_path, old, new)
    with pytest.raises(ProfileError) as err:
        load_quarantine(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and words in line, line


def test_a_stand_in_scenario_no_scenario_has_is_one_line_with_the_closest(tmp_path):
    path = _quarantine(tmp_path, 'fix_scenario = "gpu-nano-recipe"', 'fix_scenario = "gpu-nano-recipes"')
    done = harness_cli("verdict", "--quarantine", str(path), "--results", str(WITNESS))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    one_error_line(done, f"--quarantine {path}: jobs[0].profile.fix_scenario: no scenario "
                          "'gpu-nano-recipes' (did you mean 'gpu-nano-recipe'?")


@pytest.mark.parametrize("text, words", [
    ("jobs = [\n", "invalid TOML"),
    ("", "jobs: required key missing"),
    ("jobs = []\n", "jobs: must hold at least 1 item"),
    (None, "cannot read (IsADirectoryError"),  # a directory
    ("missing", "cannot read (FileNotFoundError"),
])
def test_a_broken_quarantine_option_names_the_option_and_the_file(tmp_path, text, words):
    path = tmp_path / "jobs.toml"
    if text is None:
        path.mkdir()
    elif text != "missing":
        path.write_text(text)
    done = harness_cli("verdict", "--quarantine", str(path), "--results", str(WITNESS))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    one_error_line(done, f"--quarantine {path}: {words}")


def test_the_committed_profiles_are_valid_and_a_toml_date_is_a_date(tmp_path):
    from harness.report.jobs import load_quarantine

    for path in (QUARANTINE, BASELINE_PROFILES):
        assert [j.id for j in load_quarantine(path).jobs] == ["nano-30b-a3b-qad",
                                                              "ultra-550b-a55b-nvfp4-ptq"]
    dated = _quarantine(tmp_path, 'review_by = "2027-01-15"', "review_by = 2027-01-15", count=2)
    assert {j.review_by for j in load_quarantine(dated).jobs} == {"2027-01-15"}


def test_the_gate_script_on_a_broken_profile_file_is_one_line(tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text("[[jobs]]\nid = 'x'\n")
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(tmp_path / "results"),
           "HARNESS_QUARANTINE": str(path)}
    done = bounded(["bash", "tools/unquarantine-gate.sh"], 120, cwd=REPO_ROOT, env=env)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    one_error_line(done, f"{path}: jobs[0].name: required key missing")


def test_repro_gpu_yes_without_a_gpu_tier_is_one_line_on_stderr(tmp_path):
    from harness.machine import tier_skip_reason

    if tier_skip_reason("gpu-shared", 8) is None:
        pytest.skip("a GPU tier runs here: --gpu yes would run the GPU cells")
    done = harness_cli("--results-root", str(tmp_path), "repro", "--gpu", "yes")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    one_error_line(done, "--gpu yes but tier gpu-shared needs")
