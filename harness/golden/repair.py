"""``python -m harness repair SRC DST``: rewrite an old MoE checkpoint so per-expert releases load it complete.

Why: a 0.46.x checkpoint (one shared weight-quantizer amax per grouped linear) loads silently
under 0.47.0 / 0.48.0rc1 with every per-expert amax absent, and a 0.47.0 checkpoint saved at
TP != ETP with validation off (some experts' amax never written) is refused (harness/golden/
forecast.py). Upstream says "re-run PTQ"; this rewrites the checkpoint offline instead, on one
CPU, without building the model:

* every per-expert ``...experts.<e>.<linear>.weight_quantizer._amax`` the checkpoint lacks is
  written, by the rules of harness/check/expect.py (one place): from the grouped linear's shared
  amax (what ModelOpt <= 0.46 applied to every expert of the grouped linear, harness/fix/
  legacy_load.py (d)/(e)), else ``max|W_e|`` of the expert's whole saved weight (all its TP
  shards: the checkpoint holds the global tensor), what max calibration stores;
* the shared amax keys are dropped (no per-expert model asks for them);
* shared layout only: each expert linear's ``_extra_state`` names ONE ``weight_quantizer``;
  0.47.0 / 0.48.0rc1 ``set_extra_state`` look for ``weight_quantizer.<i>`` and fall back to
  ``weight_quantizer.0`` (0.48.0rc1 plugins/megatron.py:297-307, 0.47.0 :255-266), never to the
  bare name, so without a rewrite no expert quantizer gets an ``_amax`` buffer and the amax
  written above would not even be requested. The entry is renamed ``weight_quantizer.0`` (its
  content, the quantizer config, is unchanged: 0.46.1 and 0.47.0 write the same fields);
* everything else is copied: tensors value for value (sha256 of each tensor's bytes checked
  after writing), ``_extra_state``/common objects byte for byte, and every other file
  (``metadata.json``, ``common.pt``, ``modelopt_state/``: its common state holds only the
  quantize config and ModelOpt version, no per-quantizer state, so it needs no rewrite).

Memory: tensors are streamed. Planning uses meta tensors (shapes only); torch DCP's
FileSystemWriter resolves one write item at a time (``_SerialCpuLoader``), each is read from
SRC on demand and its storage freed once written (harness/golden/streamed_save.py), so peak
memory is about one tensor (the largest, twice for a copy) plus the metadata and the small
``_extra_state`` objects (measured: docs/benchmarks.md, "Checkpoint repair"). DST is written
into a sibling temporary directory and renamed into place only after verification: a failed
run leaves no DST. A checkpoint that needs none of the above (per-expert layout, every expert's
weight amax present) is not copied: ``repair`` says "nothing to repair" in one line, exit 0, and
writes no DST (a byte copy would only cost a user the disk and the wait).
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.check.expect import FROM_LEGACY, amax_dtype_of, derived_amax_sources, max_calibrated_amax
from harness.check.layouts import CkptLayout
from harness.check.keys import EXPERT_WEIGHT, SHARED_WEIGHT_AMAX, WEIGHT_AMAX_SUFFIX
from harness.golden.layout import inspect_checkpoint
from harness.golden.storage import DamagedCheckpoint, NotACheckpoint, torch_metadata
from harness.golden.streamed_save import save_streamed

# "<prefix>.experts.experts.<e>.<linear>._extra_state/shard_..." of a TEGroupedMLP expert linear
_EXPERT_EXTRA_STATE = re.compile(
    r"^(?P<prefix>(?:.*\.)?layers\.\d+\.mlp\.experts(?:\.experts)?)\.(?P<expert>\d+)\."
    r"(?P<linear>linear_fc\d)\._extra_state(?:/.*)?$")
PARTIAL = ".repair-partial-"


class RepairError(Exception):
    """The checkpoint cannot be repaired, or DST cannot be written (one line, names the file)."""


class NothingToRepair(Exception):
    """SRC already loads complete on per-expert releases: no DST is written. Not an error (exit 0)."""


@dataclass
class Plan:
    src: Path
    dst: Path
    kind: str
    derived: dict[str, tuple[str, str]]  # new amax key -> (FROM_LEGACY | MAX_CALIBRATED, source)
    dropped: list[str]  # shared amax keys not carried over
    copied: list[str]  # tensor keys copied as they are
    rewritten_objects: list[str]  # _extra_state objects whose weight_quantizer entry is renamed
    copied_objects: list[str]
    files: list[str]  # other files and folders copied byte for byte
    amax_dtype: object = None
    src_bytes: int = 0
    hashes: dict[str, str] = field(default_factory=dict)  # tensor key -> sha256 (SRC, then checked in DST)

    @property
    def needs_nothing(self) -> bool:
        """No amax to write, no shared amax to drop, no ``_extra_state`` to rename."""
        return not (self.derived or self.dropped or self.rewritten_objects)

    def nothing_line(self) -> str:
        present = sum(1 for k in self.copied if k.endswith(WEIGHT_AMAX_SUFFIX)
                      and EXPERT_WEIGHT.match(k[: -len("_quantizer._amax")]))
        return (f"nothing to repair: {self.src} already holds every expert's weight-quantizer amax "
                f"(layout {self.kind}, {present} present); {self.dst} not written")

    def summary(self) -> dict:
        legacy = sum(1 for how, _ in self.derived.values() if how == FROM_LEGACY)
        return {"src": str(self.src), "dst": str(self.dst), "layout": self.kind,
                "expert_amax_from_shared": legacy, "expert_amax_max_calibrated": len(self.derived) - legacy,
                "shared_amax_dropped": len(self.dropped), "tensors_copied": len(self.copied),
                "extra_states_rewritten": len(self.rewritten_objects),
                "objects_copied": len(self.copied_objects), "files_copied": self.files}

    def render(self) -> str:
        s = self.summary()
        lines = [f"repair {self.src} -> {self.dst} (layout {self.kind})",
                 f"  write {s['expert_amax_from_shared']} per-expert amax from the shared amax, "
                 f"{s['expert_amax_max_calibrated']} by max calibration (max|W| of the expert's weight)",
                 f"  drop {s['shared_amax_dropped']} shared amax; rename weight_quantizer -> "
                 f"weight_quantizer.0 in {s['extra_states_rewritten']} _extra_state objects",
                 f"  copy {s['tensors_copied']} tensors, {s['objects_copied']} objects, files: "
                 + (", ".join(self.files) or "none")]
        by_linear: dict[str, list[int]] = {}
        for key, (how, _) in self.derived.items():
            m = EXPERT_WEIGHT.match(key[: -len("_quantizer._amax")])
            by_linear.setdefault(f"{m['prefix']}.{m['name']} ({'shared' if how == FROM_LEGACY else 'max|W|'})",
                                 []).append(int(m["expert"]))
        for lin, experts in sorted(by_linear.items()):
            lines.append(f"    {lin}: experts {_ranges(sorted(experts))}")
        return "\n".join(lines)


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def plan_repair(src: Path | str, dst: Path | str) -> Plan:
    """What ``repair`` would write, from SRC's metadata only (storage checked, no tensor read)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    src, dst = Path(src), Path(dst)
    lay = inspect_checkpoint(src)  # NotACheckpoint / DamagedCheckpoint: one line
    if lay.backend != "torch_dist":
        raise RepairError(f"{src}: backend {lay.backend}; repair writes torch_dist checkpoints only")
    if lay.kind in (CkptLayout.MIXED, CkptLayout.UNQUANTIZED, CkptLayout.INCOMPLETE):
        raise RepairError(f"{src}: layout {lay.kind}: nothing repair can derive safely "
                          "(needs a shared amax or some per-expert amax per grouped linear)")
    md = torch_metadata(src)
    tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    # Only linears that hold weight amax in some form (shared, or some experts): an expert
    # weight of an unquantized linear gets nothing.
    quantized = set()
    for key in tensors:
        if m := SHARED_WEIGHT_AMAX.match(key):
            quantized.add(key[: -len("." + WEIGHT_AMAX_SUFFIX)])
        elif key.endswith(WEIGHT_AMAX_SUFFIX) and (m := EXPERT_WEIGHT.match(key[: -len("_quantizer._amax")])):
            quantized.add(f"{m['prefix']}.{m['name']}")
    derived = {}
    for amax_key, (how, source) in derived_amax_sources(tensors).items():
        m = EXPERT_WEIGHT.match(amax_key[: -len("_quantizer._amax")])
        if f"{m['prefix']}.{m['name']}" in quantized:
            derived[amax_key] = (how, source)
    for key in {s for how, s in derived.values() if how == FROM_LEGACY}:
        if tuple(tensors[key].size) != (1,):
            raise RepairError(f"{src}: {key} has shape {tuple(tensors[key].size)}: only a per-tensor "
                              "amax can be shared by the experts")
    dropped = sorted(k for k in tensors if SHARED_WEIGHT_AMAX.match(k))
    amax_dtype = amax_dtype_of(v.properties.dtype for k, v in tensors.items() if k.endswith(WEIGHT_AMAX_SUFFIX))
    objects = sorted(k for k in md.state_dict_metadata if k not in tensors)
    shared_linears = {k[: -len("." + WEIGHT_AMAX_SUFFIX)] for k in dropped}
    rewritten = [k for k in objects if (m := _EXPERT_EXTRA_STATE.match(k))
                 and f"{m['prefix']}.{m['linear']}" in shared_linears]
    files = sorted(p.name for p in src.iterdir()
                   if p.name != ".metadata" and not p.name.endswith(".distcp"))
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    return Plan(src=src, dst=dst, kind=lay.kind, derived=derived, dropped=dropped,
                copied=sorted(k for k in tensors if k not in dropped),
                rewritten_objects=rewritten, copied_objects=[k for k in objects if k not in set(rewritten)],
                files=files, amax_dtype=amax_dtype, src_bytes=size)


# --- reading SRC one item at a time ---------------------------------------------------------------
class Source:
    """SRC's tensors and raw objects, one at a time, with one metadata read (torch DCP's reader)."""

    def __init__(self, ckpt: Path):
        from torch.distributed.checkpoint import FileSystemReader

        self.reader = FileSystemReader(str(ckpt))
        self.md = self.reader.read_metadata()
        self.reader.set_up_storage_reader(self.md, True)

    def _read(self, state_dict, planner):
        planner.set_up_planner(state_dict, self.md, True)
        plan = self.reader.prepare_local_plan(planner.create_local_plan())
        plan = planner.finish_plan(self.reader.prepare_global_plan([plan])[0])
        self.reader.read_data(plan, planner).wait()

    def tensor(self, key: str):
        import torch
        from torch.distributed.checkpoint import DefaultLoadPlanner

        meta = self.md.state_dict_metadata[key]
        out = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)}
        self._read(out, DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False))
        return out[key]

    def raw_objects(self, keys) -> dict[str, bytes]:
        """The stored bytes of ``keys`` (ShardedObjects), not unpickled."""
        from torch.distributed.checkpoint import DefaultLoadPlanner

        raw: dict[str, bytes] = {}

        class RawBytes(DefaultLoadPlanner):
            def load_bytes(self, read_item, value):
                raw[read_item.dest_index.fqn] = value.read()

        if keys:
            self._read({k: io.BytesIO() for k in keys},
                       RawBytes(flatten_state_dict=False, flatten_sharded_tensors=False))
        return raw


def tensor_sha256(t) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(__import__("torch").uint8).numpy().tobytes()).hexdigest()


def rename_shared_weight_quantizer(raw: bytes, key: str) -> bytes:
    """One expert linear's stored ``_extra_state`` with its ``weight_quantizer`` entry renamed
    ``weight_quantizer.0``. Stored as megatron's ShardedObject: ``torch.save([data])``, data the
    uint8 tensor of a ``torch.save`` of ModelOpt's extra-state dict."""
    import torch

    try:
        wrapped = torch.load(io.BytesIO(raw), weights_only=False)
        (data,) = wrapped
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)
        qstate = state["modelopt_quantizer_state"]
    except Exception as exc:  # noqa: BLE001 - any decoding failure: one line naming the object
        raise RepairError(f"{key}: not a ModelOpt extra state this repair can read "
                          f"({type(exc).__name__}: {str(exc)[:120]})") from exc
    if "weight_quantizer" not in qstate or any(k.startswith("weight_quantizer.") for k in qstate):
        return raw
    state = {**state, "modelopt_quantizer_state": {
        ("weight_quantizer.0" if k == "weight_quantizer" else k): v for k, v in qstate.items()}}
    inner = io.BytesIO()
    torch.save(state, inner)
    outer = io.BytesIO()
    torch.save([torch.frombuffer(bytearray(inner.getvalue()), dtype=torch.uint8)], outer)
    return outer.getvalue()


def _write(plan: Plan, source: Source, out: Path) -> None:
    """DST's tensors and objects into ``out`` through torch DCP's FileSystemWriter, streamed."""
    import torch

    md = source.md.state_dict_metadata
    objects = source.raw_objects(plan.copied_objects + plan.rewritten_objects)
    for k in plan.rewritten_objects:
        objects[k] = rename_shared_weight_quantizer(objects[k], k)
    state: dict = {k: io.BytesIO(v) for k, v in objects.items()}
    for k in plan.copied:
        state[k] = torch.empty(tuple(md[k].size), dtype=md[k].properties.dtype, device="meta")
    for k, (how, src_key) in plan.derived.items():
        shape = tuple(md[src_key].size) if how == FROM_LEGACY else (1,)
        state[k] = torch.empty(shape, dtype=plan.amax_dtype, device="meta")
    legacy_cache: dict[str, torch.Tensor] = {}

    def produce(key: str):
        if key in plan.derived:
            how, src_key = plan.derived[key]
            if how == FROM_LEGACY:
                if src_key not in legacy_cache:
                    legacy_cache[src_key] = source.tensor(src_key)
                return legacy_cache[src_key].clone()
            return max_calibrated_amax(source.tensor(src_key), plan.amax_dtype)
        t = source.tensor(key)
        plan.hashes[key] = tensor_sha256(t)
        return t

    save_streamed(state, out, produce)
    for name in plan.files:
        s, d = plan.src / name, out / name
        shutil.copytree(s, d) if s.is_dir() else shutil.copy2(s, d)


def verify(plan: Plan, out: Path) -> None:
    """DST holds every planned key; copied tensors sha256-equal to SRC's; derived amax as planned."""
    got = Source(out)
    keys = set(got.md.state_dict_metadata)
    want = set(plan.copied) | set(plan.derived) | set(plan.copied_objects) | set(plan.rewritten_objects)
    if keys != want:
        raise RepairError(f"{out}: written keys differ from the plan ({len(keys ^ want)} keys)")
    for k in plan.copied:
        if tensor_sha256(got.tensor(k)) != plan.hashes.get(k):
            raise RepairError(f"{out}: {k} differs from SRC after writing")
    src = Source(plan.src)
    for k, (how, src_key) in plan.derived.items():
        value = got.tensor(k)
        expect = src.tensor(src_key) if how == FROM_LEGACY else max_calibrated_amax(src.tensor(src_key), plan.amax_dtype)
        if not bool((value == expect).all()) or value.dtype != expect.dtype:
            raise RepairError(f"{out}: {k} is not the planned value")
    raw_src = src.raw_objects(plan.copied_objects)
    raw_dst = got.raw_objects(plan.copied_objects)
    for k in plan.copied_objects:
        if raw_src[k] != raw_dst[k]:
            raise RepairError(f"{out}: object {k} differs from SRC after writing")


def repair(src: Path | str, dst: Path | str, dry_run: bool = False) -> Plan:
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if dst.exists() or dst.is_symlink():
        raise RepairError(f"{dst}: exists; repair never overwrites (choose a new DST)")
    if dst == src or src in dst.parents or dst in src.parents:
        raise RepairError(f"{dst}: inside or above SRC {src}; repair never writes into SRC")
    if not dst.parent.is_dir():
        raise RepairError(f"{dst.parent}: no such directory (DST's parent must exist)")
    plan = plan_repair(src, dst)
    if plan.needs_nothing:
        raise NothingToRepair(plan.nothing_line())
    if dry_run:
        return plan
    free = shutil.disk_usage(dst.parent).free
    if free < plan.src_bytes * 1.05:
        raise RepairError(f"{dst.parent}: no space left for DST: needs about {plan.src_bytes} "
                          f"bytes, {free} free")
    tmp = dst.parent / f".{dst.name}{PARTIAL}{os.getpid()}"
    try:
        _write(plan, Source(src), tmp)
        verify(plan, tmp)
        os.rename(tmp, dst)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        root = _root_cause(exc)
        if isinstance(root, OSError) and root.errno == errno.ENOSPC:
            raise RepairError(f"{dst.parent}: no space left on device while writing DST "
                              "(nothing left behind)") from exc
        if root is not exc:
            raise root from None  # DCP's CheckpointException (a BaseException) wraps the cause
        raise
    return plan


def _root_cause(exc: BaseException) -> BaseException:
    """The exception inside torch DCP's ``CheckpointException`` (rank -> (exception, stack))."""
    from torch.distributed.checkpoint.api import CheckpointException

    while isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    return exc


def repair_golden(src_golden: Path | str, dst_golden: Path | str) -> Path:
    """A golden directory (``ckpt/`` + manifest) repaired into a new golden directory whose
    manifest keeps the source's versions, topology and model size (a load stage needs them)."""
    from harness.golden.manifest import verify_manifest, write_manifest

    src, dst = Path(src_golden), Path(dst_golden)
    doc = verify_manifest(src)
    if dst.exists():
        raise RepairError(f"{dst}: exists; golden checkpoints are written once")
    dst.mkdir(parents=True)
    try:
        plan = repair(src / "ckpt", dst / "ckpt")
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    s = plan.summary()
    notes = (f"repaired from {src.name} by python -m harness repair: {s['expert_amax_from_shared']} "
             f"per-expert amax from the shared amax, {s['expert_amax_max_calibrated']} by max "
             f"calibration, {s['shared_amax_dropped']} shared amax dropped, "
             f"{s['extra_states_rewritten']} extra states renamed; other tensors sha256-equal")
    return write_manifest(dst, topology=doc["topology"], layout=CkptLayout.PER_EXPERT,
                          made_by=f"python -m harness golden repair {src.name} {dst.name}",
                          versions=doc["versions"], notes=notes, size=doc.get("size"))


def main(args) -> int:
    """Exit 0: written, the dry run printed, or nothing to repair (no DST); 2: bad input or DST
    problem; 3: damaged SRC."""
    try:
        plan = repair(args.src, args.dst, dry_run=args.dry_run)
    except NothingToRepair as exc:
        print(exc)
        return 0
    except DamagedCheckpoint as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (NotACheckpoint, RepairError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or args.dst}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - anything else: one line, DST was not written
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: repair of {args.src} failed, {args.dst} not written: "
              f"{type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    print(("dry run (nothing written): " if args.dry_run else "") + plan.render())
    if not args.dry_run:
        print(f"written and verified: {plan.dst} ({len(plan.hashes)} tensors sha256-equal to SRC)")
    return 0
