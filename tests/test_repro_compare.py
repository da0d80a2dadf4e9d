"""bench/repro_compare.py, which puts `make repro` of several harness trees side by side (the
GPU figures of the faster repro and the trimmed rank profile): it runs each side in its own tree with its
own environment, reads the harness clock and the wall, and exits 1 when the outcomes differ.
The trees here are stand-ins whose `python -m harness ... repro` writes a results file."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from harness.bounded import Finished
from tests.helpers import bounded

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "repro_compare.py"

# A stand-in `python -m harness --results-root R repro`: one cell whose outcome is $OUTCOME
# (default pass); it reports the environment variable FLAVOUR it was given as its exception type
# and exits with $RC (default 0).
STAND_IN = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    root = Path(sys.argv[sys.argv.index("--results-root") + 1]) / "run-1"
    root.mkdir(parents=True)
    cell = {"cell_id": "c[save=tp1]", "outcome": os.environ.get("OUTCOME", "pass"),
            "exception_type": os.environ.get("FLAVOUR"), "failing_key": None,
            "durations": {"save_stage": 1.5}}
    (root / "results.json").write_text(json.dumps({"cells": [cell]}))
    print("repro finished in 3 s")
    print(f"results: {root / 'results.json'}")
    sys.exit(int(os.environ.get("RC", "0")))
''')


def tree(tmp_path: Path, name: str) -> Path:
    t = tmp_path / name
    (t / "harness").mkdir(parents=True)
    (t / "harness" / "__main__.py").write_text(STAND_IN)
    return t


def compare(*args) -> Finished:
    return bounded([sys.executable, str(SCRIPT), *map(str, args)], timeout=120)


def test_each_side_runs_in_its_tree_with_its_environment_and_the_same_outcomes_pass(tmp_path):
    old, new = tree(tmp_path, "old"), tree(tmp_path, "new")
    out = tmp_path / "out"
    done = compare("--run", out, "--side", "old", old, "--side", "trim", new, "FLAVOUR=x=y")
    logs = {p.name: p.read_text() for p in out.glob("repro-*.log")}
    assert set(logs) == {"repro-old.log", "repro-trim.log"}
    assert all(text.splitlines()[-1].startswith("wall: ") for text in logs.values())
    # the trim side got its variable (value with '=' kept whole); the other side did not
    trim = json.loads((out / "results" / "trim" / "run-1" / "results.json").read_text())
    old_doc = json.loads((out / "results" / "old" / "run-1" / "results.json").read_text())
    assert trim["cells"][0]["exception_type"] == "x=y"
    assert old_doc["cells"][0]["exception_type"] is None
    # ... which is a difference in what the two sides say: exit 1, named
    assert done.returncode == 1, done.stdout + done.stderr
    assert "| harness clock, s | 3 | 3 |" in done.stdout
    assert "NO for trim" in done.stdout


def test_sides_with_the_same_outcomes_exit_0(tmp_path):
    a = tree(tmp_path, "a")
    done = compare("--run", tmp_path / "out", "--results-root", tmp_path / "res",
                   "--side", "one", a, "--side", "two", a)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "as one: yes" in done.stdout
    assert (tmp_path / "res" / "two" / "run-1" / "results.json").is_file()


def test_a_side_whose_repro_exits_non_zero_makes_the_comparison_exit_1(tmp_path):
    """Same outcomes, but one repro said it failed: the comparison must not read as clean."""
    a = tree(tmp_path, "a")
    done = compare("--run", tmp_path / "out", "--side", "ok", a, "--side", "bad", a, "RC=3")
    assert "as ok: yes" in done.stdout
    assert done.returncode == 1, done.stdout + done.stderr
    assert "repro bad: rc 3" in done.stderr
    assert "repro exited non-zero on bad" in done.stderr


@pytest.mark.parametrize("side, says", [
    (["x", "/nonexistent"], "TREE must be a harness checkout"),
    (["x"], "TREE must be a harness checkout"),
    (["x", str(ROOT), "NOVALUE"], "environment entries read VAR=VALUE"),
])
def test_a_bad_side_is_one_line_and_exit_2(tmp_path, side, says):
    done = compare("--run", tmp_path / "out", "--side", *side)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_log_without_a_finished_repro_is_exit_2(tmp_path):
    log = tmp_path / "repro-broken.log"
    log.write_text("Traceback (most recent call last):\nwall: 2.0 s\n")
    done = compare(log)
    assert done.returncode == 2
    assert f"{log}: no 'repro finished'" in done.stderr
