"""The CI pipeline as a real GitLab client builds it, not only as GitLab's JSON schema accepts it.

gitlab-ci-local (npm, pinned in tools/gitlab-ci-local.sh, installed into .ci-tools/ on first use)
parses .gitlab-ci.yml the way GitLab does: extends, !reference, rules, needs, cache limits. The
expectations below come from what the pipeline is for (see the header of .gitlab-ci.yml and
docs/ci.md), not from the tool's output:

* merge requests (and pushes to the default branch): lint -> cpu-tests -> report, no GPU job;
* the nightly schedule and "Run pipeline" (web): lint -> cpu-tests -> build-image -> gpu-tests
  and bug-witness on an 8-GPU runner -> report;
* bug-witness may fail (it reproduces the upstream bug on purpose), nothing else may but the
  manual unquarantine-gate of nightly pipelines (a closed gate is a decision);
* report always runs, with the test jobs' results.

gitlab-ci-local 4.60.1 does not evaluate ``workflow:rules`` (which pipelines exist at all); it
evaluates each job's rules, which is what decides the jobs of a pipeline.
"""
from __future__ import annotations

import json
import os

import pytest

from harness.bounded import Finished
from harness.paths import REPO_ROOT
from tests.helpers import GITLAB_CI_LOCAL, GITLAB_CI_LOCAL_VERSION, MISSING_PREREQUISITE, bounded

RUN_TIMEOUT_S = 120
LINT_JOB_TIMEOUT_S = 900
# The first call installs gitlab-ci-local from the npm registry (about 10 s: nothing compiles).
INSTALL_TIMEOUT_S = 900

_prerequisites = bounded(["bash", str(GITLAB_CI_LOCAL), "--prerequisites"], RUN_TIMEOUT_S,
                         cwd=REPO_ROOT)
if _prerequisites.returncode == MISSING_PREREQUISITE:  # no node/npm here: one reason line
    pytest.skip(_prerequisites.stderr.strip().splitlines()[-1], allow_module_level=True)

pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("gitlab-ci-local")]

GPU_JOBS = {"build-image", "gpu-tests", "bug-witness"}
NIGHTLY_CPU = {"cpu-slow-tests"}  # `make test-slow` (-m slow), nightly and on demand
MR_JOBS = {"lint", "cpu-tests", "report"}
GATE = {"unquarantine-gate"}  # manual, on the nightly GPU jobs' results
NIGHTLY_JOBS = MR_JOBS | GPU_JOBS | NIGHTLY_CPU | GATE
SCHEDULE_ONLY = {"pairs-nightly"}  # the pinned pair and the newest releases
STAGE = {"lint": "lint", "cpu-tests": "cpu", "cpu-slow-tests": "cpu", "build-image": "gpu", "gpu-tests": "gpu",
         "bug-witness": "gpu", "report": "report", "pairs-nightly": "gpu", "unquarantine-gate": "report"}


def _gcl(*args: str, timeout: float = RUN_TIMEOUT_S) -> Finished:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_")}
    env["FORCE_COLOR"] = "0"
    return bounded(["bash", str(GITLAB_CI_LOCAL), "--no-color", *args], timeout, cwd=REPO_ROOT,
                   env=env)


def _ok(proc: Finished) -> str:
    assert proc.returncode == 0, (
        f"gitlab-ci-local exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc.stdout


def _installed() -> None:
    """Install (or find) gitlab-ci-local: it must run and print the pinned version."""
    proc = _gcl("--version", timeout=INSTALL_TIMEOUT_S)
    assert _ok(proc).strip() == GITLAB_CI_LOCAL_VERSION, proc.stdout


@pytest.fixture(scope="module")
def gcl():
    """Runs gitlab-ci-local; the first call installs it (outside any test's own time limit)."""
    _installed()
    return _gcl


def _vars(source: str, extra: dict[str, str] | None = None) -> list[str]:
    args = ["--variable", f"CI_PIPELINE_SOURCE={source}"]
    for key, value in (extra or {}).items():
        args += ["--variable", f"{key}={value}"]
    return args


def _after_warnings(stdout: str, opener: str) -> str:
    """The document gitlab-ci-local printed, without the WARN lines it prints before it."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(opener):
            return "\n".join(lines[i:])
    raise AssertionError(f"no line starting with {opener!r} in gitlab-ci-local's output:\n{stdout}")


_PIPELINES: dict[tuple, dict[str, dict]] = {}


def pipeline(gcl, source: str, **variables: str) -> dict[str, dict]:
    """The jobs a pipeline of this source contains (rules applied), by name."""
    key = (source, tuple(sorted(variables.items())))
    if key not in _PIPELINES:
        out = _ok(gcl("--list-json", *_vars(source, variables)))
        jobs = json.loads(_after_warnings(out, "["))
        _PIPELINES[key] = {job["name"]: job for job in jobs if job["when"] != "never"}
    return _PIPELINES[key]


def needs(job: dict) -> dict[str, dict]:
    return {need["job"]: need for need in job["needs"] or []}


@pytest.fixture(scope="module")
def preview(gcl):
    """The whole file with extends and !reference expanded, as GitLab would see it."""
    yaml = pytest.importorskip("yaml")
    out = _ok(gcl("--preview", *_vars("schedule")))
    return yaml.safe_load(_after_warnings(out, "---"))


# `make test`: the nightly's pipeline; a merge request's per landing (.ci/run lists both with the
# same client), and the other sources under -m slow
@pytest.mark.parametrize("source", ["schedule", *(pytest.param(s, marks=pytest.mark.slow)
                                                  for s in ("merge_request_event", "web", "push"))])
def test_real_client_accepts_the_pipeline(gcl, source):
    proc = gcl("--list", *_vars(source))
    out = _ok(proc)
    assert "lint" in out and "report" in out, out


def test_merge_request_pipeline_is_lint_cpu_report(gcl):
    jobs = pipeline(gcl, "merge_request_event")
    assert set(jobs) == MR_JOBS, "merge requests get no GPU job (and no image build)"
    for name, job in jobs.items():
        assert job["stage"] == STAGE[name], name
        assert job["allow_failure"] is False, f"{name} may not fail in a merge request"
    assert needs(jobs["lint"]) == {}, "lint starts with the pipeline"
    assert set(needs(jobs["cpu-tests"])) == {"lint"}
    assert jobs["cpu-tests"]["when"] == "on_success"


def test_default_branch_push_has_no_gpu_job(gcl):
    assert set(pipeline(gcl, "push")) == MR_JOBS


@pytest.mark.parametrize("source", ["schedule", pytest.param("web", marks=pytest.mark.slow)])
def test_nightly_pipeline_runs_the_gpu_jobs_after_cpu(gcl, source):
    jobs = pipeline(gcl, source)
    assert set(jobs) == NIGHTLY_JOBS | (SCHEDULE_ONLY if source == "schedule" else set())
    for name, job in jobs.items():
        assert job["stage"] == STAGE[name], name
    assert set(needs(jobs["build-image"])) == {"cpu-tests"}
    assert set(needs(jobs["cpu-slow-tests"])) == {"lint"}, "the slow tests run beside cpu-tests"
    for name in ("gpu-tests", "bug-witness"):
        need = needs(jobs[name])
        assert need["cpu-tests"]["optional"] is False, f"{name} waits for the cpu stage"
        assert need["build-image"]["optional"] is True, f"{name} runs on a prebuilt image too"


def test_scheduled_pipeline_runs_the_pairs_job(gcl):
    """The nightly pairs job exists in the scheduled pipeline only, on the GPU node after the cpu
    stage, runs the matrix for the pinned pair and the newest releases, keeps the table, and
    may not fail quietly (a changed cell turns it red)."""
    jobs = pipeline(gcl, "schedule")
    job = jobs["pairs-nightly"]
    assert job["stage"] == "gpu" and job["allow_failure"] is False
    assert needs(job)["cpu-tests"]["optional"] is False
    assert "pairs-nightly" not in pipeline(gcl, "web")
    assert "pairs-nightly" not in pipeline(gcl, "merge_request_event")


def test_only_the_bug_witness_and_the_manual_gate_may_fail(gcl):
    jobs = pipeline(gcl, "schedule")
    assert jobs["bug-witness"]["allow_failure"] is True, "the witness turns orange, not red"
    assert {n for n, j in jobs.items() if j["allow_failure"]} == {"bug-witness"} | GATE


@pytest.mark.parametrize("source", ["schedule", pytest.param("web", marks=pytest.mark.slow)])
def test_unquarantine_gate_is_manual_after_the_gpu_jobs(gcl, preview, source):
    """Nightly pipelines only; someone starts it (it must not hold the pipeline as blocked); it
    judges the GPU jobs' results, and runs the gate script, which gates every job."""
    job = pipeline(gcl, source)["unquarantine-gate"]
    assert job["when"] == "manual" and job["allow_failure"] is True
    assert job["stage"] == "report", "after the gpu stage"
    need = needs(job)
    assert set(need) == {"gpu-tests", "bug-witness"}
    assert all(n["artifacts"] is True for n in need.values()), "the gate judges their results"
    assert preview["unquarantine-gate"]["script"] == ["bash tools/unquarantine-gate.sh"]
    assert "unquarantine-gate" not in pipeline(gcl, "merge_request_event")


def test_prebuilt_image_skips_the_build_but_keeps_the_order(gcl):
    jobs = pipeline(gcl, "schedule", BUILD_HARNESS_IMAGE="0")
    assert set(jobs) == (NIGHTLY_JOBS | SCHEDULE_ONLY) - {"build-image"}
    for name in ("gpu-tests", "bug-witness"):
        assert "cpu-tests" in needs(jobs[name]), f"{name} must not start before cpu-tests"


@pytest.mark.parametrize("source", ["merge_request_event", "schedule"])
def test_report_always_runs_with_the_results(gcl, source):
    jobs = pipeline(gcl, source)
    report = jobs["report"]
    assert report["when"] == "always", "the report is written when tests fail too"
    assert report["allow_failure"] is False
    need = needs(report)
    assert need["cpu-tests"]["artifacts"] is True and need["cpu-tests"]["optional"] is False
    for gpu_job in ("cpu-slow-tests", "gpu-tests", "bug-witness"):
        assert need[gpu_job]["artifacts"] is True
        assert need[gpu_job]["optional"] is True, "merge requests have no GPU job to wait for"


def test_stage_order_and_gpu_runner(preview):
    stages = [s for s in preview["stages"] if not s.startswith(".")]
    assert stages == ["lint", "cpu", "gpu", "report"]
    tag = preview["variables"]["GPU_RUNNER_TAG"]
    assert tag == "gpu-8x"
    for name in ("gpu-tests", "bug-witness"):
        job = preview[name]
        assert job["tags"] == ["$GPU_RUNNER_TAG"], f"{name} runs on the 8-GPU runners"
        assert job["resource_group"] == "gpu-node", "one GPU job on the node at a time"
        assert job["variables"]["HARNESS_PYTHON"] == "system", "the image has the stack"
    for name in MR_JOBS | NIGHTLY_CPU:
        assert "tags" not in preview[name], f"{name} runs on any runner, not a GPU node"
    assert preview["cpu-slow-tests"]["script"] == ["make test-slow"]


def test_cache_key_files_within_gitlab_limit(preview):
    for name in ("lint", "cpu-tests", "cpu-slow-tests", "report"):
        for cache in preview[name]["cache"]:
            files = cache["key"]["files"]
            assert 1 <= len(files) <= 2, f"{name}: GitLab takes one or two cache:key:files"
            assert all((REPO_ROOT / f).is_file() for f in files), files


@pytest.mark.slow
def test_lint_job_passes_in_the_shell_executor(gcl):
    """The lint job's own script, run here from .gitlab-ci.yml (no docker: shell executor)."""
    proc = gcl("--force-shell-executor", "--unset-variable", "PIP_CACHE_DIR",
               "--unset-variable", "UV_CACHE_DIR",
               *_vars("merge_request_event"), "lint", timeout=LINT_JOB_TIMEOUT_S)
    out = _ok(proc)
    assert "PASS" in out and "lint" in out, out


REGEX_RULES = """\
stages: [test]
plain:
  script: [":"]
  rules: [{if: '$BRANCH =~ /^feat-[0-9]+$/'}]
nocase:
  script: [":"]
  rules: [{if: '$BRANCH =~ /^FEAT/i'}]
negated:
  script: [":"]
  rules: [{if: '$BRANCH !~ /^feat/'}]
quoted:
  script: [":"]
  rules: [{if: '$BRANCH =~ "/-12$/"'}]
"""


@pytest.mark.parametrize("branch,jobs", [("feat-12", {"plain", "nocase", "quoted"}),
                                         pytest.param("FEAT-x", {"nocase", "negated"}, marks=pytest.mark.slow),
                                         pytest.param("main", {"negated"}, marks=pytest.mark.slow)])
def test_regex_rules_are_evaluated_by_re2(gcl, tmp_path, branch, jobs):
    """`=~` / `!~` rules go through the `re2` module, here tools/gitlab-ci-local-re2 (RE2 as
    WebAssembly): flags, anchors, negation and the quoted form pick the jobs GitLab would."""
    (tmp_path / ".gitlab-ci.yml").write_text(REGEX_RULES)
    for cmd in (["init", "-q"], ["add", "."],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "rules"]):
        git = bounded(["git", *cmd], 60, cwd=tmp_path)
        assert git.returncode == 0, git.stderr
    binary = REPO_ROOT / ".ci-tools" / "node_modules" / ".bin" / "gitlab-ci-local"
    proc = bounded([str(binary), "--no-color", "--state-dir", str(tmp_path / "state"),
                    "--home", str(tmp_path / "home"), "--list-json",
                    "--variable", f"BRANCH={branch}"], RUN_TIMEOUT_S, cwd=tmp_path)
    listed = json.loads(_after_warnings(_ok(proc), "["))
    assert {j["name"] for j in listed if j["when"] != "never"} == jobs
