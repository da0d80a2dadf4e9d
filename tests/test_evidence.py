"""docs/evidence.md and the README's generated tables are what the committed records give now
(``python -m harness evidence``), and the README is a job owner's five-minute read:
at most 8 KB, no run ids, every verdict it states the gate's answer on the committed records."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from harness.paths import COMMITTED_RUNS, EVIDENCE_PAGE, README, REPO_ROOT
from harness.report import evidence, evidence_page, gate
from harness.report.blocks import with_blocks

pytestmark = pytest.mark.cpu

README_MAX_BYTES = 8 * 1024
RUN_ID = re.compile(r"20\d{6}-\d{4}")  # a run directory's name: 20261206-153930-...


@pytest.fixture(scope="module")
def ev() -> evidence.Evidence:
    return evidence.Evidence()


def test_the_committed_page_is_what_the_records_give_now(ev):
    assert EVIDENCE_PAGE.read_text() == evidence_page.page(ev), (
        "docs/evidence.md differs from what the committed records give: run python -m harness evidence")


def test_the_readmes_generated_tables_are_what_the_records_give_now(ev):
    text = README.read_text()
    assert text == with_blocks(text, evidence.readme_blocks(ev)), (
        "README.md's generated tables differ from the committed records: run python -m harness evidence")


def test_a_changed_record_changes_the_page(tmp_path):
    """The page is read from the records, not kept: one record's outcome changed (the 0.48.0rc1
    Nano witness reload on megatron-core 0.16.1 made a collision) changes the Nano verdict."""
    runs = tmp_path / "runs"
    runs.mkdir()
    name = "20261206-075927-recipes-0.48.0rc1-none-mc0.16.1.results.json"
    shutil.copy(COMMITTED_RUNS / name, runs / name)
    before = evidence_page.page(evidence.Evidence(runs))
    doc = json.loads((runs / name).read_text())
    cell = next(c for c in doc["cells"]
                if c["cell_id"] == "gpu-nano-recipe-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]")
    assert cell["outcome"] == "pass"
    cell.update(outcome="bug-reproduced", failed_stage="load", exception_type="CheckpointingException",
                message="Invalid access pattern", verify={})
    (runs / name).write_text(json.dumps(doc))
    after = evidence_page.page(evidence.Evidence(runs))
    assert before != after
    nano = lambda page: page.split("### Nemotron-3 Nano", 1)[1].split("\n### ", 1)[0]  # noqa: E731
    assert "| 0.48.0rc1 + 0.16.1 | SAFE |" in nano(before)
    assert "| 0.48.0rc1 + 0.16.1 | SAFE |" not in nano(after)


def test_the_readme_is_a_five_minute_read():
    raw = README.read_bytes()
    assert len(raw) <= README_MAX_BYTES, len(raw)
    text = raw.decode()
    assert not RUN_ID.findall(text), RUN_ID.findall(text)
    for says in ("make repro", "make test", "python -m harness inspect", "python -m harness repair",
                 "docs/evidence.md"):
        assert says in text, says


def test_the_readme_says_how_to_use_the_fix_in_two_steps():
    section = README.read_text().split("## Using the fix", 1)[1].split("\n## ", 1)[0]
    steps = [line for line in section.splitlines() if re.match(r"\d\. ", line)]
    assert len(steps) == 2, section
    assert "make fix-wheel" in steps[0] and "dist/moe_ckpt_fix-" in section and "pip install" in section
    assert "MOE_CKPT_FIX=1" in steps[1]


def test_every_readme_section_the_code_and_docs_name_exists():
    """harness/, tools/, docs/, CI and scenarios point readers at README sections by name."""
    headings = [h.strip() for h in re.findall(r"^#+ (.*)$", README.read_text(), re.M)]
    files = [*REPO_ROOT.joinpath("harness").rglob("*.py"), *REPO_ROOT.joinpath("tools").rglob("*.sh"),
             *REPO_ROOT.joinpath("docs").glob("*.md"), *REPO_ROOT.joinpath("scenarios").glob("*.toml"),
             REPO_ROOT / ".gitlab-ci.yml"]
    named = set()
    for f in files:
        named |= set(re.findall(r"README(?:\.md)?,? ['\"]([A-Z][^'\"]+)['\"]", f.read_text()))
    assert named, "no reference found: the pattern is stale"
    for name in named:
        assert any(h.startswith(name) for h in headings), (name, headings)


def _readme_verdicts() -> list[tuple[str, str, str, str, int]]:
    """(job, --modelopt V [--patched] flags, megatron-core, word, exit) per cell of the README's
    verdict tables."""
    text = README.read_text()
    block = text.split("verdicts -->", 1)[1].split("<!-- end of generated verdicts", 1)[0]
    out = []
    for part in re.split(r"^\*\*`", block, flags=re.M)[1:]:
        job = part.split("`", 1)[0]
        lines = [line for line in part.splitlines() if line.startswith("| ")]
        mcores = [h.strip().removeprefix("megatron-core ") for h in lines[0].strip("| ").split("|")[2:]]
        for row in lines[2:]:
            cols = [c.strip() for c in row.strip("| ").split("|")]
            flags = cols[1].strip("`")
            for mc, text_ in zip(mcores, cols[2:]):
                word, code = re.fullmatch(r"(.+?)(?: \*)? \(exit (\d)\)", text_).groups()
                out.append((job, flags, mc, word, int(code)))
    return out


@pytest.mark.slow  # the gate on the committed records: tests/test_gate_committed.py
def test_every_verdict_the_readme_states_is_the_gates_on_the_committed_records(capsys):
    """Each cell of the README's tables, asked of the gate with the row's flags: the exit code
    it states, and its word (BLOCKED: the unpatched answer where the fix makes it safe)."""
    cells = _readme_verdicts()
    assert {job for job, *_ in cells} == {j.id for j in gate.vd.load_quarantine().jobs}
    assert {"0.47.0", "0.48.0rc1"} <= {f.split()[1] for _, f, *_ in cells}
    for job, flags, mc, word, code in cells:
        modelopt = flags.split()[1]
        rc = gate.main_committed(job, modelopt, mc, "--patched" in flags)
        last = capsys.readouterr().out.splitlines()[-1]
        assert rc == code, (job, flags, mc, last)
        said = re.match(rf"gate {job}: (.+?) -> exit {code}: ", last).group(1)
        if word == "BLOCKED" and said == "SAFE WITH PATCH":
            assert "--patched" not in flags and code == gate.EXIT_BLOCKED
        elif word == "no evidence":
            assert code == gate.EXIT_UNDECIDED and "what would decide" in last
        else:
            assert said == word, (job, flags, mc, last)


def test_each_job_on_its_twins_gets_the_rules_verdict_on_every_pair(ev):
    """``[[jobs.profile.also]]`` (the hybrid model, the job's own reload path): what the page
    and the README's "Also judged" lines show per pair is what the rules give the records."""
    from harness.report.jobs import Quarantine, variant_job
    from tests.helpers import committed_cells, expected_verdict

    raw = committed_cells()
    twins = [(job, v) for job in ev.quarantine.jobs for v in job.profile.also]
    assert twins
    for job, variant in twins:
        vjob = variant_job(job, variant)
        for pair in ev.pairs:
            jp = ev.judged(vjob, pair, Quarantine((vjob,)))
            want = expected_verdict(raw, vjob, (pair.modelopt, pair.mcore))
            if want is None:
                assert jp.code(False) == jp.code(True) == gate.EXIT_UNDECIDED, (variant.model, pair)
            else:
                assert jp.verdict.word == want, (variant.model, pair)
    hybrid = variant_job(*next((j, v) for j, v in twins if v.fix))
    assert expected_verdict(raw, hybrid, ("0.47.0", "0.19.2")) == gate.vd.SAFE_WITH_PATCH
    assert expected_verdict(raw, hybrid, ("0.48.0rc1", "0.19.2")) == gate.vd.SAFE
