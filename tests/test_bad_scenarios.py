"""Bad scenario files: each is refused with one line naming the file, the key and the constraint,
and is skipped without hiding the good files.

Why: a typo such as ``safes = [...]`` used to give a scenario with no cells, ``saves = "tp1"`` was
read one character at a time, and one bad file (or one damaged golden) stopped the whole pytest
collection, so ``make test`` ran nothing. Goldens are copied into tmp_path before being damaged;
the committed ones are hashed before and after this module to prove nothing touched them.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from harness.golden.manifest import read_manifest, sha256, write_manifest
from harness.paths import GOLDEN_DIR, REPO_ROOT, SCENARIO_DIR
from harness.scenario.scenarios import (NOT_SCENARIOS, ScenarioError, load_all,
                                        load_all_with_errors, load_scenario)
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

GOOD = SCENARIO_DIR / "cpu_reshard.toml"  # a real scenario file: the good neighbour of every bad one
GOLDEN = "modelopt-0.47.0-tp1-etp1-ep8"
CPU = 'tier = "cpu"\nbackend = "local"\n'
SAVES = 'saves = ["tp1-etp1-ep1"]\n'
GOLDEN_BODY = f'tier = "gpu-shared"\nbackend = "te"\ngoldens = ["{GOLDEN}"]\nloads = ["tp1-etp1-ep1"]\n'


def _hashes() -> dict[str, str]:
    return {p.relative_to(GOLDEN_DIR).as_posix(): sha256(p)
            for p in sorted(GOLDEN_DIR.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", autouse=True)
def committed_goldens_untouched():
    before = _hashes()
    assert before, f"no golden files under {GOLDEN_DIR}"
    yield
    assert _hashes() == before, "a test changed a committed golden file under tests/golden"


@pytest.fixture
def golden_dir(tmp_path) -> Path:
    """A private copy of one committed golden, free to damage."""
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR / GOLDEN, root / GOLDEN)
    return root


def _corrupt_manifest(root: Path) -> None:
    (root / GOLDEN / "manifest.json").write_text('{"schema": 1, "name": ')


def _damage_metadata(root: Path) -> None:
    md = root / GOLDEN / "ckpt" / ".metadata"
    data = bytearray(md.read_bytes())
    data[8:48] = b"\xff" * 40
    md.write_bytes(bytes(data))


BAD = [  # id, file body, damage to the golden copy, words the one line must hold
    ("impossible-topology", CPU + 'saves = ["tp1-etp1-ep3"]\n', None,
     ["saves[0]: topology tp1-etp1-ep3-pp1 cannot run", "num_experts 8 is not divisible by ep 3"]),
    ("missing-tier", 'backend = "local"\n' + SAVES, None, ["tier: required key missing"]),
    ("toml-syntax", CPU + 'saves = ["tp1-etp1-ep1"\n', None, ["invalid TOML"]),
    ("unknown-key", CPU + 'safes = ["tp1-etp1-ep1"]\n', None,
     ["safes: unknown key", "did you mean 'saves'?"]),
    ("tier-tpu", 'tier = "tpu"\nbackend = "local"\n' + SAVES, None,
     ["tier: 'tpu' is not one of cpu, gpu-shared, gpu"]),
    ("patch-fixed", CPU + 'patch = "fixed"\n' + SAVES, None, ["patch: 'fixed' is not one of none, fix"]),
    ("backend-locl", 'tier = "cpu"\nbackend = "locl"\n' + SAVES, None,
     ["backend: 'locl' is not one of te, local"]),
    ("expect-bad", CPU + 'expect = "fail"\n' + SAVES, None, ["expect: 'fail' is not one of pass, oracle"]),
    ("saves-string", CPU + 'saves = "tp1"\n', None, ["saves: expected an array, got string 'tp1'"]),
    ("timeout-string", CPU + SAVES + 'stage_timeout_s = "fast"\n', None,
     ["stage_timeout_s: expected a number, got string 'fast'"]),
    ("timeout-negative", CPU + SAVES + "stage_timeout_s = -1\n", None, ["stage_timeout_s: must be > 0"]),
    ("known-gap-key", CPU + SAVES + '[[known_gaps]]\npatern = "*._amax"\nreason = "r"\n', None,
     ["known_gaps[0].patern: unknown key", "did you mean 'pattern'?"]),
    ("known-gap-string", CPU + SAVES + 'known_gaps = ["*._amax"]\n', None,
     ["known_gaps[0]: expected a table, got string"]),
    ("model-key", CPU + SAVES + "[model]\nhidden_sise = 128\n", None,
     ["model.hidden_sise: unknown key", "did you mean 'hidden_size'?"]),
    ("model-value", CPU + SAVES + '[model]\nnum_experts = "8"\n', None,
     ["model.num_experts: expected an integer, got string '8'"]),
    # megatron-core's and ModelOpt's own rules on (size, topology), refused before any rank runs
    # (the same rules against the packages: tests/test_size_rules_mcore.py)
    ("moe-ffn-vs-etp", CPU + 'saves = ["tp1-etp4-ep1"]\n[model]\nmoe_ffn_hidden_size = 66\n', None,
     ["saves[0]: topology tp1-etp4-ep1-pp1 cannot run", "moe_ffn_hidden_size 66 is not divisible by etp 4"]),
    ("heads-vs-tp", CPU + 'saves = ["tp4-etp1-ep1"]\n[model]\nnum_attention_heads = 6\nhidden_size = 96\n',
     None, ["saves[0]: topology tp4-etp1-ep1-pp1 cannot run", "num_attention_heads 6 is not divisible by tp 4"]),
    ("vocab-vs-tp", CPU + 'saves = ["tp2-etp1-ep1"]\n[model]\nvocab_size = 129\n', None,
     ["saves[0]: topology tp2-etp1-ep1-pp1 cannot run", "vocab_size 129 is not divisible by tp 2"]),
    ("layers-vs-pp", CPU + SAVES + 'loads = ["tp1-etp1-ep1-pp2"]\n[model]\nnum_layers = 3\n', None,
     ["loads[0]: topology tp1-etp1-ep1-pp2 cannot run", "num_layers 3 is not divisible by pp 2"]),
    ("hidden-vs-heads", CPU + 'saves = ["tp4-etp1-ep1"]\n[model]\nhidden_size = 66\n', None,
     ["model: hidden_size 66 is not divisible by num_attention_heads 4", "kv_channels to 16"]),
    ("topk-over-experts", CPU + SAVES + "[model]\nmoe_router_topk = 9\n", None,
     ["model: moe_router_topk 9 is more than num_experts 8"]),
    ("topk-1", CPU + SAVES + "[model]\nmoe_router_topk = 1\n", None,
     ["model: moe_router_topk 1 is refused by megatron-core"]),
    ("tp-and-ep-local", CPU + 'saves = ["tp2-etp1-ep2"]\n', None,
     ["saves[0]: topology tp2-etp1-ep2-pp1 cannot run", "QuantSequentialMLP (backend local) refuses TP > 1 with EP > 1"]),
    ("pp2-save-on-cpu", CPU + 'saves = ["tp1-etp1-ep2-pp2"]\n', None,
     ["saves[0]: tp1-etp1-ep2-pp2: a save at pp > 1", "receive buffers on CUDA",
      "tiers gpu-shared and gpu only"]),
    ("no-cells", CPU + 'loads = ["tp1-etp1-ep1"]\n', None, ["saves: required", "no cells"]),
    # a pair is [save, load]: one topology alone is refused, never dropped (the file then has
    # no cell of it, and would run without saying so)
    ("pair-of-one", CPU + SAVES + 'pairs = [["tp1-etp1-ep2"]]\n', None,
     ["pairs[0]: expected [save, load], got ['tp1-etp1-ep2']"]),
    ("saves-and-goldens", GOLDEN_BODY + SAVES, None, ["either saves or goldens"]),
    ("golden-missing", GOLDEN_BODY.replace(GOLDEN, "no-such-golden"), None,
     ["goldens[0]: golden 'no-such-golden' not found"]),
    ("golden-manifest-corrupt", GOLDEN_BODY, _corrupt_manifest,
     [f"goldens[0]: golden '{GOLDEN}'", "manifest.json: not valid JSON"]),
    ("golden-metadata-damaged", GOLDEN_BODY, _damage_metadata,
     [f"goldens[0]: golden '{GOLDEN}'", "file ckpt/.metadata changed"]),
]


def _one_line(exc: ScenarioError, path: Path, words: list[str]) -> None:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    assert text.startswith(f"{path}: "), text
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("body, damage, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_file_is_one_line_and_skipped(tmp_path, golden_dir, body, damage, words, capsys):
    if damage:
        damage(golden_dir)
    d = tmp_path / "scenarios"
    d.mkdir()
    shutil.copy(GOOD, d / GOOD.name)
    bad = d / "bad.toml"
    bad.write_text(body)
    with pytest.raises(ScenarioError) as info:
        load_scenario(bad, golden_dir)
    _one_line(info.value, bad, words)
    assert info.value.path == bad

    good, errors = load_all_with_errors(d, golden_dir)
    assert [s.name for s in good] == ["cpu-reshard"] and good[0].cells()
    assert [str(e) for e in errors] == [str(info.value)]
    assert [s.name for s in load_all(d, golden_dir)] == ["cpu-reshard"]  # never raises
    assert capsys.readouterr().err.count(str(info.value)) == 1


def test_undamaged_golden_copy_loads(tmp_path, golden_dir):
    """The golden cases above fail because of the damage, not because of the copy."""
    p = tmp_path / "ok.toml"
    p.write_text(GOLDEN_BODY)
    s = load_scenario(p, golden_dir)
    assert [c.id for c in s.cells()] == [f"ok[golden={GOLDEN},load=tp1-etp1-ep1-pp1]"]


def test_duplicate_name_both_files_are_bad(tmp_path, capsys):
    """Neither file of a reused name runs in place of the other, whichever sorts first."""
    shutil.copy(GOOD, tmp_path / GOOD.name)
    dup = tmp_path / "zz_copy.toml"  # sorts after cpu_reshard.toml
    dup.write_text('name = "cpu-reshard"\n' + CPU + SAVES)
    good, errors = load_all_with_errors(tmp_path)
    assert good == [] and len(errors) == 2
    _one_line(errors[0], tmp_path / GOOD.name, [f"name: 'cpu-reshard' is also used by {dup}"])
    _one_line(errors[1], dup, [f"name: 'cpu-reshard' is also used by {tmp_path / GOOD.name}"])
    load_all(tmp_path)
    load_all(tmp_path)
    assert capsys.readouterr().err.count(str(errors[1])) == 1  # once per process


def test_unreadable_golden_metadata_under_an_intact_manifest(tmp_path, golden_dir):
    """Bytes that match a (re-written) manifest but do not unpickle: one line, no traceback."""
    _damage_metadata(golden_dir)
    doc = read_manifest(golden_dir / GOLDEN)
    write_manifest(golden_dir / GOLDEN, topology=doc["topology"], made_by="test", size=doc["size"],
                   versions=doc["versions"])
    p = tmp_path / "witness.toml"
    p.write_text(GOLDEN_BODY)  # unpatched: the expectation reads the golden's layout
    cell = load_scenario(p, golden_dir).cells()[0]
    with pytest.raises(ScenarioError) as info:
        cell.expected
    _one_line(info.value, p, [f"golden '{GOLDEN}': checkpoint metadata unreadable"])


def test_real_scenarios_have_no_errors():
    good, errors = load_all_with_errors()
    assert errors == [] and len(good) == len(
        [p for p in SCENARIO_DIR.glob("*.toml") if p.name not in NOT_SCENARIOS])


def test_pytest_collects_the_good_cells_and_one_error_item_per_bad_file(tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    shutil.copy(GOOD, d / GOOD.name)
    (d / "bad.toml").write_text('tier = "tpu"\nbackend = "local"\n' + SAVES)
    results = tmp_path / "results"
    env = {**os.environ, "HARNESS_SCENARIO_DIR": str(d)}
    env.pop("PYTEST_ADDOPTS", None)
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
            "--results-root", str(results), "tests/test_cells.py"]

    r = bounded([*base, "--collect-only"], 300, cwd=REPO_ROOT, env=env)
    ids = [line for line in r.stdout.splitlines() if line.startswith("tests/test_cells.py::")]
    assert r.returncode == 0, r.stdout + r.stderr
    assert [i for i in ids if "scenario-file" in i] == [
        "tests/test_cells.py::test_cell[scenario-file[bad.toml]]"]
    assert len([i for i in ids if "[cpu-reshard[" in i]) == 5, r.stdout
    assert not results.exists() or not any(results.iterdir())  # --collect-only makes no run dir

    r = bounded([*base, "-k", "scenario-file"], 300, cwd=REPO_ROOT, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 error" in r.stdout and "Traceback" not in r.stdout, r.stdout
    assert f"{d / 'bad.toml'}: tier: 'tpu' is not one of cpu, gpu-shared, gpu" in r.stdout, r.stdout
    assert not results.exists() or not any(results.iterdir())


def test_pp2_save_is_a_cell_on_gpu_shared(tmp_path):
    """Tier gpu-shared sends pipeline activations through host memory (harness/model/host_p2p.py),
    so a pp > 1 save is a valid cell there; only the cpu tier refuses it."""
    path = tmp_path / "pp2.toml"
    path.write_text('tier = "gpu-shared"\nbackend = "te"\nsaves = ["tp1-etp1-ep2-pp2"]\n'
                    'loads = ["tp1-etp1-ep2"]\n')
    scenario = load_scenario(path)
    assert [t.id for t in scenario.saves] == ["tp1-etp1-ep2-pp2"]


def test_logits_reference_is_one_of_the_known_modes(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(CPU + SAVES + 'logits_reference = "load"\n')
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert "logits_reference: 'load' is not one of save-topology, load-topology" in str(exc.value)
