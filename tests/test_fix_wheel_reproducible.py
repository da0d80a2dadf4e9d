"""``make fix-wheel`` gives the same bytes from the same source (tools/fix-wheel/build.py).

Why: a job owner checks the wheel they install against the one a reviewer built; three builds of
one commit gave three sha256 when the build's clock went into every zip entry's date.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
import zipfile
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

BUILD = REPO_ROOT / "tools" / "fix-wheel" / "build.py"
ZIP_CLOCK_S = 2.1  # a zip entry's date has 2 s steps: builds further apart differ if dated by the clock


def _build(out: Path, epoch: str | None = None) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    done = bounded([sys.executable, str(BUILD), str(out)], 300, cwd=REPO_ROOT,
                   env=env if epoch is None else {**env, "SOURCE_DATE_EPOCH": epoch})
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_builds_of_one_source_are_the_same_bytes(tmp_path):
    first = _build(tmp_path / "a")  # SOURCE_DATE_EPOCH unset: the fixed default date
    time.sleep(ZIP_CLOCK_S)
    second = _build(tmp_path / "b")
    assert first.name == second.name
    assert _sha256(first) == _sha256(second)
    with zipfile.ZipFile(first) as whl:
        infos = whl.infolist()
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    names = [i.filename for i in infos]
    assert names[-1].endswith(".dist-info/RECORD") and names == sorted(
        names, key=lambda n: (".dist-info/" in n, n.endswith("/RECORD"), n))


def test_source_date_epoch_dates_every_entry(tmp_path):
    whl = _build(tmp_path / "w", "1700000000")  # 2023-11-14T22:13:20Z
    with zipfile.ZipFile(whl) as z:
        assert {i.date_time for i in z.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        assert z.testzip() is None
