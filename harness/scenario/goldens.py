"""Committed golden checkpoints as a scenario's save side: each verified against its manifest
before anything reads it in place (tests/golden/<name>/).

Why: a damaged golden must be named at collection, as one line for the file that names it,
not unpickled halfway through a load stage.
"""
from __future__ import annotations

import functools
from pathlib import Path

from harness.check.layouts import GoldenLayout, golden_layout_of
from harness.golden.manifest import GoldenError, verify_manifest
from harness.paths import GOLDEN_DIR
from harness.scenario.schema import ScenarioError
from harness.topology.topology import Topology, TopologyError


@functools.lru_cache(maxsize=None)
def _verified(golden_dir: Path) -> tuple[dict | None, str]:
    """(manifest, "") or (None, problem); hashing every file is done once per process and path."""
    try:
        return verify_manifest(golden_dir), ""
    except Exception as exc:  # noqa: BLE001 - GoldenError, or a manifest of the wrong shape
        if isinstance(exc, GoldenError):
            return None, str(exc)
        return None, f"manifest.json unreadable ({type(exc).__name__}: {exc})"


def golden_manifest(name: str, golden_dir: Path = GOLDEN_DIR) -> dict:
    """The golden's manifest, after every file was checked against it (ScenarioError if not)."""
    d = Path(golden_dir) / name
    if not (d / "manifest.json").is_file():
        raise ScenarioError(f"golden {name!r} not found under {golden_dir} (no manifest.json)")
    doc, problem = _verified(d.resolve())
    if problem:
        raise ScenarioError(f"golden {name!r}: {problem.removeprefix(f'{name}: ')}")
    return doc


def golden_topology(name: str, golden_dir: Path = GOLDEN_DIR) -> Topology:
    text = golden_manifest(name, golden_dir).get("topology")
    try:
        return Topology.parse(text if isinstance(text, str) else repr(text))
    except TopologyError as exc:
        raise ScenarioError(f"golden {name!r}: manifest.json topology: {exc}") from None


@functools.lru_cache(maxsize=None)
def golden_layout(name: str, golden_dir: Path = GOLDEN_DIR) -> str:
    """complete | shared | incomplete, from the golden's metadata (python -m harness inspect).

    Unpatched 0.47.0 cannot restore a shared (<= 0.46) or incomplete checkpoint: those cells
    expect ``not-restored`` (the load raises, or the loaded state differs from the checkpoint).
    Read only after the manifest verified, so damaged bytes are named, not unpickled.
    """
    golden_manifest(name, golden_dir)
    from harness.golden.layout import inspect_checkpoint

    try:
        lay = inspect_checkpoint(Path(golden_dir) / name / "ckpt")
    except Exception as exc:  # noqa: BLE001 - whatever the reader raises, one line for this golden
        raise ScenarioError(f"golden {name!r}: checkpoint metadata unreadable "
                            f"({type(exc).__name__}: {exc})") from None
    return golden_layout_of(lay) or GoldenLayout.INCOMPLETE
