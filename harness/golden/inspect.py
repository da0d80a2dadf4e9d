"""``python -m harness inspect <ckpt>``: which MoE weight-quantizer layout a checkpoint holds.

Why: the resharding failure also hits checkpoints written by older ModelOpt releases, and the two
releases store the grouped-MLP weight quantizer differently. Before loading, a user needs to know
which layout the checkpoint holds and whether every expert's amax was actually written:
  * ``per-expert`` (ModelOpt 0.47.0): one ``...mlp.experts.experts.{E}.linear_fc{1,2}.
    weight_quantizer._amax`` per global expert. A checkpoint saved at TP != ETP with validation
    switched off can lack some experts' amax (no rank held a "main replica" of them): those are
    listed as missing.
  * ``shared`` (ModelOpt <= 0.46.x): one ``...mlp.experts[.experts].linear_fc{1,2}.
    weight_quantizer._amax`` per grouped linear, no expert id.
  * ``mixed``: both of the above (should not happen; reported rather than guessed).
  * ``incomplete``: the experts are quantized (input-quantizer amax present) but no expert
    weight-quantizer amax was written at all.
  * ``unquantized``: no quantizer state in the checkpoint.

Only metadata is read (megatron-core ``load_tensors_metadata``: the torch_dist ``.metadata``
file), which needs no process group and no tensor data, so it is quick on any machine. The
storage files it names are checked too (present, long enough, each tensor's range starting as a
torch.save record): a truncated or overwritten ``.distcp`` is reported here, not at load time.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.check.layouts import CkptLayout, GoldenLayout
from harness.check.keys import ANY_LAYER, EXPERT_INPUT_AMAX, EXPERT_WEIGHT, ROUTER_WEIGHT
from harness.check.keys import PER_EXPERT_WEIGHT_AMAX as PER_EXPERT
from harness.check.keys import SHARED_WEIGHT_AMAX as SHARED


class NotACheckpoint(Exception):
    """The path is missing or is not a megatron-core distributed checkpoint."""


class DamagedCheckpoint(NotACheckpoint):
    """A storage file the metadata refers to is missing, short or overwritten: a load would fail
    (or read garbage) long after the metadata looked fine."""


@dataclass
class LinearAmax:
    """Per-expert weight-quantizer amax of one grouped linear (one layer, fc1 or fc2)."""

    layer: int
    linear: str
    present: list[int]
    missing: list[int]


@dataclass
class Layout:
    path: str
    kind: str  # a CkptLayout
    backend: str
    num_tensors: int
    num_layers: int
    num_experts: int | None  # from the router (global experts), else from expert weights
    experts_seen: list[int]  # global expert ids with any tensor in the checkpoint
    dtypes: dict[str, int]  # dtype -> number of tensors
    amax_dtypes: list[str]  # dtypes of the expert weight-quantizer amax
    linears: list[LinearAmax] = field(default_factory=list)  # per-expert layout only
    shared_keys: list[str] = field(default_factory=list)  # shared layout only

    @property
    def missing(self) -> dict[str, list[int]]:
        """``layer.linear`` -> global experts without their weight-quantizer amax."""
        return {f"{li.layer}.{li.linear}": li.missing for li in self.linears if li.missing}

    def as_json(self) -> dict:
        d = asdict(self)
        d["missing"] = self.missing
        return d


def read_metadata(path: Path | str) -> tuple[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """Backend name and ``key -> (dtype, global_shape)`` of a checkpoint, metadata only; a
    torch_dist checkpoint's storage files are checked against the metadata too."""
    p = Path(path)
    if not p.exists():
        raise NotACheckpoint(f"{p}: no such file or directory")
    if not (p / "metadata.json").is_file():
        raise NotACheckpoint(
            f"{p}: not a megatron-core distributed checkpoint (metadata.json missing)"
        )
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    try:
        from megatron.core.dist_checkpointing.core import maybe_load_config

        backend = maybe_load_config(str(p)).sharded_backend
    except Exception as exc:  # noqa: BLE001 - any reader failure means "not readable as such"
        raise NotACheckpoint(f"{p / 'metadata.json'}: unreadable ({_why(exc)})") from exc
    try:
        if backend == "torch_dist":
            from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy

            tdm = torch_metadata(p)
            check_storage(p, tdm)
            for sub in sorted(q for q in p.iterdir() if (q / ".metadata").is_file()):
                check_storage(sub, torch_metadata(sub))  # modelopt_state/: loaded with the model
            md = TorchDistLoadShardedStrategy().load_tensors_metadata(p, tdm)
        else:
            md = dist_checkpointing.load_tensors_metadata(str(p))
    except NotACheckpoint:
        raise
    except Exception as exc:  # noqa: BLE001
        raise NotACheckpoint(
            f"{p}: metadata.json present but the tensor metadata is unreadable ({_why(exc)})"
        ) from exc
    out = {}
    for key, sh in md.items():
        if isinstance(sh, ShardedTensor):
            out[key] = (str(sh.dtype), tuple(sh.global_shape))
    return backend, out


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def torch_metadata(ckpt: Path):
    """The unpickled torch.distributed.checkpoint ``Metadata`` of ``ckpt``; NotACheckpoint names
    the ``.metadata`` file when it is missing or not a pickle of one."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

    f = ckpt / ".metadata"
    if not f.is_file():
        raise NotACheckpoint(f"{f}: missing (metadata.json present but the tensor metadata is "
                             "unreadable without it)")
    try:
        md = FileSystemReader(str(ckpt)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - a damaged pickle raises almost anything
        raise NotACheckpoint(f"{f}: the tensor metadata is unreadable, not a torch.distributed."
                             f"checkpoint metadata pickle ({_why(exc)})") from exc
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise NotACheckpoint(f"{f}: the tensor metadata is unreadable (unpickles to "
                             f"{type(md).__name__} without storage_data)")
    return md


# torch.save (DCP's default serialization) writes a zip archive: each tensor's byte range starts so.
_ZIP_MAGIC = b"PK\x03\x04"


def storage_problems(ckpt: Path, md) -> list[str]:
    """One line per damaged storage file of a torch_dist checkpoint: missing, unreadable, shorter
    than the byte ranges ``md.storage_data`` records, or a tensor range that is not a torch.save
    record (overwritten). Sizes catch truncation; the 4-byte header check catches same-size junk."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ranges: dict[str, list] = {}
    for index, info in md.storage_data.items():
        ranges.setdefault(info.relative_path, []).append((index, info))
    problems = []
    for rel, items in sorted(ranges.items()):
        f = ckpt / rel
        need = max(info.offset + info.length for _, info in items)
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            problems.append(f"{f}: missing (the metadata records {len(items)} item(s) in it)")
            continue
        except OSError as exc:
            problems.append(f"{f}: unreadable ({exc.strerror})")
            continue
        if size < need:
            problems.append(f"{f}: truncated: needs {need} bytes, has {size}")
            continue
        try:
            with open(f, "rb") as fh:
                for index, info in sorted(items, key=lambda it: it[1].offset):
                    tp = md.state_dict_metadata.get(index.fqn)
                    if (not isinstance(tp, TensorStorageMetadata) or info.transform_descriptors
                            or info.length < len(_ZIP_MAGIC) or _raw(tp, index, info)):
                        continue
                    fh.seek(info.offset)
                    if fh.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                        problems.append(f"{f}: corrupt: bytes {info.offset}..{info.offset + info.length} "
                                        f"({index.fqn}) are not a torch.save record")
                        break
        except OSError as exc:
            problems.append(f"{f}: unreadable ({exc.strerror})")
    return problems


def _raw(tp, index, info) -> bool:
    """Whether DCP stored this chunk as raw bytes (no torch.save framing): length == its bytes."""
    import math

    chunk = next((c for c in tp.chunks if index.offset is not None
                  and tuple(c.offsets) == tuple(index.offset)), None)
    if chunk is None:
        return False
    return info.length == math.prod(chunk.sizes) * tp.properties.dtype.itemsize


def check_storage(ckpt: Path, md) -> None:
    """DamagedCheckpoint, one line: the first damaged file and how many more there are."""
    problems = storage_problems(ckpt, md)
    if problems:
        more = f" (and {len(problems) - 1} more damaged file(s))" if len(problems) > 1 else ""
        raise DamagedCheckpoint(problems[0] + more)


def classify(tensors: dict[str, tuple[str, tuple[int, ...]]], path: str = "", backend: str = "") -> Layout:
    """Classify from ``key -> (dtype, global_shape)``; pure, so tests can feed recordings."""
    per_expert: dict[tuple[int, str], set[int]] = {}
    shared: list[str] = []
    amax_dtypes: set[str] = set()
    experts_seen: set[int] = set()
    routers: dict[int, int] = {}
    layers: set[int] = set()
    expert_input_amax = False
    grouped: set[tuple[int, str]] = set()  # (layer, linear) that exist in any form
    for key, (dtype, shape) in tensors.items():
        if m := ANY_LAYER.match(key):
            layers.add(int(m["layer"]))
        if m := PER_EXPERT.match(key):
            layer, expert = int(m["layer"]), int(m["expert"])
            per_expert.setdefault((layer, m["linear"]), set()).add(expert)
            experts_seen.add(expert)
            amax_dtypes.add(dtype)
        elif m := SHARED.match(key):
            shared.append(key)
            amax_dtypes.add(dtype)
            grouped.add((int(m["layer"]), m["linear"]))
        elif EXPERT_INPUT_AMAX.match(key):
            expert_input_amax = True
        if m := EXPERT_WEIGHT.match(key):
            experts_seen.add(int(m["expert"]))
            lin = key.rsplit(".", 2)[-2]
            grouped.add((int(m["layer"]), lin))
        if (m := ROUTER_WEIGHT.match(key)) and shape:
            routers[int(m["layer"])] = int(shape[0])
    num_experts = max(routers.values()) if routers else (max(experts_seen) + 1 if experts_seen else None)
    grouped |= set(per_expert)
    linears = []
    if per_expert:
        expected = set(range(num_experts)) if num_experts else set()
        for layer, lin in sorted(grouped):
            present = per_expert.get((layer, lin), set())
            linears.append(LinearAmax(layer, lin, sorted(present), sorted(expected - present)))
    if per_expert and shared:
        kind = CkptLayout.MIXED
    elif per_expert:
        kind = CkptLayout.PER_EXPERT
    elif shared:
        kind = CkptLayout.SHARED
    elif expert_input_amax:
        kind = CkptLayout.INCOMPLETE
    else:
        kind = CkptLayout.UNQUANTIZED  # dense layers may be quantized; the experts hold no weight amax
    return Layout(
        path=path,
        kind=kind,
        backend=backend,
        num_tensors=len(tensors),
        num_layers=len(layers),
        num_experts=num_experts,
        experts_seen=sorted(experts_seen),
        dtypes=dict(Counter(d for d, _ in tensors.values())),
        amax_dtypes=sorted(amax_dtypes),
        linears=linears,
        shared_keys=sorted(shared),
    )


def inspect_checkpoint(path: Path | str) -> Layout:
    """Read a checkpoint's metadata (no tensor data, no process group) and classify it."""
    backend, tensors = read_metadata(path)
    return classify(tensors, path=str(path), backend=backend)


_MEANING = {
    CkptLayout.PER_EXPERT: "ModelOpt >= 0.47.0 layout: one weight-quantizer amax per expert",
    CkptLayout.SHARED: "ModelOpt <= 0.46.x layout: one shared weight-quantizer amax per grouped linear",
    CkptLayout.MIXED: "BOTH per-expert and shared weight-quantizer amax keys: do not load without checking",
    CkptLayout.INCOMPLETE: "experts quantized but NO expert weight-quantizer amax saved",
    CkptLayout.UNQUANTIZED: "no expert weight-quantizer state",
}


def render(lay: Layout) -> str:
    lines = [
        f"checkpoint: {lay.path} ({lay.backend}, {lay.num_tensors} tensors)",
        f"layout:     {lay.kind}  ({_MEANING[lay.kind]})",
        f"layers:     {lay.num_layers}   experts: {lay.num_experts} "
        f"(seen in keys: {len(lay.experts_seen)})",
        "dtypes:     " + ", ".join(f"{d.removeprefix('torch.')} x{n}" for d, n in sorted(lay.dtypes.items())),
    ]
    if lay.amax_dtypes:
        lines.append("amax dtype: " + ", ".join(d.removeprefix("torch.") for d in lay.amax_dtypes))
    if lay.kind == CkptLayout.SHARED:
        lines.append(f"shared weight_quantizer keys: {len(lay.shared_keys)} (e.g. {lay.shared_keys[0]})")
    for li in lay.linears:
        state = GoldenLayout.COMPLETE if not li.missing else f"MISSING experts {li.missing}"
        lines.append(f"  layer {li.layer} {li.linear}: {len(li.present)}/{len(li.present) + len(li.missing)} "
                     f"experts with amax, {state}")
    if lay.missing:
        n = sum(len(v) for v in lay.missing.values())
        lines.append(f"WARNING: {n} expert weight-quantizer amax missing (a checkpoint saved at "
                     "TP != ETP with sharding validation off?): unpatched modelopt 0.47.0 cannot restore "
                     "them; with harness.fix they are re-derived from the weights by max calibration "
                     "(a warning names them)")
    return "\n".join(lines)


def main(args) -> int:
    """Exit 0: report printed; 1: mixed/incomplete layout or missing expert amax; 2: not a
    checkpoint; 3: a storage file is missing or damaged (one line names it)."""
    try:
        lay = inspect_checkpoint(args.ckpt)
    except NotACheckpoint as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, DamagedCheckpoint) else 2
    from harness.golden import forecast

    fcs = forecast.forecast(lay)
    if getattr(args, "json", False):
        import json

        print(json.dumps({**lay.as_json(), "forecast": [f.as_json() for f in fcs]}, indent=1))
    else:
        print(render(lay))
        print(forecast.render(fcs))
    return 1 if lay.kind in (CkptLayout.MIXED, CkptLayout.INCOMPLETE) or lay.missing else 0
