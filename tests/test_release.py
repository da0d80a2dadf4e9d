"""One release per version string: a local suffix is read as the release it belongs to.

Why: megatron-core's ``package_info`` appends the git HEAD of the checkout it is installed in
(``0.19.2+51f9c11``) while the controller fills interrupted and skipped cells from the
installed metadata (``0.19.2``): one run of one environment then looked like two pairs and the
gate refused it (exit 2) instead of judging it. PEP 440 (``packaging.version``) says what the
release of a string is: the local label (``+...``) and the dev part are not the release; a
pre-release (``rc1``) and a post-release are releases of their own.
"""
from __future__ import annotations

import json
import sys

import pytest

from harness.check.release import as_release, release
from harness.paths import COMMITTED_RUNS, REPO_ROOT
from harness.records import CellRecord
from harness.report import gate
from harness.run.results import write_record
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

NANO = "nano-30b-a3b-qad"
# a committed unpatched run of nano's witness cells, every cell of it 0.47.0 + megatron-core 0.19.2
RUN = COMMITTED_RUNS / "20261206-035422-recipes-0.47.0-none.results.json"
LOCAL = "0.19.2+51f9c11"  # what megatron-core's package_info says inside a git checkout


@pytest.mark.parametrize("raw, want", [
    (LOCAL, "0.19.2"), ("0.19.2.dev3", "0.19.2"), ("0.19.2.dev3+g1a2b3c", "0.19.2"),
    ("0.48.0rc1+local.7", "0.48.0rc1"), ("0.48.0rc1", "0.48.0rc1"), ("0.19.2.post1", "0.19.2.post1"),
    ("1!2.0+x", "1!2.0"), ("not a version", "not a version"), (None, None),
])
def test_a_version_string_is_read_as_its_release(raw, want):
    assert release(raw) == want


def _record(**kw) -> CellRecord:
    return CellRecord(scenario="s", cell_id="c", tier="cpu", backend="local", save_topology="tp1-etp1-ep2",
                      load_topology=None, patch="none", expected="pass", **kw)


def test_a_record_written_with_a_local_suffix_names_the_release_and_keeps_the_raw_string(tmp_path):
    write_record(_record(modelopt="0.47.0", mcore=LOCAL), tmp_path / "record.json")
    doc = json.loads((tmp_path / "record.json").read_text())
    assert (doc["modelopt"], doc["mcore"]) == ("0.47.0", "0.19.2")
    assert doc["raw_versions"] == {"megatron-core": LOCAL}
    plain = _record(modelopt="0.47.0", mcore="0.19.2")
    assert as_release(plain) is plain and "raw_versions" not in plain.as_dict()


def _mixed(tmp_path):
    """RUN with every other cell's megatron-core as an installed checkout reports it."""
    doc = json.loads(RUN.read_text())
    assert {c["mcore"] for c in doc["cells"]} == {"0.19.2"} and len(doc["cells"]) > 2
    for c in doc["cells"][::2]:
        c["mcore"] = LOCAL
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_run_that_mixes_both_forms_gates_as_one_pair(tmp_path, capsys):
    mixed = _mixed(tmp_path)
    want = gate.main([(str(RUN), json.loads(RUN.read_text()))], NANO, False)
    plain_out = capsys.readouterr().out
    assert want != 2 and "gate " + NANO in plain_out
    done = bounded([sys.executable, "-m", "harness", "verdict", "--job", NANO, "--gate",
                    "--results", str(mixed)], 120, cwd=REPO_ROOT)
    assert done.returncode == want, done.stdout + done.stderr
    verdict_line = next(line for line in plain_out.splitlines() if line.startswith(f"gate {NANO}: "))
    assert verdict_line.split(" -> ")[0] in done.stdout, done.stdout


def test_the_gate_reads_a_pair_given_with_a_local_suffix_as_its_release():
    assert gate.parse_pair("0.47.0", LOCAL) == gate.parse_pair("0.47.0", "0.19.2")
