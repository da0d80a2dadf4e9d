"""Save and load through megatron-core dist_checkpointing, the way Megatron-LM resumes.

Model tensors go through ``dist_checkpointing.save/load`` of ``model.sharded_state_dict``; the
ModelOpt state (which quantizers exist, their config) goes through ModelOpt's own
``save_sharded_modelopt_state`` / ``restore_sharded_modelopt_state``, as Megatron-LM does, so a
load stage rebuilds the quantized model from the checkpoint instead of re-calibrating.
"""
from __future__ import annotations

from pathlib import Path


def sharded_metadata(singleton_local_shards: bool) -> dict:
    return {"singleton_local_shards": singleton_local_shards}


def save_checkpoint(model, ckpt_dir: Path, metadata: dict, validate: bool = True) -> None:
    from megatron.core import dist_checkpointing
    from modelopt.torch.opt.plugins.mcore_dist_checkpointing import save_sharded_modelopt_state

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    sharded_sd = model.sharded_state_dict(metadata=metadata)
    dist_checkpointing.save(sharded_sd, str(ckpt_dir), validate_access_integrity=validate)
    save_sharded_modelopt_state([model], str(ckpt_dir))


def restore_modelopt_state(model, ckpt_dir: Path) -> None:
    from modelopt.torch.opt.plugins.mcore_dist_checkpointing import (
        restore_sharded_modelopt_state,
    )

    restore_sharded_modelopt_state([model], str(ckpt_dir))


def load_checkpoint(model, ckpt_dir: Path, metadata: dict, strict: bool, validate: bool = True):
    """``dist_checkpointing.load`` then ``model.load_state_dict`` (the normal resume path)."""
    from megatron.core import dist_checkpointing

    sharded_sd = model.sharded_state_dict(metadata=metadata)
    loaded = dist_checkpointing.load(
        sharded_sd, str(ckpt_dir), validate_access_integrity=validate
    )
    return model.load_state_dict(loaded, strict=strict)


def require_checkpoint(ckpt_dir: Path) -> None:
    """A clear message instead of a deep megatron traceback when the checkpoint is missing."""
    if not (ckpt_dir / "metadata.json").is_file():
        raise FileNotFoundError(
            f"no megatron-core distributed checkpoint at {ckpt_dir} (metadata.json missing); "
            "run the save stage first or point --ckpt at an existing checkpoint"
        )
