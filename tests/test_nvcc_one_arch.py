"""tools/gpu-host/nvcc-one-arch.sh: mamba-ssm's build reaches nvcc with 8 architectures; the
wrapper passes on only the host GPU's, in either -gencode form, and refuses in one line when
none of them is that one (nvcc would silently build its default)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

WRAPPER = Path(__file__).resolve().parent.parent / "tools" / "gpu-host" / "nvcc-one-arch.sh"


def _nvcc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "nvcc"  # prints the arguments it was given
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "NVCC_ONE_ARCH": "90"}
    return subprocess.run(["bash", str(WRAPPER), *args], env=env, capture_output=True, text=True, timeout=30)


def test_only_the_hosts_architecture_reaches_nvcc(tmp_path):
    r = _nvcc(tmp_path, "-c", "a.cu", "-gencode", "arch=compute_75,code=sm_75",
              "-gencode", "arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90",
              "-gencode=arch=compute_100,code=sm_100", "--threads", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["-c", "a.cu", "-gencode", "arch=compute_90,code=sm_90",
                                "-gencode", "arch=compute_90,code=compute_90", "--threads", "4"]


def test_no_gencode_passes_through(tmp_path):
    assert _nvcc(tmp_path, "--version").stdout.split() == ["--version"]


def test_none_of_the_architectures_is_the_hosts_is_one_line(tmp_path):
    r = _nvcc(tmp_path, "-c", "a.cu", "-gencode", "arch=compute_75,code=sm_75")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "nvcc-one-arch.sh: none of the 1 -gencode architectures is compute_90 (NVCC_ONE_ARCH)"
