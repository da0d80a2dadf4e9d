"""Golden checkpoints: a directory with ``ckpt/`` and a ``manifest.json`` that pins every byte.

Why: the regression tests for "an older checkpoint must still load" are only as good as the
checkpoint they load. A manifest records what made it (ModelOpt / megatron-core / TE versions,
topology, command, date) and the sha256 of every file, so a silently changed or truncated golden
file fails loudly, naming the file, instead of turning into a confusing load error. Tests never
open golden files in place: ``copy_to_temp`` verifies and copies first, so nothing a test does can
alter the committed bytes.

Layout of manifest.json (see tests/golden/manifest.schema.json):
    {"schema": 1, "name": str, "versions": {"nvidia-modelopt", "megatron-core",
     "transformer-engine", "torch"}, "topology": "tp1-etp1-ep8-pp1", "layout": "per-expert"|...,
     "made_by": str (the command), "date": "YYYY-MM-DD", "notes": str,
     "size": {ModelSize fields} (optional: the model a load stage must build),
     "files": {"ckpt/<relative path>": "<sha256 hex>", ...}}

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
from pathlib import Path

SCHEMA_VERSION = 1
REQUIRED = ("schema", "name", "versions", "topology", "made_by", "date", "files")
VERSION_KEYS = ("nvidia-modelopt", "megatron-core", "transformer-engine", "torch")


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
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise GoldenError(f"{mf}: missing fields {missing}")
    if doc["schema"] != SCHEMA_VERSION:
        raise GoldenError(f"{mf}: schema {doc['schema']} (this harness reads {SCHEMA_VERSION})")
    absent = [k for k in VERSION_KEYS if k not in doc["versions"]]
    if absent:
        raise GoldenError(f"{mf}: versions lacks {absent}")
    if not doc["files"]:
        raise GoldenError(f"{mf}: lists no files")
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
