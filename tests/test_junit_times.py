"""bench/junit_times.py --compare: two JUnit files side by side per test file, with after/before
(the `make test` timing figures in docs/benchmarks.md come from it). In-process, on small JUnit files."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu
SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "junit_times.py"


def _bench():
    spec = importlib.util.spec_from_file_location("junit_times", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _junit(wall: float, cases: list[tuple[str, str, float, str]]) -> str:
    rows = []
    for cls, name, secs, how in cases:
        inner = "<skipped message='why'/>" if how == "skipped" else ""
        rows.append(f'<testcase classname="{cls}" name="{name}" time="{secs}">{inner}</testcase>')
    return (f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
            f'time="{wall}">{"".join(rows)}</testsuite></testsuites>')


def test_compare_puts_each_file_side_by_side_with_its_ratio(tmp_path, capsys):
    before = tmp_path / "before.xml.gz"  # the kept baseline is gzipped
    with gzip.open(before, "wt") as f:
        f.write(_junit(400.0, [("tests.test_a", "test_one", 100.0, "passed"),
                               ("tests.test_a", "test_two", 20.0, "passed"),
                               ("tests.test_b", "test_x", 10.0, "skipped"),
                               ("tests.test_gone", "test_old", 5.0, "passed")]))
    after = tmp_path / "after.xml"
    after.write_text(_junit(200.0, [("tests.test_a", "test_one", 30.0, "passed"),
                                    ("tests.test_a", "test_two", 30.0, "passed"),
                                    ("tests.test_b", "test_x", 10.0, "skipped"),
                                    ("tests.test_new", "test_y", 2.0, "passed")]))
    assert _bench().main(["--compare", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "pytest wall 400 -> 200 s (after/before 0.50); sum of test times 135 -> 72 s (0.53)" in out
    rows = [line for line in out.splitlines() if line.startswith("| tests/")]
    assert rows == ["| tests/test_a.py | 120.0 | 60.0 | 0.50 | 2 | 2 |",
                    "| tests/test_b.py | 10.0 | 10.0 | 1.00 | 1 | 1 |",
                    "| tests/test_gone.py | 5.0 | - | - | 1 | 0 |",
                    "| tests/test_new.py | - | 2.0 | - | 0 | 1 |"]
    assert "1 skipped" in out.splitlines()[0] and out.splitlines()[0].startswith(f"before: {before}")


def test_compare_refuses_a_third_file(tmp_path):
    with pytest.raises(SystemExit):
        _bench().main([str(tmp_path / "x.xml"), "--compare", "a.xml", "b.xml"])
