"""One gloo rank: save a module holding key "a", then load into one asking for "a" and "b"
through harness.model.checkpoint.load_checkpoint under each (strictness, Megatron-LM mode) in
MODES; print one JSON line of what happened per mode (tests/test_load_path.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


class Holder(torch.nn.Module):
    def __init__(self, keys: tuple[str, ...]):
        super().__init__()
        for k in keys:
            self.register_buffer(k, torch.full((4,), 1.0 + ord(k)))

    def sharded_state_dict(self, metadata=None):
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        return {k: ShardedTensor.from_rank_offsets(k, v) for k, v in self.state_dict().items()}


MODES = (("assume_ok_unexpected", False), ("log_all", True), ("log_all", False))


def main() -> None:
    ckpt, init = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1)
    from megatron.core import dist_checkpointing

    from harness.model.checkpoint import load_checkpoint
    from harness.model.cpu_shims import apply_cpu_shims

    apply_cpu_shims()  # as every cpu-tier rank (harness/rank/setup.py): no CUDA synchronize

    ckpt.mkdir(parents=True)
    dist_checkpointing.save(Holder(("a",)).sharded_state_dict(), str(ckpt))
    results = {}
    for strictness, megatron_lm in MODES:
        model, notes = Holder(("a", "b")), []
        with torch.no_grad():
            model.a.zero_()
        try:
            load_checkpoint(model, ckpt, {}, strict=True, strictness=strictness,
                            megatron_lm=megatron_lm, notes=notes)
            out = {"raised": None}
        except BaseException as exc:  # noqa: BLE001 - torch DCP's CheckpointException is one
            out = {"raised": type(exc).__name__}
        results[f"{strictness}{'+megatron-lm' if megatron_lm else ''}"] = (
            out | {"notes": notes, "a": model.a.tolist(), "b": model.b.tolist()})
    print(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
