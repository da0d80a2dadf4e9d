"""The gate finds its own evidence: ``verdict --job ID --gate --modelopt V
[--mcore V] [--patched]`` judges every committed record of that (nvidia-modelopt, megatron-core)
pair. Expectations come from the records, read here with plain json, and from the verdict's rules
(harness/report/verdict.py's docstring; each recorded cell re-judged by the one judge), never
from the gate's output."""
from __future__ import annotations

import sys

import pytest
from packaging.version import Version

from harness.check.versions import rules_for
from harness.paths import COMMITTED_RUNS, REPO_ROOT
from harness.report import gate, records_index, verdict
from tests.helpers import committed_cells, expected_verdict, merged_pair

pytestmark = pytest.mark.cpu

NANO, ULTRA = "nano-30b-a3b-qad", "ultra-550b-a55b-nvfp4-ptq"
# The exit code of each verdict word, as the README's table lists it (per pipeline: unpatched,
# patched); None: the word does not decide (INCOMPLETE, NO EVIDENCE, RULE UNKNOWN: 4).
README_EXIT = {verdict.SAFE: (0, 0), verdict.SAFE_WITH_PATCH: (3, 0), verdict.BLOCKED: (3, 3),
               verdict.UNEXPECTED: (1, 1)}


RAW = committed_cells()
PAIRS = sorted({(c["modelopt"], c["mcore"]) for _, _, cells in RAW for c in cells})
NEWEST_MCORE = max((c for _, c in PAIRS), key=Version)


def test_the_index_holds_every_pair_the_records_name_and_the_files_of_each():
    index = records_index.read_index()
    assert [(p.modelopt, p.mcore) for p in records_index.pairs(index)] == sorted(
        PAIRS, key=lambda p: records_index.Pair(*p).sort_key)
    for pair in PAIRS:
        want = {name for name, _, cells in RAW
                if any((c["modelopt"], c["mcore"]) == pair for c in cells)}
        got = {e.label.split("/")[-1].split(" ")[0]
               for e in records_index.of_pair(index, records_index.Pair(*pair))}
        assert got == want, pair
    # a file's name is not its pair: this run is named for 0.16.1 and ran on 0.19.2
    rerun = next(cells for name, _, cells in RAW if name.startswith("20261206-053249"))
    assert {c["mcore"] for c in rerun} == {"0.19.2"}


def _gate(capsys, job_id, pair, patched) -> tuple[int, str]:
    rc = gate.main_committed(job_id, pair[0], pair[1], patched)
    return rc, capsys.readouterr().out


# `make test`: each modelopt release with the newest megatron-core; the older megatron-cores
# (the same rules, more records) under -m slow (0.16.1's files: the ultra test below)
@pytest.mark.parametrize("pair", [pytest.param(p, id=f"{p[0]}+{p[1]}",
                                               marks=[] if p[1] == NEWEST_MCORE else [pytest.mark.slow])
                                  for p in PAIRS])
@pytest.mark.parametrize("job_id", [NANO, ULTRA])
def test_the_gate_over_the_committed_records_gives_the_rules_verdict(capsys, job_id, pair):
    for patched in (False, True):
        word = expected_verdict(RAW, gate.job_of(job_id), pair, patched)
        rc, out = _gate(capsys, job_id, pair, patched)
        last = out.splitlines()[-1]
        if word is None:
            assert rc == gate.EXIT_UNDECIDED, out
            assert last.startswith(f"gate {job_id}: ") and " -> exit 4: " in last, out
            assert "what would decide: python -m harness run --scenario " in last, out
            assert "on a host with a CUDA GPU and Transformer Engine" in last
            continue
        want = README_EXIT[word][patched]
        assert rc == want, (patched, out)
        assert last.startswith(f"gate {job_id}: {word} -> exit {want}: "), out
        assert ("Next step:" in last) == (want == 0)


def test_every_rows_pair_of_the_readme_is_decided_by_the_committed_records():
    """The README's rows decide on megatron-core 0.19.2 and 0.16.1 for both jobs: the records hold
    the collision unpatched on 0.47.0, the fix's passes, and 0.48.0rc1's passes (its Ultra
    reloads at another expert TP a known refusal). The Ultra job's fix evidence is the reshard
    grid of wheel 0.3.0 (part f): recorded on megatron-core 0.19.2 only, under 0.47.0 and
    0.48.0rc1; on 0.16.1 the patched pipeline is not decided."""
    for job_id in (NANO, ULTRA):
        for mcore in ("0.19.2", "0.16.1"):
            job = gate.job_of(job_id)
            patched_047 = expected_verdict(RAW, job, ("0.47.0", mcore), patched=True)
            if job_id == ULTRA and mcore == "0.16.1":
                assert expected_verdict(RAW, job, ("0.47.0", mcore)) == verdict.BLOCKED
                assert patched_047 is None
            else:
                assert patched_047 == verdict.SAFE_WITH_PATCH, (job_id, mcore)
            assert expected_verdict(RAW, job, ("0.48.0rc1", mcore)) == verdict.SAFE, (job_id, mcore)
        witness, _ = verdict.evidence_cells(gate.job_of(job_id))
        merged = merged_pair(RAW, ("0.47.0", "0.19.2"))
        assert "bug-reproduced" in {merged[c.id]["outcome"] for c in witness if c.id in merged}
    ultra = gate.job_of(ULTRA)
    assert expected_verdict(RAW, ultra, ("0.48.0rc1", "0.19.2"), patched=True) == verdict.SAFE_WITH_PATCH


def test_the_ultra_gate_on_0_16_1_judges_the_three_files_that_hold_its_cells(capsys):
    """Its 0.48.0rc1 witness cells are in three runs (one cut); the gate names each file the
    job's cells came from and the cut one."""
    pair = ("0.48.0rc1", "0.16.1")
    ids = {c.id for c in verdict.evidence_cells(gate.job_of(ULTRA))[0]}
    holding = {name for name, _, cells in RAW for c in cells
               if (c["modelopt"], c["mcore"]) == pair and c["cell_id"] in ids
               and c["outcome"] not in ("skipped", "interrupted")}
    cut = {name for name, _, cells in RAW
           if any((c["modelopt"], c["mcore"]) == pair and c["cell_id"] in ids
                  and c["outcome"] == "interrupted" for c in cells)}
    assert len(holding) == 3 and cut
    rc, out = _gate(capsys, ULTRA, pair, False)
    assert rc == 0
    came = out.split("cells came from", 1)[1].split("  interrupted", 1)[0]
    assert {name for name in holding if name in came} == holding, out
    interrupted = next(line for line in out.splitlines() if "interrupted (incomplete)" in line)
    assert all(name in interrupted for name in cut), out


def test_the_next_step_names_every_change_of_the_pipeline(capsys):
    """Patched on 0.47.0: the release, the fix's wheel and switch, the allow-to-fail line. On
    0.48.0rc1 the fix has only part (f), which the Nano job's recipe does not reach: a patched
    pipeline drops it."""
    job = gate.job_of(NANO)
    _, out = _gate(capsys, NANO, ("0.47.0", "0.19.2"), True)
    step = out.splitlines()[-1]
    assert rules_for("0.47.0", "0.19.2").fix_applies
    for says in ("nvidia-modelopt==0.47.0", "moe-ckpt-fix", "MOE_CKPT_FIX=1", "allow-to-fail",
                 job.pipeline):
        assert says in step, (says, step)
    _, out = _gate(capsys, NANO, ("0.48.0rc1", "0.19.2"), False)
    step = out.splitlines()[-1]
    assert "nvidia-modelopt==0.48.0rc1" in step and "MOE_CKPT_FIX=1" not in step
    assert not rules_for("0.48.0rc1", "0.19.2").fix_applies
    _, out = _gate(capsys, NANO, ("0.48.0rc1", "0.19.2"), True)
    assert "remove the moe-ckpt-fix wheel and MOE_CKPT_FIX" in out.splitlines()[-1]


def test_one_file_without_the_jobs_cells_points_at_the_committed_records(capsys):
    """A 0.48.0rc1 file that holds none of the jobs' cells (the newest such): the gate says so in
    one line and names the command that judges the pair's committed records, which decide (no
    GPU host needed: the file given came from one)."""
    ids = {c.id for j in (NANO, ULTRA) for cells in verdict.evidence_cells(gate.job_of(j)) for c in cells}
    newest = max((r for r in RAW if {(c["modelopt"], c["mcore"]) for c in r[2]} == {("0.48.0rc1", "0.19.2")}
                  and not ids & {c["cell_id"] for c in r[2]}), key=lambda r: r[1])
    docs = verdict.read_docs([COMMITTED_RUNS / newest[0]])
    assert gate.main(docs, NANO, False) == gate.EXIT_UNDECIDED
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and "none of the 1 results file(s)" in out, out
    assert "GPU host" not in out
    command = out.split("hold them: ", 1)[1].strip()
    assert command == f"python -m harness verdict --job {NANO} --gate --modelopt 0.48.0rc1 --mcore 0.19.2"
    assert expected_verdict(RAW, gate.job_of(NANO), ("0.48.0rc1", "0.19.2")) == verdict.SAFE  # and that command decides


def test_an_unknown_version_is_one_line_exit_4(capsys):
    known = {m for m, _ in PAIRS}
    assert "0.49.0" not in known
    assert gate.main_committed(NANO, "0.49.0", None, False) == gate.EXIT_UNDECIDED
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    assert "no committed record of nvidia-modelopt 0.49.0 + megatron-core 0.19.2" in out
    assert all(m in out for m in known)  # the committed pairs, named
    assert "what would decide" in out


@pytest.mark.parametrize("args, says", [
    (["--job", NANO, "--modelopt", "0.47.0"], "--modelopt needs --gate"),
    (["--job", NANO, "--gate", "--modelopt", "latest"], "--modelopt 'latest' is not a version"),
    (["--job", NANO, "--gate", "--mcore", "0.16.1"], "--mcore needs --modelopt"),
    (["--job", NANO, "--gate", "--modelopt", "0.47.0", "--results",
      str(COMMITTED_RUNS / "20261204-023144-repro-gpu-new.results.json")], "not both"),
])
def test_usage_is_one_line_exit_2(args, says):
    from tests.helpers import bounded

    r = bounded([sys.executable, "-W", "ignore", "-m", "harness", "verdict", *args], 300, cwd=REPO_ROOT)
    assert r.returncode == gate.EXIT_USAGE, (r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_help_documents_the_exit_codes():
    from tests.helpers import bounded

    r = bounded([sys.executable, "-W", "ignore", "-m", "harness", "verdict", "--help"], 300,
                cwd=REPO_ROOT)
    assert r.returncode == 0
    codes = r.stdout.split("exit codes:", 1)[1].splitlines()
    for code, word in ((0, "SAFE"), (1, "UNEXPECTED FAILURE"), (2, "usage"), (3, "BLOCKED"),
                       (4, "nothing decides")):
        assert any(line.strip().startswith(f"{code} ") and word in line for line in codes), r.stdout
    assert "--modelopt" in r.stdout and "--mcore" in r.stdout
