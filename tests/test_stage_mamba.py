"""tools/gpu-host/stage-mamba.sh --built: the wheels a lease compiled come back in 15 MiB parts
(run.sh mamba; 16 MiB is the most a file may be) and are joined here, byte for byte, or
refused in one line when a part is missing."""
from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
PART = 15 * 1024 * 1024


def _wheel(path: Path, mib: int) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("payload.bin", os.urandom(mib * 1024 * 1024))
    return path.read_bytes()


def _came_back(tmp_path: Path) -> tuple[Path, bytes]:
    """What run.sh mamba leaves in $OUT: small wheels whole, large ones as .partNN."""
    out = tmp_path / "out"
    out.mkdir()
    _wheel(out / "causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl", 1)
    big = _wheel(tmp_path / "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl", 33)
    for i in range(0, len(big), PART):
        (out / f"mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl.part{i // PART:02d}").write_bytes(big[i:i + PART])
    return out, big


def _stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "tools/gpu-host/stage-mamba.sh"), "--built", *args],
                          capture_output=True, text=True, timeout=120)


def test_parts_are_joined_byte_for_byte(tmp_path):
    out, big = _came_back(tmp_path)
    r = _stage(str(out), str(tmp_path / "whl"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "whl/built/mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl").read_bytes() == big
    assert (tmp_path / "whl/built/causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl").is_file()


def test_a_missing_part_is_one_line(tmp_path):
    out, _ = _came_back(tmp_path)
    (out / "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl.part01").unlink()
    r = _stage(str(out), str(tmp_path / "whl"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl is damaged" in r.stderr
