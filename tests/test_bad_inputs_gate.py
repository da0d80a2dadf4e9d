"""The gate on one run whose cells record the same megatron-core two ways: the cells that ran
record the local build (``0.19.2+<commit>``), the skipped or interrupted ones the run's release
(``0.19.2``). One pair, judged; not refused as "two pairs" with the usage code.

Why: after one Ctrl-C'd run sat in results/, ``make gate`` refused both jobs with exit 2.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness.paths import REPO_ROOT
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

WITNESS = REPO_ROOT / "tests" / "data" / "runs" / "20261202-122731-witness.results.json"
NANO = "nano-30b-a3b-qad"


def _gate(results) -> object:
    return bounded([sys.executable, "-W", "ignore", "-m", "harness", "verdict", "--job", NANO,
                    "--gate", "--results", str(results)], 300, cwd=REPO_ROOT, env=dict(os.environ))


def test_a_local_build_and_its_release_are_one_pair_to_the_gate(tmp_path):
    doc = json.loads(WITNESS.read_text())
    doc["versions"]["megatron-core"] = "0.19.2"
    plain, local = tmp_path / "plain.json", tmp_path / "local.json"
    for cell in doc["cells"]:
        cell["mcore"] = "0.19.2"
    plain.write_text(json.dumps(doc))
    for cell in doc["cells"][: len(doc["cells"]) // 2]:  # the cells that ran, in a local build
        cell["mcore"] = "0.19.2+51f9c11"
    local.write_text(json.dumps(doc))
    want, got = _gate(plain), _gate(local)
    assert "pair" not in got.stderr, got.stderr
    assert got.returncode == want.returncode != 2, (got.stdout, got.stderr)
    assert got.stdout.strip().splitlines()[-1] == want.stdout.strip().splitlines()[-1]
