"""Can N NCCL ranks share ONE GPU when each rank says it is its own host?

    torchrun --nproc-per-node N tools/gpu-host/nccl_probe.py hostid|control OUT.json

NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"); it reads the host
identity from NCCL_HOSTID when set. ``hostid``: every rank sets its own NCCL_HOSTID before the
process group starts, and NCCL's network transport runs over sockets on loopback. ``control``:
no NCCL_HOSTID, to show the refusal. Each rank runs all_reduce, all_gather, then a
megatron-core dist_checkpointing save and load of the harness model (tp1-etp1-epN, TE,
NVFP4_DEFAULT_CFG) with the tensors compared; rank 0 writes what happened to OUT.json.
PROBE_GATHERS=K first times K all_gather_object calls of one bool over NCCL and over a gloo group:
what ModelOpt's calibration check pays per quantizer and group (docs/findings.md);
PROBE_CHECKPOINT=0 leaves out the save and load.
Development evidence only (docs/runs/), not part of the harness.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Leaf quantizers of the Nano production shape (scenarios/gpu_nano_shape.toml): ModelOpt's
# calibration check gathers once per quantizer and group (docs/findings.md)
NANO_SHAPE_QUANTIZERS = 1041


def main(mode: str, out: Path) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if mode == "hostid":
        os.environ["NCCL_HOSTID"] = f"moe-ckpt-probe-rank{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    import torch
    import torch.distributed as dist

    facts: dict = {"mode": mode, "world": world, "steps": {}}
    t0 = time.time()

    def step(name, fn):
        start = time.time()
        value = fn()
        facts["steps"][name] = {"s": round(time.time() - start, 2), "value": value}

    try:
        torch.cuda.set_device(0)
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))

        def all_reduce():
            t = torch.full((4,), float(rank + 1), device="cuda")
            dist.all_reduce(t)
            torch.cuda.synchronize()
            return t[0].item()  # sum of 1..world

        def all_gather():
            got = [torch.zeros(2, device="cuda") for _ in range(world)]
            dist.all_gather(got, torch.full((2,), float(rank), device="cuda"))
            return [g[0].item() for g in got]

        step("all_reduce", all_reduce)
        step("all_gather", all_gather)
        gathers = int(os.environ.get("PROBE_GATHERS", "0"))
        if gathers:  # what ModelOpt's calibration check pays per quantizer and group
            step("object_gather_nccl_ms", lambda: object_gather_ms(None, gathers))
            gloo = dist.new_group(backend="gloo")
            step("object_gather_gloo_ms", lambda: object_gather_ms(gloo, gathers))
        if os.environ.get("PROBE_CHECKPOINT", "1") == "1":
            step("checkpoint", lambda: save_and_load(world))
        facts["ok"] = True
    except BaseException as exc:  # noqa: BLE001  (the probe reports whatever stopped it)
        facts.update(ok=False, exc_type=type(exc).__name__, message=str(exc)[:2000],
                     traceback=traceback.format_exc()[-4000:])
    facts["wall_s"] = round(time.time() - t0, 2)
    if rank == 0 or not facts.get("ok"):
        target = out if rank == 0 else out.with_suffix(f".rank{rank}.json")
        target.write_text(json.dumps(facts, indent=2))
    shown = ("mode", "world", "nccl", "ok", "exc_type", "message", "wall_s") + (("steps",) if rank == 0 else ())
    print(json.dumps({k: facts.get(k) for k in shown}))
    if facts.get("ok"):
        dist.destroy_process_group()
        return 0
    os._exit(1)  # peers may sit in a collective: never destroy the group after a failure


def object_gather_ms(group, count: int) -> dict:
    """Milliseconds per all_gather_object of one bool, as ModelOpt's
    ``_check_moe_calibration_complete`` sends once per leaf quantizer and parallel group."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    dist.all_gather_object([None] * size, True, group=group)  # warm-up: communicator set up
    start = time.perf_counter()
    for _ in range(count):
        dist.all_gather_object([None] * size, True, group=group)
    per_call = (time.perf_counter() - start) * 1000 / count
    return {"count": count, "ms_per_call": round(per_call, 2),
            "nano_shape_check_s": round(per_call * NANO_SHAPE_QUANTIZERS / 1000, 1)}


def save_and_load(world: int) -> dict:
    """The harness model saved and loaded through megatron-core over this NCCL group."""
    import torch
    import torch.distributed as dist

    from harness.model.checkpoint import load_checkpoint, restore_modelopt_state, save_checkpoint, sharded_metadata
    from harness.model.gpt import GPU_SIZE, build_gpt
    from harness.model.quant import quantize
    from harness.rank.setup import init_rank
    from harness.tiers import Backend, Tier
    from harness.topology.topology import Topology

    topo = Topology.parse(f"tp1-etp1-ep{world}")
    init_rank(topo, Tier.GPU, 60)
    model = build_gpt(topo, GPU_SIZE, Backend.TE)
    quantize(model, GPU_SIZE, torch.cuda.current_device())
    base = [Path(tempfile.mkdtemp(prefix="nccl-probe-"))] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(base)
    ckpt = Path(base[0]) / "ckpt"
    meta = sharded_metadata(True)
    save_checkpoint(model, ckpt, meta)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    fresh = build_gpt(topo, GPU_SIZE, Backend.TE, seed=99)
    restore_modelopt_state(fresh, ckpt)
    load_checkpoint(fresh, ckpt, meta, strict=False)
    now = {k: v for k, v in fresh.state_dict().items() if torch.is_tensor(v)}
    differ = sorted(k for k in saved if k in now and not torch.equal(saved[k], now[k]))
    missing = sorted(set(saved) - set(now))
    counts = [None] * world
    dist.all_gather_object(counts, (len(saved), len(differ), differ[:3], missing[:3]))
    return {"tensors_per_rank": [c[0] for c in counts], "differing": [c[1] for c in counts],
            "differing_examples": [c[2] for c in counts], "missing_examples": [c[3] for c in counts]}


if __name__ == "__main__":  # the torch_dist save starts a spawn Manager: main guard needed
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
