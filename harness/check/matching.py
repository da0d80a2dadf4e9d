"""The amax kinds ModelOpt's own matching configures for each recipe of its library, per ModelOpt
release: the forecast ``python -m harness recipes`` computes (harness/rank/recipe_survey.py
``configured_kinds``: ModelOpt's ``set_quantizer_by_cfg`` on the cpu tier's model), written by that
command to ``harness/check/forecasts/modelopt-<release>.json`` and read here. Generated, never kept
by hand: run the command under another release to add its file.

Why: a record whose save died before its ranks recorded the amax kinds (a stage that died before
calibration ended, or a record written before the ranks recorded kinds at all) still has a recipe,
and ModelOpt's own matching says what that recipe puts in a checkpoint. The hand catalogue
(harness/check/recipes.py) knows a few recipes; this file knows every one the library ships.
Judging starts no process (tests/test_architecture.py): a release without its file here forecasts
nothing, and the reason says so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from harness.check.release import release
from harness.jsonfile import read_json, write_json_atomic
from harness.model.recipes import EXPERTS
from harness.paths import REPO_ROOT, shown_path

FORECAST_DIR = REPO_ROOT / "harness" / "check" / "forecasts"
MAKER = "python -m harness recipes"


def forecast_file(modelopt: str, root: Path | None = None) -> Path:
    return (root or FORECAST_DIR) / f"modelopt-{release(modelopt)}.json"


@dataclass(frozen=True)
class Matched:
    """ModelOpt's matching for one recipe under one release: the kinds per family it configures
    (None: none for the routed experts), and otherwise why, in words."""

    kinds: dict[str, list[str]] | None
    why: str | None = None


@functools.lru_cache(maxsize=None)
def _rows(path: Path) -> dict[str, dict] | None:
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), dict):
        return None
    return doc["rows"]


def matched(ref: str, modelopt: str | None, families: tuple[str, ...] | None = None,
            root: Path | None = None) -> Matched:
    """What ModelOpt ``modelopt``'s own matching forecasts for ``ref`` on a model with ``families``
    (None: every family the forecast names)."""
    if not modelopt:
        return Matched(None, "the ModelOpt release is not known, so neither is its matching")
    path = forecast_file(modelopt, root)
    where = f"{shown_path(path)}, written by `{MAKER}`"
    rows = _rows(path)
    if rows is None:
        return Matched(None, f"ModelOpt {release(modelopt)}'s own matching was not computed here "
                             f"(no {where})")
    row = rows.get(ref)
    if row is None:
        return Matched(None, f"ModelOpt {release(modelopt)}'s library has no recipe {ref} ({where})")
    kinds = {f: list(k) for f, k in sorted((row.get("forecast") or {}).items())
             if families is None or f in families}
    if EXPERTS not in kinds:
        said = row.get("left_out") or "it configures no routed-expert weight quantizer"
        return Matched(None, f"ModelOpt {release(modelopt)}'s own matching gives the routed "
                             f"experts no kind: {said} ({where})")
    return Matched(kinds)


def library(modelopt: str, root: Path | None = None) -> list[str]:
    """Every recipe of ModelOpt ``modelopt``'s library whose own matching gives the routed experts
    a kind, sorted (what ``harness sample --library`` draws from); ValueError, in one line, where
    the release's forecast file was not computed here."""
    rows = _rows(forecast_file(modelopt, root))
    if rows is None:
        raise ValueError(f"no forecast of ModelOpt {release(modelopt)}'s library "
                         f"({shown_path(forecast_file(modelopt, root))}; run `{MAKER}` under it)")
    return sorted(ref for ref, row in rows.items() if EXPERTS in (row.get("forecast") or {}))


def write(doc: dict, root: Path | None = None) -> Path:
    """The survey's document (harness/rank/recipe_survey.py ``main``) as the forecast file of its
    release: per recipe, its forecast kinds or why it is left out."""
    rows = {r["recipe"]: ({"forecast": r["forecast"]} if "forecast" in r else {"left_out": r.get("left_out", "")})
            for r in doc["rows"]}
    path = forecast_file(doc["modelopt"], root)
    write_json_atomic(path, {"generated_by": MAKER, "modelopt": doc["modelopt"], "model": doc["model"],
                             "rows": dict(sorted(rows.items()))}, sort_keys=False)
    _rows.cache_clear()
    return path
