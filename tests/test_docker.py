"""docker/Dockerfile stays buildable-looking and in step with the pinned requirements.

No docker engine is needed: a tiny instruction parser reads the file. The image's
megatron-core and nvidia-modelopt pins must equal requirements/megatron-core.txt and
requirements/cpu.in (and their locks), so the GPU image never tests a different stack than the CPU
tier.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"
KNOWN = {
    "FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "CMD", "ENTRYPOINT", "SHELL", "LABEL",
    "USER", "EXPOSE", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD",
}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, backslash continuations joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment line inside a continuation is ignored by docker too
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return out


def assignments(args: str) -> dict[str, str]:
    """``A=1 B="x y"`` (ARG / ENV form) as a dict; a bare ``NAME`` maps to ''."""
    out = {}
    for token in shlex.split(args):
        name, _, value = token.partition("=")
        out[name] = value
    return out


def pin(path: Path, package: str) -> str:
    for line in path.read_text().splitlines():
        m = re.match(rf"^{re.escape(package)}==([^\s#;]+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{package} is not pinned with == in {path}")


@pytest.fixture(scope="module")
def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def merged(parsed: list[tuple[str, str]], word: str) -> dict[str, str]:
    """Every ``word`` (ARG or ENV) instruction's assignments, later ones winning."""
    out: dict[str, str] = {}
    for w, rest in parsed:
        if w == word:
            out.update(assignments(rest))
    return out


@pytest.fixture(scope="module")
def args(parsed) -> dict[str, str]:
    return merged(parsed, "ARG")


@pytest.fixture(scope="module")
def env(parsed) -> dict[str, str]:
    return merged(parsed, "ENV")


def test_parser_handles_continuations_and_comments():
    text = "# c\nFROM x\nENV A=1 \\\n    # inner\n    B=2\nrun echo hi\n"
    assert instructions(text) == [("FROM", "x"), ("ENV", "A=1 B=2"), ("RUN", "echo hi")]


def test_dockerfile_parses(parsed):
    words = [w for w, _ in parsed]
    assert set(words) <= KNOWN, f"unknown instructions: {set(words) - KNOWN}"
    first = next(w for w in words if w != "ARG")
    assert first == "FROM"


def test_base_is_a_concrete_ngc_pytorch_tag(parsed, args):
    assert any(w == "FROM" and "${BASE_IMAGE}" in rest for w, rest in parsed)
    image = args["BASE_IMAGE"]
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3", image), image


def test_pins_match_requirements(args):
    assert args["MEGATRON_CORE_VERSION"] == pin(ROOT / "requirements/megatron-core.txt", "megatron-core")
    assert args["MEGATRON_CORE_VERSION"] == pin(ROOT / "requirements/megatron-core.lock", "megatron-core")
    assert args["MODELOPT_VERSION"] == pin(ROOT / "requirements/cpu.in", "nvidia-modelopt")
    assert args["MODELOPT_VERSION"] == pin(ROOT / "requirements/cpu.lock", "nvidia-modelopt")
    assert "MODELOPT_GIT_REF" in args  # an upstream fix can be tested before its release


def test_mamba_comes_from_its_requirements_file(parsed):
    """The hybrid model's kernels: the image installs requirements/mamba.txt itself (one place
    for their pins), with --no-deps, so the file pins their dependencies too."""
    assert ("COPY", "requirements/mamba.txt /tmp/requirements-mamba.txt") in parsed
    runs = " ".join(rest for w, rest in parsed if w == "RUN")
    assert "--no-deps --no-build-isolation -r /tmp/requirements-mamba.txt" in runs
    pins = {line.split("==")[0] for line in (ROOT / "requirements/mamba.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    assert pins == {"mamba-ssm", "causal-conv1d", "einops"}


def test_installs_the_pinned_test_runner(parsed):
    """The nightly image runs `make test-gpu`: it installs requirements/test.txt itself (
    the NGC base's pytest 9.1.1 could not collect the suite), the same file the cpu venv uses."""
    assert ("COPY", "requirements/test.txt /tmp/requirements-test.txt") in parsed
    runs = [rest for w, rest in parsed if w == "RUN"]
    assert any(re.search(r"pip install -r /tmp/requirements-test\.txt", r) for r in runs)
    pins = {line.split("==")[0] for line in (ROOT / "requirements/test.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    assert pins == {"pytest", "pytest-xdist", "pytest-timeout"}
    assert "-r test.txt" in (ROOT / "requirements/cpu.in").read_text()


def test_installs_pins_and_harness(parsed):
    runs = " ".join(rest for w, rest in parsed if w == "RUN")
    assert "megatron-core==${MEGATRON_CORE_VERSION}" in runs
    assert "nvidia-modelopt==${MODELOPT_VERSION}" in runs
    assert "@${MODELOPT_GIT_REF}" in runs
    assert re.search(r"pip install .*-e \.", runs)
    assert any(w == "COPY" for w, _ in parsed)


def test_nccl_and_harness_env(env):
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["HARNESS_PYTHON"] == "system"


def test_gitlab_ci_modelopt_pin_matches():
    ci = (ROOT / ".gitlab-ci.yml").read_text()
    m = re.search(r'^\s+MODELOPT_VERSION:\s*"?([^"\s]+)"?', ci, re.M)
    assert m and m.group(1) == pin(ROOT / "requirements/cpu.in", "nvidia-modelopt")


def test_gpu_wheelhouse_pins_agree_when_present(args):
    """A GPU wheelhouse (docs/gpu-host.md) is optional: compare its pins when
    HARNESS_GPU_WHEELHOUSE names one."""
    where = os.environ.get("HARNESS_GPU_WHEELHOUSE")
    pins = Path(where) / "pins.txt" if where else None
    if pins is None or not pins.is_file():
        pytest.skip("no GPU wheelhouse given (HARNESS_GPU_WHEELHOUSE=<dir with pins.txt>)")
    assert args["MEGATRON_CORE_VERSION"] == pin(pins, "megatron-core")
    assert args["MODELOPT_VERSION"] == pin(pins, "nvidia-modelopt")
