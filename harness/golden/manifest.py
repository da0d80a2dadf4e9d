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

``python -m harness.golden.manifest make <dir> --topology T [--validate-sharding false]`` saves the harness
model and writes the manifest (GPU host; tools/gpu-host/make-golden.sh); ``write`` pins an
existing ``<dir>/ckpt``; ``verify <dir>`` checks it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import shutil
import sys
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


def make(out: Path | str, *, topology: str, validate_sharding: bool, tier: str = "gpu-shared",
         timeout_s: float = 900, notes: str = "") -> Path:
    """Save stage of the harness model at ``topology`` into ``out/ckpt``, then write the manifest.

    GPU host only (tier gpu-shared: TE TEGroupedMLP). The model, seed and calibration are the
    harness defaults (harness.model.gpt / harness.model.quant), so a rerun with the same stack gives the
    same tensors. ``validate_sharding=False`` saves where megatron-core's validation would refuse
    (TP != ETP): the checkpoint then lacks or duplicates some experts' amax (case c).
    """
    from harness.launch.torchrun import run_stage
    from harness.model.gpt import GOLDEN_SIZE
    from harness.rank.spec import StageSpec
    from harness.topology.topology import Topology

    d = Path(out).resolve()
    if (d / "ckpt").exists():
        raise GoldenError(f"{d}/ckpt exists: golden checkpoints are written once")
    topo = Topology.parse(topology)
    size = GOLDEN_SIZE.as_dict()
    spec = StageSpec(stage="save", topology=topo.id, tier=tier,
                     backend="local" if tier == "cpu" else "te", size=size,
                     ckpt_dir=str(d / "ckpt"), reference_dir=str(d / ".work" / "reference"),
                     validate_sharding=validate_sharding)
    spec_path = spec.write(d / ".work" / "spec.json")
    run = run_stage("save", d / ".work", topo.world_size, [str(spec_path)], timeout_s=timeout_s)
    if not run.ok:
        raise GoldenError(f"save stage failed: {run.summary()}")
    cmd = (f"python -m harness.golden.manifest make {d.name} --topology {topo.id} "
           f"--validate-sharding {str(validate_sharding).lower()} --tier {tier}")
    return write_manifest(d, topology=topo.id, made_by=cmd, notes=notes, size=size)


def discover(root: Path | str) -> list[Path]:
    """Golden directories under ``root`` (those holding a manifest.json)."""
    return sorted(p.parent for p in Path(root).glob("*/manifest.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.golden.manifest", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--topology", required=True)
    w.add_argument("--made-by", required=True)
    w.add_argument("--layout", default="")
    w.add_argument("--notes", default="")
    v = sub.add_parser("verify")
    v.add_argument("dir")
    mk = sub.add_parser("make", help="GPU host: save stage + manifest (not run on CPU)")
    mk.add_argument("dir")
    mk.add_argument("--topology", required=True)
    mk.add_argument("--validate-sharding", choices=("true", "false"), default="true")
    mk.add_argument("--tier", default="gpu-shared", choices=("gpu-shared", "gpu", "cpu"))
    mk.add_argument("--notes", default="")
    a = p.parse_args(argv)
    try:
        if a.cmd == "make":
            print(make(a.dir, topology=a.topology, validate_sharding=a.validate_sharding == "true",
                       tier=a.tier, notes=a.notes))
        elif a.cmd == "write":
            print(write_manifest(a.dir, topology=a.topology, made_by=a.made_by, layout=a.layout,
                                 notes=a.notes))
        else:
            doc = verify_manifest(a.dir)
            print(f"{a.dir}: {len(doc['files'])} files verified")
    except GoldenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
