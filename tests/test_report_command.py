"""``python -m harness report``: summary.md and grid.png beside a results.json (a committed H200
run copied to tmp), and the newest run under --results-root when none is named."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.report import picture as report_summary

pytestmark = pytest.mark.cpu

RUN = Path(__file__).resolve().parent / "data" / "runs" / "20261202-122731-witness.results.json"


def test_report_named_file(tmp_path, capsys):
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    shutil.copy(RUN, path)
    assert report_summary.main(SimpleNamespace(results=str(path), results_root="unused")) == 0
    out = capsys.readouterr().out
    summary = (path.parent / "summary.md").read_text()
    assert out.strip() == summary.strip()
    assert "20261202-122731-witness" in summary and "16 bug-reproduced" in summary
    n = len(json.loads(RUN.read_text())["cells"])
    assert sum(1 for line in summary.splitlines() if line.startswith("| tp")) == n
    assert (path.parent / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_newest_under_root(tmp_path, capsys):
    for i, name in enumerate(("20261201-000000-old", "20261202-000000-new")):
        (tmp_path / name).mkdir()
        shutil.copy(RUN, tmp_path / name / "results.json")
        os.utime(tmp_path / name / "results.json", (1_000_000 + i, 1_000_000 + i))
    assert report_summary.main(SimpleNamespace(results=None, results_root=str(tmp_path))) == 0
    assert (tmp_path / "20261202-000000-new" / "summary.md").exists()
    assert not (tmp_path / "20261201-000000-old" / "summary.md").exists()


def test_report_nothing_to_read(tmp_path, capsys):
    assert report_summary.main(SimpleNamespace(results=None, results_root=str(tmp_path))) == 2
    assert "no " in capsys.readouterr().err
