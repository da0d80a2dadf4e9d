"""``python -m harness repair SRC DST``: rewrite an old MoE checkpoint so per-expert releases load it complete.

Why: a 0.46.x checkpoint (one shared weight-quantizer amax per grouped linear) loads silently
under 0.47.0 / 0.48.0rc1 with every per-expert amax absent, and a 0.47.0 checkpoint saved at
TP != ETP with validation off (some experts' amax never written) is refused (harness/golden/
forecast.py). Upstream says "re-run PTQ"; this rewrites the checkpoint offline instead, on one
CPU, without building the model. What it writes (derived per-expert amax, dropped shared amax,
renamed extra states, the rest copied) is planned by harness/golden/repair_plan.py.

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
import shutil
import sys
from pathlib import Path

from harness.check.expect import FROM_LEGACY, max_calibrated_amax
from harness.check.layouts import CkptLayout
from harness.golden.repair_plan import NothingToRepair, Plan, RepairError, plan_repair
from harness.golden.storage import DamagedCheckpoint, NotACheckpoint
from harness.golden.streamed_save import save_streamed

PARTIAL = ".repair-partial-"  # DST's sibling while it is written


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
