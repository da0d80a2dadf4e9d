"""A megatron-core distributed checkpoint's metadata, read without a process group or tensor
data, and its storage files checked against it.

Why: only metadata is read (megatron-core ``load_tensors_metadata``: the torch_dist ``.metadata``
file), so it is quick on any machine; the storage files it names are checked too (present, long
enough, each tensor's range starting as a torch.save record): a truncated or overwritten
``.distcp`` is reported here, as one line naming the file, not at load time.
"""
from __future__ import annotations

from pathlib import Path


class NotACheckpoint(Exception):
    """The path is missing or is not a megatron-core distributed checkpoint."""


class DamagedCheckpoint(NotACheckpoint):
    """A storage file the metadata refers to is missing, short or overwritten: a load would fail
    (or read garbage) long after the metadata looked fine."""


def read_metadata(path: Path | str) -> tuple[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """Backend name and ``key -> (dtype, global_shape)`` of a checkpoint, metadata only; a
    torch_dist checkpoint's storage files are checked against the metadata too."""
    p = Path(path)
    if not p.exists():
        raise NotACheckpoint(f"{p}: no such file or directory")
    if not (p / "metadata.json").is_file():
        hint = checkpoint_inside(p)
        raise NotACheckpoint(
            f"{p}: not a megatron-core distributed checkpoint (metadata.json missing)"
            + (f"; did you mean {hint}?" if hint else "")
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


def checkpoint_inside(p: Path) -> Path | None:
    """The checkpoint one level below ``p``, for the hint in NotACheckpoint: a golden's folder
    holds ``ckpt/`` beside ``manifest.json``, and a user naturally names the folder. ``p/ckpt``
    if it is one, else the only subfolder that is one; None when there is none or several."""
    if not p.is_dir():
        return None
    if (p / "ckpt" / "metadata.json").is_file():
        return p / "ckpt"
    found = [q for q in sorted(p.iterdir()) if q.is_dir() and (q / "metadata.json").is_file()]
    return found[0] if len(found) == 1 else None


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
