"""Golden checkpoints: a directory with ``ckpt/`` and a ``manifest.json`` that pins every byte.

Why: the regression tests for "an older checkpoint must still load" are only as good as the
checkpoint they load. A manifest records what made it (ModelOpt / megatron-core / TE versions,
topology, command, date) and the sha256 of every file, so a silently changed or truncated golden
file fails loudly, naming the file, instead of turning into a confusing load error. Tests never
open golden files in place: ``copy_to_temp`` verifies and copies first, so nothing a test does can
alter the committed bytes.

Layout of manifest.json: ``Manifest`` below, which validates every manifest written and read;
its JSON Schema (tests/golden/manifest.schema.json) and field table (docs/records.md) are
generated from it (``python -m harness evidence``).

``python -m harness golden make <dir> --topology T [--validate-sharding false]`` saves the harness
model and writes the manifest (GPU host; tools/gpu-host/make-golden.sh); ``write`` pins an
existing ``<dir>/ckpt``; ``verify <dir>`` checks it.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints
from typing_extensions import TypedDict

from harness.records import RecordError, check_record, described

SCHEMA_VERSION = 1
VERSION_KEYS = ("nvidia-modelopt", "megatron-core", "transformer-engine", "torch")
# The versions that made the checkpoint (None: the package was absent); other keys are kept.
Versions = TypedDict("Versions", {k: str | None for k in VERSION_KEYS})
Versions.__pydantic_config__ = {"extra": "allow"}
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
CkptPath = Annotated[str, StringConstraints(pattern=r"^ckpt/")]


@dataclass
class Manifest:
    """A golden's manifest.json, as ``write_manifest`` writes it and ``read_manifest`` accepts it."""

    schema: Literal[1] = described("the manifest format's version (SCHEMA_VERSION)")
    name: str = described("the golden directory's name")
    versions: Versions = described("the stack that made it: nvidia-modelopt, megatron-core, "
                                   "transformer-engine, torch (null: absent), others kept")
    topology: Annotated[str, StringConstraints(pattern=r"^tp\d+-etp\d+-ep\d+(-pp\d+)?(-w\d+)?$")] = \
        described("the topology that saved it (Topology.id)")
    made_by: str = described("the command that wrote the checkpoint")
    date: Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")] = \
        described("the day it was made, YYYY-MM-DD")
    files: Annotated[dict[CkptPath, Sha256], Field(min_length=1)] = \
        described("every file under ckpt/ (`ckpt/<relative path>`) -> its sha256 (hex)")
    layout: str = described("the layout `python -m harness inspect` must find, or empty", default="")
    notes: str = described("how and why it was made", default="")
    size: dict | None = described("the ModelSize fields of the saved model: the model a load stage "
                                  "must build; absent: the default", default=None)


class GoldenError(Exception):
    """A golden checkpoint does not match its manifest (the message names the file)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _ckpt_files(golden_dir: Path) -> dict[str, Path]:
    ckpt = golden_dir / "ckpt"
    return {p.relative_to(golden_dir).as_posix(): p for p in sorted(ckpt.rglob("*")) if p.is_file()}


def installed_versions() -> dict[str, str | None]:
    """Versions of the stack in THIS interpreter (None when a package is absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in VERSION_KEYS:
        candidates = [name] + (["transformer-engine-torch", "transformer_engine"] if name == "transformer-engine" else [])
        out[name] = None
        for c in candidates:
            try:
                out[name] = version(c)
                break
            except PackageNotFoundError:
                continue
    return out


def write_manifest(golden_dir: Path | str, *, topology: str, made_by: str, layout: str = "",
                   versions: dict | None = None, notes: str = "", date: str | None = None,
                   size: dict | None = None) -> Path:
    """Hash every file under ``golden_dir/ckpt`` and write ``golden_dir/manifest.json``."""
    d = Path(golden_dir)
    files = _ckpt_files(d)
    if not files:
        raise GoldenError(f"{d}/ckpt holds no files: nothing to pin")
    doc = {
        "schema": SCHEMA_VERSION,
        "name": d.name,
        "versions": versions if versions is not None else installed_versions(),
        "topology": topology,
        "layout": layout,
        "made_by": made_by,
        "date": date or _dt.date.today().isoformat(),
        "notes": notes,
        **({"size": size} if size else {}),
        "files": {rel: sha256(p) for rel, p in files.items()},
    }
    out = d / "manifest.json"
    try:
        check_record(Manifest, doc, str(out))
    except RecordError as exc:
        raise GoldenError(str(exc)) from None
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return out


def read_manifest(golden_dir: Path | str) -> dict:
    d = Path(golden_dir)
    mf = d / "manifest.json"
    if not mf.is_file():
        raise GoldenError(f"{d}: manifest.json missing")
    try:
        doc = json.loads(mf.read_text())
    except json.JSONDecodeError as exc:
        raise GoldenError(f"{mf}: not valid JSON ({exc})") from exc
    if isinstance(doc, dict) and doc.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise GoldenError(f"{mf}: schema {doc['schema']} (this harness reads {SCHEMA_VERSION})")
    try:
        check_record(Manifest, doc, str(mf))
    except RecordError as exc:
        raise GoldenError(str(exc)) from None
    return doc


def verify_manifest(golden_dir: Path | str) -> dict:
    """Check every listed file's sha256 and that no file was added; returns the manifest.

    Raises GoldenError naming the first changed, missing or unlisted file.
    """
    d = Path(golden_dir)
    doc = read_manifest(d)
    for rel, want in sorted(doc["files"].items()):
        p = d / rel
        if not p.is_file():
            raise GoldenError(f"{d.name}: file {rel} listed in manifest.json is missing")
        got = sha256(p)
        if got != want:
            raise GoldenError(f"{d.name}: file {rel} changed (sha256 {got[:16]}..., "
                              f"manifest says {want[:16]}...)")
    extra = sorted(set(_ckpt_files(d)) - set(doc["files"]))
    if extra:
        raise GoldenError(f"{d.name}: file {extra[0]} is not in manifest.json "
                          f"({len(extra)} unlisted file(s))")
    return doc


def copy_to_temp(golden_dir: Path | str, into: Path | str | None = None) -> Path:
    """Verify, then copy the golden directory to a fresh temp dir; return the copy's path.

    Tests read only the copy (a load that writes, e.g. a lock or cache file, cannot touch the
    committed bytes). The copy is verified again, so a bad copy fails here, not in the test.
    """
    src = Path(golden_dir)
    verify_manifest(src)
    base = Path(tempfile.mkdtemp(prefix=f"golden-{src.name}-", dir=into))
    dst = base / src.name
    shutil.copytree(src, dst)
    verify_manifest(dst)
    return dst


def discover(root: Path | str) -> list[Path]:
    """Golden directories under ``root`` (those holding a manifest.json)."""
    return sorted(p.parent for p in Path(root).glob("*/manifest.json"))
