"""The record types validate every record and generate their docs.

Why: a results.json, stage.json or manifest.json with a wrong field used to surface as a
traceback deep in the judge, and docs/records.md and the manifest's schema file drifted from
the code. Here: a bad record is refused in one line naming the file and the field; every
committed record is valid; the generated files are what the types give now.
"""
from __future__ import annotations

import json
import shutil

import pytest

from harness.check.results_file import ResultsFileError, read_results
from harness.golden.manifest import GoldenError, discover, read_manifest
from harness.paths import COMMITTED_RUNS, GOLDEN_DIR, REPO_ROOT, shown_path
from harness.records import RecordError, RunResults, StageResult
from harness.report import records_doc

pytestmark = pytest.mark.cpu

RUN = COMMITTED_RUNS / "20261206-120010-recipes-0.47.0-none.results.json"


def test_the_generated_files_are_what_the_types_give_now():
    stale = [shown_path(p) for p, text in records_doc.wanted().items() if p.read_text() != text]
    assert not stale, f"{stale} differ from the record types: run python -m harness evidence"


def test_every_field_has_its_meaning_in_the_tables():
    page = (REPO_ROOT / "docs" / "records.md").read_text()
    for name, cls in records_doc.TABLES.items():
        assert records_doc.table(cls) in page, name


def test_every_committed_record_validates():
    results = [*COMMITTED_RUNS.glob("*.results.json"), *(REPO_ROOT / "tests" / "data").glob("*results.json")]
    assert len(results) > 50
    for path in results:
        read_results(path)
    for path in COMMITTED_RUNS.glob("*.matrix.json"):
        for version, part in json.loads(path.read_text()).items():
            if isinstance(part, dict) and part.get("cells"):
                RunResults.from_json({"cells": part["cells"]}, source=f"{path.name} [{version}]")
    goldens = discover(GOLDEN_DIR)
    assert goldens
    for golden in goldens:
        read_manifest(golden)


@pytest.mark.parametrize("field, value, says", [
    ("outcome", "passed", "cell gpu-aggressive-recipe-witness[save=tp1-etp1-ep4-pp1,save-only] has "
                          "unknown outcome 'passed' (known: pass, "),
    ("first_failure_rank", "0", "cells[2] (gpu-aggressive-recipe-witness[save=tp1-etp1-ep4-pp1,"
                                "save-only]): first_failure_rank: Input should be a valid integer, got '0'"),
    ("secondary_errors", "boom", "secondary_errors: Input should be a valid array"),
])
def test_a_bad_results_json_is_refused_in_one_line_naming_file_and_field(tmp_path, field, value, says):
    doc = json.loads(RUN.read_text())
    doc["cells"][2][field] = value
    bad = tmp_path / "bad.results.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ResultsFileError) as err:
        read_results(bad)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{bad}: ") and says in line, line


def test_a_bad_stage_json_is_refused_naming_the_field():
    with pytest.raises(RecordError, match=r"^saves/x/stage.json: cause.kind: Input should be 'exception'"):
        StageResult.from_json({"stage": "save", "ok": False, "wall_s": 1.0, "cause": {
            "rank": 0, "kind": "boom", "exc_type": None, "message": "m", "key": None}},
            source="saves/x/stage.json")


def test_a_bad_manifest_is_refused_naming_the_field(tmp_path):
    golden = tmp_path / "g"
    shutil.copytree(discover(GOLDEN_DIR)[0], golden)
    doc = json.loads((golden / "manifest.json").read_text())
    doc["files"] = {"other/x": "0" * 64}
    (golden / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(GoldenError,
                       match=r"manifest.json: files.other/x.\[key\]: String should match pattern '\^ckpt/'"):
        read_manifest(golden)
