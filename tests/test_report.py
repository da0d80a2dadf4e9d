"""Report views on a small hand-written results.json (tests/data/report_results.json): the
table names every cell and its cause, the grid picture is a real PNG, the progress line reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report.summary import (
    CATEGORIES,
    category,
    cause,
    cell_seconds,
    markdown_summary,
    progress_line,
)
from harness.report.picture import write_grid_png

pytestmark = pytest.mark.cpu

FIXTURE = Path(__file__).parent / "data" / "report_results.json"


@pytest.fixture
def results() -> dict:
    return json.loads(FIXTURE.read_text())


def test_summary_header(results):
    md = markdown_summary(results)
    assert md.startswith("# moe-ckpt-harness run `20261002-0300-fixture`")
    assert "- date: 2026-10-02T03:00:00+00:00" in md
    assert "nvidia-modelopt 0.47.0" in md and "megatron-core 0.19.2" in md
    assert "- tier: gpu-shared" in md
    assert "2 bug-reproduced" in md and "1 unexpected-failure" in md


def test_summary_table_rows(results):
    md = markdown_summary(results)
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert header == ("| save topology | load topology | tier | patch | recipe | outcome | cause | "
                      "seconds |")
    assert len(body) == len(results["cells"])
    # Worst first: the regression is at the top, plain passes at the bottom.
    assert "unexpected" in body[0] and body[-1].split(" | ")[5] == "pass"
    # Records made before the recipe axis ran the default recipe, and say so.
    assert all(r.split(" | ")[4] == "NVFP4_DEFAULT_CFG" for r in body)
    bug = next(r for r in body if "(save only)" in r and "bug-reproduced" in r)
    assert "save: CheckpointingException: Invalid sharding pattern validation." in bug
    assert "weight_quantizer._amax" in bug and "(rank 0)" in bug and "| 33.5 |" in bug
    assert any("needs 8 GPUs for tier gpu, 2 visible" in r for r in body)
    # A pipe inside a message must not split the row.
    piped = next(r for r in body if "count tensor([2])" in r)
    assert "\\|" in piped and piped.count(" | ") == 7


def test_cause_and_seconds():
    assert cause({"outcome": "pass"}) == ""
    assert cause({"outcome": "skipped", "reason": "no GPU\nmore"}) == "no GPU"
    assert cause({"outcome": "unexpected-pass", "expected": "fail-load"}) == "expected fail-load, passed"
    assert cell_seconds({"durations": {"save_stage": 1.5, "load_stage": 2.0, "imports": 9}}) == 3.5
    assert cell_seconds({"durations": {"build": 1.0, "save": 2.0}}) == 3.0
    assert cell_seconds({}) == 0.0


def test_every_outcome_has_its_category():
    from harness.records import OUTCOMES

    labels = [c[1] for c in CATEGORIES]
    assert {o for outcomes, *_ in CATEGORIES for o in outcomes} == set(OUTCOMES)
    assert CATEGORIES[category("interrupted")][1].startswith("interrupted")  # not a failure
    assert {"pass", "blocked", "skipped", "bug reproduced as expected"} <= set(labels)
    assert CATEGORIES[category("bug-reproduced")][1] == "bug reproduced as expected"
    assert category("unexpected-failure") == category("unexpected-pass") == category("???")


def test_grid_png(results, tmp_path):
    out = tmp_path / "grid.png"
    write_grid_png(results, str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000


def test_grid_png_empty_and_save_only(tmp_path):
    write_grid_png({"run_id": "empty", "cells": []}, str(tmp_path / "empty.png"))
    one = {"cells": [{"save_topology": "tp2-etp1-ep2-pp1", "load_topology": None,
                      "tier": "cpu", "patch": "none", "outcome": "pass"}]}
    write_grid_png(one, str(tmp_path / "one.png"))
    assert (tmp_path / "empty.png").stat().st_size > 0 and (tmp_path / "one.png").stat().st_size > 0


def test_progress_line():
    assert progress_line(12, 40, 2, 65.3) == "[12/40  30%] 2 failed, 1m05s elapsed, ~2m32s left"
    assert progress_line(0, 8, 0, 3.0) == "[0/8   0%] 0 failed, 0m03s elapsed, estimating"
    assert progress_line(8, 8, 1, 3725.0) == "[8/8 100%] 1 failed, 1h02m05s elapsed, done"


@pytest.mark.parametrize("cells", [1, 3, pytest.param(30, marks=pytest.mark.slow)])  # 30: more of the same texts
def test_the_grid_picture_keeps_every_text_inside(results, cells):
    """Title, legend, ticks and squares lie inside the figure at any grid size and tier: nothing
    is clipped off the PNG (the cpu picture used to lose its title and legend on both sides)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.report.picture import grid_figure, outside_figure

    doc = dict(results)
    base = results["cells"]
    doc["cells"] = [dict(base[i % len(base)], save_topology=f"tp1-etp1-ep{1 + i % 7}-pp1",
                         load_topology=f"tp{1 + i % 3}-etp1-ep2-pp1") for i in range(cells)]
    doc["versions"] = {**doc.get("versions", {}), "a-long-package-name": "1.2.3" * 8}
    fig = grid_figure(doc)
    fig.canvas.draw()
    try:
        assert outside_figure(fig) == []
    finally:
        plt.close(fig)
