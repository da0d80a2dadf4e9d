"""The witness of the bug in the run's report, on every tier: summary.md names it and its failing
key, and grid.png numbers its square and names the key in its caption.

Read from committed runs: a GPU repro (its witness cells reproduce the collision at save and at
load) and a cpu repro (tests/data/repro-cpu.results.json: `python -m harness repro` on a 2-core
machine without a GPU, run 20261206-175213-repro-cpu; its cells cannot collide, TP = ETP, and
its witness is the real validation probe, recorded in results.json's ``probes``). The picture
is checked through what matplotlib drew: each square's word and colour index, and the caption.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.check.probes import judge_probe
from harness.paths import RunDir
from harness.records import Outcome, ProbeRecord, ProbeRule
from harness.report.picture import grid_figure, outside_figure, write_report
from harness.report.summary import CATEGORIES, category
from harness.run.results import collect, exit_code, write_probes

pytestmark = pytest.mark.cpu

RUNS = Path(__file__).parent / "data" / "runs"
GPU_REPRO = RUNS / "20261203-101526-repro-gpu.results.json"
CPU_REPRO = RUNS.parent / "repro-cpu.results.json"
COLLISION_KEY = "decoder.layers.0.mlp.experts.experts.{}.linear_fc1.weight_quantizer._amax"


def _report(src: Path, tmp_path: Path) -> tuple[str, dict]:
    """summary.md as `harness report` writes it beside a copy of ``src``; and the document."""
    run = tmp_path / src.name.removesuffix(".results.json")
    run.mkdir()
    shutil.copy(src, run / "results.json")
    write_report(run / "results.json")
    assert (run / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return (run / "summary.md").read_text(), json.loads(src.read_text())


def _drawn(doc: dict) -> tuple[dict, str]:
    """{(panel title, row, column): (square text, colour index)} and the caption, as drawn."""
    import matplotlib.pyplot as plt

    fig = grid_figure(doc)
    fig.canvas.draw()
    try:
        assert outside_figure(fig) == []
        squares = {}
        for ax in fig.axes:
            if not ax.get_visible() or not ax.images:
                continue
            rows = [t.get_text() for t in ax.get_yticklabels()]
            cols = [t.get_text() for t in ax.get_xticklabels()]
            colour = ax.images[0].get_array()
            for t in ax.texts:
                j, i = t.get_position()
                squares[(ax.get_title(), rows[i], cols[j])] = (t.get_text(), int(colour[i][j]))
        caption = "\n".join(t.get_text() for t in fig.texts if "THE BUG" in t.get_text())
        return squares, caption
    finally:
        plt.close(fig)


BUG = category(Outcome.BUG_REPRODUCED)
PASS = category(Outcome.PASS)


def test_the_gpu_repro_names_its_witness_cells_and_their_key(tmp_path):
    summary, doc = _report(GPU_REPRO, tmp_path)
    section = summary.split("## The bug, reproduced: 2 witness(es)", 1)[1].split("\n| ", 1)[0]
    load, save = [line for line in section.splitlines() if line.startswith("- [")]
    assert load.startswith("- [1] `gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]` "
                           "(tier gpu-shared, patch none): load failed as expected (fail-load): "
                           "CheckpointingException (rank 0)")
    assert save.startswith("- [2] `gpu-witness[save=tp4-etp1-ep8-pp1,save-only]`")
    assert "save failed as expected (fail-save)" in save
    assert all(f"key `{COLLISION_KEY.format(1)}`" in line for line in (load, save))

    squares, caption = _drawn(doc)
    unpatched = "tier gpu-shared, patch none\nrecipe NVFP4_DEFAULT_CFG"
    assert squares[(unpatched, "tp1-etp1-ep8-pp1", "tp4-etp1-ep8-pp1")] == ("BUG\n[1]", BUG)
    assert squares[(unpatched, "tp4-etp1-ep8-pp1", "(save only)")] == ("BUG\n[2]", BUG)
    assert squares[(unpatched, "tp1-etp1-ep8-pp1", "(save only)")] == ("PASS", PASS)
    fixed = "tier gpu-shared, patch fix\nrecipe NVFP4_DEFAULT_CFG"
    assert squares[(fixed, "tp4-etp1-ep8-pp1", "tp4-etp1-ep8-pp1")] == ("PASS", PASS)
    assert "[1] gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]" in caption
    assert caption.splitlines().count(f"     key {COLLISION_KEY.format(1)}") == 2


def test_the_cpu_repro_names_its_validation_witness_and_key(tmp_path):
    """The cpu picture used to be five green cells: the collision was only in the terminal."""
    summary, doc = _report(CPU_REPRO, tmp_path)
    assert doc["tier"] == "cpu" and {c["outcome"] for c in doc["cells"]} == {Outcome.PASS}
    witness = next(p for p in doc["probes"] if p["outcome"] == Outcome.BUG_REPRODUCED)
    assert (witness["topology"], witness["rule"]) == ("tp2-etp1-ep2-pp1", ProbeRule.BUGGY)
    key = witness["failing_key"]
    assert key.endswith(".weight_quantizer._amax") and ".experts.experts." in key

    assert "- validation probes: 8 (2 bug-reproduced, 6 pass)" in summary
    first = next(line for line in summary.splitlines() if line.startswith("- [1] "))
    assert first.startswith("- [1] `real validation at tp2-etp1-ep2-pp1, 2 gloo ranks` (per-expert "
                            "amax as ModelOpt 0.47.0 builds it): megatron-core's "
                            "validate_sharding_integrity raised CheckpointingException on ")
    assert f"main replicas 0, not 1; key `{key}`" in first
    row = next(line for line in summary.splitlines()
               if line.startswith("| tp2-etp1-ep2-pp1 | ModelOpt 0.47.0 |"))
    assert f"| bug-reproduced | CheckpointingException on " in row and f"first `{key}`" in row
    assert "| tp2-etp1-ep2-pp1 | the fix | pass | valid |" in summary

    squares, caption = _drawn(doc)
    probes = next(t for t, *_ in squares if t.startswith("real megatron-core validation"))
    assert squares[(probes, "tp2-etp1-ep2-pp1", "built as ModelOpt 0.47.0")] == ("BUG\n[1]", BUG)
    assert squares[(probes, "tp1-etp2-ep1-pp1", "built as ModelOpt 0.47.0")] == ("BUG\n[2]", BUG)
    assert squares[(probes, "tp2-etp1-ep2-pp1", "built as the fix")] == ("PASS", PASS)
    cells = [v for (t, *_), v in squares.items() if t.startswith("tier cpu")]
    assert cells and set(cells) == {("PASS", PASS)}
    assert "[1] real validation at tp2-etp1-ep2-pp1, 2 gloo ranks" in caption
    assert f"     key {key}" in caption.splitlines()


def test_a_picture_numbers_only_the_witnesses_its_caption_lists(tmp_path):
    """The unpatched grid (16 bug-reproduced cells): four are numbered and named, the collision's
    first, and the caption says where the rest are."""
    doc = json.loads((RUNS / "20261202-122731-witness.results.json").read_text())
    squares, caption = _drawn(doc)
    numbered = sorted(text for text, colour in squares.values() if "[" in text)
    assert numbered == ["BUG\n[1]", "BUG\n[2]", "BUG\n[3]", "BUG\n[4]"]
    assert sum(colour == BUG for _, colour in squares.values()) == 16
    assert "... and 12 more bug-reproduced: summary.md" in caption
    assert "(fail-save)" in caption.splitlines()[1] or "(fail-load)" in caption.splitlines()[1]


ERROR = ("CheckpointingException: Invalid sharding pattern validation. Errors: Invalid access "
         "pattern for ShardedTensor(key='{}', dtype=torch.float32, local_shape=(1,), "
         "global_shape=(1,), replica_id=(0, 1, 0)): tensor([0], dtype=torch.int32)\nInvalid access "
         "pattern for ShardedTensor(key='other', ...): tensor([0], dtype=torch.int32)")


@pytest.mark.parametrize("topology, rule, error, outcome", [
    ("tp2-etp1-ep2-pp1", ProbeRule.BUGGY, ERROR, Outcome.BUG_REPRODUCED),
    ("tp2-etp1-ep2-pp1", ProbeRule.BUGGY, None, Outcome.UNEXPECTED_PASS),
    ("tp2-etp1-ep2-pp1", ProbeRule.FIXED, None, Outcome.PASS),
    ("tp2-etp1-ep2-pp1", ProbeRule.FIXED, ERROR, Outcome.UNEXPECTED_FAILURE),
    ("tp1-etp1-ep2-pp1", ProbeRule.BUGGY, None, Outcome.PASS),
])
def test_a_probe_is_judged_against_the_oracle(topology, rule, error, outcome):
    key = COLLISION_KEY.format(4)
    r = judge_probe(topology, rule, 2, error.format(key) if error else None)
    assert r.outcome == outcome
    if error:
        assert (r.exception_type, r.failing_key, r.failing_keys, r.main_replicas) == (
            "CheckpointingException", key, 2, 0)


def test_probes_reach_results_json_and_its_exit_code(tmp_path):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    probes = [ProbeRecord("tp2-etp1-ep2-pp1", ProbeRule.BUGGY, 2, Outcome.BUG_REPRODUCED),
              ProbeRecord("tp2-etp1-ep2-pp1", ProbeRule.FIXED, 2, Outcome.PASS)]
    write_probes(probes, run)
    doc = collect(run, {"nvidia-modelopt": "0.47.0"}, tier="cpu")
    assert json.loads(run.results.read_text())["probes"] == [p.as_dict() for p in probes]
    assert exit_code(doc) == 0
    write_probes([*probes, ProbeRecord("tp1-etp1-ep2-pp1", ProbeRule.BUGGY, 2,
                                       Outcome.UNEXPECTED_FAILURE)], run)
    assert exit_code(collect(run, {}, tier="cpu")) == 1
    assert CATEGORIES[category(Outcome.BUG_REPRODUCED)][2] == "BUG"
