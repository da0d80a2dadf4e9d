"""Damaged inputs give one clear line and an exit code, never a traceback or a false "complete":
``inspect`` on a damaged copy of a golden checkpoint, ``report`` and ``verdict`` on results
files that are not results. The committed goldens are only ever copied, never touched."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.check.results_file import INCOMPLETE_LINE, ResultsFileError, read_results
from harness.golden import inspect
from harness.records import OUTCOMES
from harness.report import picture, summary, verdict, verdict_text

pytestmark = pytest.mark.cpu

TESTS = Path(__file__).resolve().parent
GOLDEN_DIR = TESTS / "golden"
GOLDEN = GOLDEN_DIR / "modelopt-0.47.0-tp1-etp1-ep8" / "ckpt"
RUN = TESTS / "data" / "runs" / "20261202-122731-witness.results.json"


def _hashes() -> dict[str, str]:
    return {str(p.relative_to(GOLDEN_DIR)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(GOLDEN_DIR.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def golden_before() -> dict[str, str]:
    return _hashes()


@pytest.fixture(autouse=True)
def goldens_untouched(golden_before):
    yield
    assert _hashes() == golden_before, "a test changed a file under tests/golden"


def _one_line(text: str, *names: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def ckpt(tmp_path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(GOLDEN, copy)
    return copy


def _inspect(path: Path, capsys) -> tuple[int, str]:
    rc = inspect.main(SimpleNamespace(ckpt=str(path)))
    captured = capsys.readouterr()
    return rc, captured.err


# --- inspect ------------------------------------------------------------------------------------

def test_intact_copy_is_complete(ckpt, capsys):
    assert inspect.main(SimpleNamespace(ckpt=str(ckpt))) == 0
    assert "complete" in capsys.readouterr().out


def test_truncated_distcp(ckpt, capsys):
    f = ckpt / "__3_0.distcp"
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[:1000])
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(f), f"truncated: needs {size} bytes, has 1000")


def test_deleted_distcp(ckpt, capsys):
    f = ckpt / "__5_0.distcp"
    f.unlink()
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(f), "missing")


def test_random_bytes_smaller(ckpt, capsys):
    f = ckpt / "__0_0.distcp"
    f.write_bytes(os.urandom(f.stat().st_size // 2))
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(f), "truncated")


def test_random_bytes_same_size(ckpt, capsys):
    f = ckpt / "__2_0.distcp"
    f.write_bytes(os.urandom(f.stat().st_size))
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(f), "not a torch.save record")


def test_several_damaged_files_still_one_line(ckpt, capsys):
    (ckpt / "__1_0.distcp").unlink()
    (ckpt / "__6_0.distcp").write_bytes(b"")
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(ckpt / "__1_0.distcp"), "and 1 more damaged file")


def test_damaged_modelopt_state(ckpt, capsys):
    f = ckpt / "modelopt_state" / "__0_0.distcp"
    f.write_bytes(b"")
    rc, err = _inspect(ckpt, capsys)
    assert rc == 3
    _one_line(err, str(f), "truncated")


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x80\x04K\x01."], ids=["empty", "junk", "an-int"])
def test_corrupt_metadata(ckpt, capsys, content):
    f = ckpt / ".metadata"
    f.write_bytes(content)
    rc, err = _inspect(ckpt, capsys)
    assert rc == 2
    _one_line(err, str(f), "unreadable")


def test_empty_directory(tmp_path, capsys):
    d = tmp_path / "empty"
    d.mkdir()
    rc, err = _inspect(d, capsys)
    assert rc == 2
    _one_line(err, str(d), "not a megatron-core distributed checkpoint")


def test_a_goldens_folder_hints_at_its_ckpt(tmp_path, capsys):
    """A golden's folder (``ckpt/`` + ``manifest.json``) is not the checkpoint: the one line
    names the one inside."""
    rc, err = _inspect(GOLDEN.parent, capsys)
    assert rc == 2
    assert _one_line(err, "not a megatron-core").endswith(f"; did you mean {GOLDEN}?")


def test_the_only_checkpoint_subfolder_is_hinted_and_several_are_not(ckpt, tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    saved = ckpt.rename(tmp_path / "iter_0000100")
    rc, err = _inspect(tmp_path, capsys)
    assert rc == 2 and _one_line(err).endswith(f"; did you mean {saved}?")
    shutil.copytree(saved, tmp_path / "iter_0000200")
    rc, err = _inspect(tmp_path, capsys)
    assert rc == 2 and "did you mean" not in _one_line(err, "metadata.json missing")


def test_missing_path(tmp_path, capsys):
    rc, err = _inspect(tmp_path / "nope", capsys)
    assert rc == 2
    _one_line(err, str(tmp_path / "nope"), "no such file")


def test_damage_reaches_callers_as_not_a_checkpoint(ckpt):
    (ckpt / "__4_0.distcp").unlink()
    with pytest.raises(inspect.NotACheckpoint, match="__4_0.distcp: missing"):
        inspect.inspect_checkpoint(ckpt)


# --- results files: report and verdict ----------------------------------------------------------

def _good() -> dict:
    return json.loads(RUN.read_text())


def _bad_docs() -> dict[str, tuple[str | None, str]]:
    """name -> (file text, or None for no file; what the message must say)."""
    good = json.dumps(_good())
    unknown = _good()
    unknown["cells"][1]["outcome"] = "exploded"
    no_outcome = _good()
    del no_outcome["cells"][0]["outcome"]
    return {
        "empty": ("", "empty file"),
        "truncated": (good[: len(good) // 2], "not JSON"),
        "list": ("[]", "not an object"),
        "empty-object": ("{}", "missing `cells`, `run_id`, `versions`"),
        "unknown-outcome": (json.dumps(unknown), "unknown outcome 'exploded'"),
        "cell-without-outcome": (json.dumps(no_outcome), "lacks `outcome`"),
        "not-utf8": ("\udcff", "not UTF-8"),
        "missing": (None, "no such file"),
    }


@pytest.fixture(params=sorted(_bad_docs()))
def bad(request, tmp_path) -> tuple[Path, str]:
    text, says = _bad_docs()[request.param]
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    if text is not None:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path, says


def test_report_refuses_bad_results(bad, capsys):
    path, says = bad
    rc = picture.main(SimpleNamespace(results=str(path), results_root="unused"))
    captured = capsys.readouterr()
    assert rc == 2
    _one_line(captured.err, str(path), says)
    assert captured.out == ""
    assert not (path.parent / "summary.md").exists() and not (path.parent / "grid.png").exists()


def test_verdict_refuses_bad_results(bad):
    path, says = bad
    with pytest.raises(ResultsFileError) as info:
        verdict.read_docs([RUN, path])
    _one_line(str(info.value), str(path), says)


def test_truncated_json_says_where(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(RUN.read_text()[:200])
    with pytest.raises(ResultsFileError, match=r"not JSON \(.* at line \d+ column \d+"):
        read_results(path)


def test_every_known_outcome_is_accepted(tmp_path):
    doc = _good()
    doc["cells"] = [{**doc["cells"][0], "cell_id": f"c{i}", "outcome": o} for i, o in enumerate(OUTCOMES)]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert [c["outcome"] for c in read_results(path)["cells"]] == list(OUTCOMES)


@pytest.mark.usefixtures("baseline_profiles")
def test_incomplete_run_is_reported_as_such(tmp_path, capsys):
    doc = {**_good(), "incomplete": True, "interrupted_by": "SIGINT"}
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    assert picture.main(SimpleNamespace(results=str(path), results_root="unused")) == 0
    head = (path.parent / "summary.md").read_text().splitlines()[:4]
    assert any(INCOMPLETE_LINE in line for line in head), head
    capsys.readouterr()
    verdict_text.main(verdict.read_docs([path, RUN]))
    own, other, together = capsys.readouterr().out.split("\n\n")
    assert str(path) in own and INCOMPLETE_LINE in own
    assert str(RUN) in other and INCOMPLETE_LINE not in other
    assert "all 2 runs together" in together and f"{INCOMPLETE_LINE} (run {doc['run_id']})" in together


@pytest.mark.usefixtures("baseline_profiles")
def test_complete_run_says_nothing_about_it(tmp_path, capsys):
    assert INCOMPLETE_LINE not in summary.markdown_summary(_good())
    verdict_text.main(verdict.read_docs([RUN]))
    assert INCOMPLETE_LINE not in capsys.readouterr().out


def _job_doc(job_id: str, run_id: str, created: str, fix_outcomes: list[str], **kw) -> dict:
    q = verdict.load_quarantine()
    by_name = {s.name: s for s in verdict.load_all()}
    job = next(j for j in q.jobs if j.id == job_id)
    witness = verdict.job_cells(job, by_name[job.profile.witness])
    fix = verdict.job_cells(job, by_name[job.profile.fix])
    cells = [{"cell_id": c.id, "tier": c.scenario.tier, "expected": c.expected,
              "outcome": "bug-reproduced" if c.load else "pass"} for c in witness]
    cells += [{"cell_id": c.id, "tier": c.scenario.tier, "expected": "pass", "outcome": o}
              for c, o in zip(fix, fix_outcomes)]
    return {"run_id": run_id, "created": created, "tier": "gpu-shared",
            "versions": {"nvidia-modelopt": "0.47.0", "megatron-core": "0.19.2"},  # a pair with a rule
            "cells": cells, **kw}


@pytest.mark.usefixtures("baseline_profiles")
def test_an_interrupted_cell_counts_as_missing_evidence(tmp_path, capsys):
    job = "nano-30b-a3b-qad"
    doc = _job_doc(job, "stopped", "2", ["pass", "interrupted"], incomplete=True)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    [(label, read)] = verdict.read_docs([path])
    vd = next(v for v in verdict.judge_doc(read) if v.job.id == job)
    assert vd.word == verdict.BLOCKED and "fix evidence incomplete, missing" in vd.detail
    assert [e.outcome for e in vd.evidence if e.role == "fix"] == ["pass", "interrupted"]
    # An older complete run's result is not overridden by a newer interrupted cell.
    older = _job_doc(job, "whole", "1", ["pass", "pass"])
    text, verdicts = verdict_text.verdict_report([("older", older), (label, read)])
    together = [v for v in verdicts if v.job.id == job][-1]
    assert together.word == verdict.SAFE_WITH_PATCH, together.detail
