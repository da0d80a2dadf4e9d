"""The order conftest.py hands work to the xdist workers in: longest work unit first, by the
seconds in tests/durations.json, so `make test` ends on short tests on every worker."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import DURATIONS, UNKNOWN_TEST_S, _longest_units_first

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent


def item(path: str, name: str, group: str | None = None):
    nodeid = f"{path}::{name}" + (f"@{group}" if group else "")
    return SimpleNamespace(nodeid=nodeid, name=name, path=ROOT / path,
                           config=SimpleNamespace(rootpath=ROOT))


def test_units_go_longest_first_and_a_group_stays_in_its_order(monkeypatch, tmp_path):
    seconds = {"tests/a.py::short": 1.0, "tests/a.py::long": 30.0,
               "tests/b.py::g1": 12.0, "tests/b.py::g2[x]": 12.0}
    (tmp_path / "durations.json").write_text(json.dumps(seconds))
    monkeypatch.setattr("conftest.DURATIONS", tmp_path / "durations.json")
    items = [item("tests/a.py", "short"), item("tests/a.py", "unknown"),
             item("tests/b.py", "g1", "grp"), item("tests/a.py", "long"),
             item("tests/b.py", "g2[x]", "grp")]
    order = [i.name for i in _longest_units_first(items)]
    # the 30 s test, the group (24 s in all, its tests in their order), 1 s, unknown (0.2 s)
    assert order == ["long", "g1", "g2[x]", "short", "unknown"]
    assert UNKNOWN_TEST_S < 1.0


def test_without_the_file_the_collection_order_stays(monkeypatch, tmp_path):
    monkeypatch.setattr("conftest.DURATIONS", tmp_path / "missing.json")
    items = [item("tests/a.py", n) for n in ("x", "y", "z")]
    assert _longest_units_first(items) == items


def test_every_listed_test_exists():
    """A renamed test would lose its place (it would count 0.2 s and run last): each key names
    a test function defined in its file."""
    for key in json.loads(DURATIONS.read_text()):
        path, name = key.split("::", 1)
        source = (ROOT / path).read_text()
        function = name.split("[", 1)[0]
        assert re.search(rf"^(async )?def {re.escape(function)}\(", source, re.M), \
            f"{DURATIONS.name}: {key} names no test (refresh it: bench/junit_times.py --write-durations)"
