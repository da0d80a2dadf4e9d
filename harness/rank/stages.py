"""Stage bodies run on every rank under torchrun: quantize+save, and load+verify.

Each returns a dict of figures for ``ranks/rank<r>.json``; any exception is left to the rank
guard, which records it as this rank's error and tears the rank down.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from harness.rank import compare
from harness.rank import inject
from harness.model.checkpoint import (
    load_checkpoint,
    require_checkpoint,
    restore_modelopt_state,
    save_checkpoint,
    sharded_metadata,
)
from harness.rank.setup import Clock, device, peak_memory, prepare_rank
from harness.rank.spec import StageSpec
from harness.records import Patch, Stage
from harness.tiers import Backend, on_cuda


def _measures_logits(spec: StageSpec) -> bool:
    """At pp > 1 the forward goes through megatron-core's pipeline schedule, which allocates its
    receive buffers on CUDA: no logits at pp > 1 on the cpu tier. Tier gpu-shared sends the
    activations through host memory (harness/model/host_p2p.py), tier gpu through NCCL."""
    from harness.check.kinds import measures_logits

    return measures_logits(spec.topo.pp, on_cuda(spec.tier))


def save_stage(spec: StageSpec) -> dict:
    from harness.rank.logits import fp32_pass, measure_logits, save_logits
    from harness.model.modules import seed_expert_bias
    from harness.model.quant import amax_kinds, quantize

    clock = Clock()
    rank, model = prepare_rank(spec, clock)
    seed_expert_bias(model, spec.seed)  # the state training leaves (none without expert bias)
    quantize(model, spec.model_size, device(), spec.recipe)
    kinds = amax_kinds(model)
    record_kinds(rank, kinds)  # before anything can fail: a failed save still says its kinds
    clock.lap("quantize")
    metadata = sharded_metadata(spec.singleton_local_shards)
    ref_dir = Path(spec.reference_dir)
    shards = compare.save_reference(model.sharded_state_dict(metadata=metadata), ref_dir, rank)
    if rank == 0:
        (ref_dir / "saved_topology.txt").write_text(spec.topology)
    if _measures_logits(spec):  # every rank takes part; the rank holding the logits saves
        logits = measure_logits(model, spec.model_size, spec.tier, device())
        if logits is not None:
            save_logits(logits, ref_dir, "saved_model")
    clock.lap("reference")
    inject.point("before_save")
    written = save_checkpoint(model, Path(spec.ckpt_dir), metadata, spec.validate_sharding)
    saved = record_saved_keys(rank, spec, written)
    clock.lap("save")
    if _measures_logits(spec) and _reload_keeps_state(spec, kinds):
        # The checkpoint's own logits at the save topology: what every reshard must reproduce.
        # They differ from the saved model's where its replicas disagreed (see verify figures).
        # Read into a model built afresh, as a new process (every load stage, the jobs' next
        # step) reads it: the calibrated model keeps its recipe's calibrators, and ModelOpt's
        # restore re-runs them (an MSE calibrator raises TypeError there, docs/findings.md).
        model = _fresh_model(spec)
        load_checkpoint(model, Path(spec.ckpt_dir), metadata, spec.strict_load,
                        spec.validate_sharding)
        logits = measure_logits(model, spec.model_size, spec.tier, device())
        if logits is not None:
            save_logits(logits, ref_dir, "checkpoint")
        if _measures_noise_floor(spec):  # last: converts the model to fp32 (noise floor reference)
            fp32, error = fp32_pass(model, spec.model_size, device())
            if fp32 is not None:
                save_logits(fp32, ref_dir, "checkpoint_fp32")
            elif error and rank == 0:
                (ref_dir / "fp32_error.txt").write_text(error)
        clock.lap("reference_reload")
    return {"durations": clock.durations, "clock_started_at": clock.started_at,
            "memory": peak_memory(), "reference_shards": shards, "amax_kinds": kinds,
            "saved": saved}


def record_kinds(rank: int, kinds: dict) -> None:
    """This rank's amax kinds per module family, as soon as calibration ends:
    ``<stage dir>/kinds/rank<r>.json``, stamped with the stage's token, which the controller
    reads whether or not the save then succeeds (harness/launch/torchrun.py ``calibrated_kinds``)."""
    import os

    from harness.jsonfile import write_json_atomic

    write_json_atomic(Path(os.environ["HARNESS_STAGE_DIR"]) / "kinds" / f"rank{rank}.json",
                      {"amax_kinds": kinds, "stage_token": os.environ.get("HARNESS_STAGE_TOKEN", "")})


def record_saved_keys(rank: int, spec: StageSpec, keys: list[str]) -> dict:
    """What this rank saved, as evidence the controller checks (harness/run/saved.py): its keys,
    one a line, in ``<stage dir>/saved-keys/rank<r>.txt``; the counts, the topology it ran at
    and whether megatron-core's validation ran go into its result."""
    import os

    from harness.check.keys import WEIGHT_AMAX, is_expert_weight_amax
    from harness.paths import SaveDir

    out = SaveDir(Path(os.environ["HARNESS_STAGE_DIR"])).saved_keys(rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{k}\n" for k in keys))
    return {"topology": spec.topology, "world_size": torch.distributed.get_world_size(),
            "validated": spec.validate_sharding, "tensor_keys": len(keys),
            "expert_weight_amax_keys": sum(1 for k in keys
                                           if is_expert_weight_amax(k) and WEIGHT_AMAX.search(k))}


def _fresh_model(spec: StageSpec):
    """The save topology's model as a load stage builds it: built, then quantized by restoring
    the checkpoint's ModelOpt state (no calibration)."""
    from harness.model.gpt import build_gpt

    model = build_gpt(spec.topo, spec.model_size, spec.backend, spec.seed)
    restore_modelopt_state(model, Path(spec.ckpt_dir))
    return model


def _measures_noise_floor(spec: StageSpec) -> bool:
    """The fp32 pass of the noise floor (harness/check/logits.py): GPU tiers (the cpu tier's
    forward is fp32 already), pp 1 only: a rank whose fp32 pass raised inside megatron-core's
    pipeline schedule would leave its peer waiting on a send, and the stage would hang."""
    return on_cuda(spec.tier) and spec.topo.pp == 1


def _reload_keeps_state(spec: StageSpec, kinds: dict) -> bool:
    """Unpatched ModelOpt 0.47.0 drops per-expert amax of TEGroupedMLP on reload (the second
    bug, for the amax kinds its rule says), so such a checkpoint has no trustworthy reference
    logits; nor has one whose routed experts' kinds (``kinds``: what the calibration made)
    have no rule. The rule is harness/check/versions.py reload_keeps_state, which the expectation
    reads too (a reload restores ModelOpt's state: versions.RESTORE_DRY_RUN)."""
    from harness.check.kinds import reload_keeps_state

    def expert_rules() -> list:
        import modelopt

        from harness.check.versions import installed_mcore, rules_for
        from harness.model.recipes import EXPERTS

        behaviour = rules_for(modelopt.__version__, installed_mcore())
        return [behaviour.kind_rule(kind, EXPERTS) for kind in kinds.get(EXPERTS, ())]

    return reload_keeps_state(spec.patch == Patch.FIX, spec.backend == Backend.LOCAL, expert_rules)


class CheckpointFormatError(RuntimeError):
    """The checkpoint is in a torch_dist format the installed megatron-core cannot read."""


def readable(ckpt: Path) -> None:
    """One clear line instead of megatron-core <= 0.16's AttributeError from its own error path
    when the checkpoint has no common.pt (harness/check/versions.py NEEDS_COMMON_PT)."""
    from harness.check.defects import common_pt_problem
    from harness.check.versions import installed_mcore

    problem = common_pt_problem(ckpt, installed_mcore())
    if problem:
        raise CheckpointFormatError(problem)


def load_stage(spec: StageSpec) -> dict:
    from harness.rank.logits import (at_load_topology_figures, fp32_pass, logits_figures,
                                     measure_logits, noise_floor_figures)

    ckpt = Path(spec.ckpt_dir)
    require_checkpoint(ckpt)
    readable(ckpt)
    clock = Clock()
    rank, model = prepare_rank(spec, clock)
    restore_modelopt_state(model, ckpt)
    metadata = sharded_metadata(spec.singleton_local_shards)
    inject.point("before_load")
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", message="moe-ckpt-fix")
        load_notes: list[str] = []
        result = load_checkpoint(model, ckpt, metadata, spec.strict_load, spec.validate_sharding,
                                 spec.dist_ckpt_strictness, spec.megatron_lm_load, load_notes)
    notices = [str(w.message) for w in caught if str(w.message).startswith("moe-ckpt-fix")]
    notices += load_notes  # what the jobs' load path only logs (harness/model/checkpoint.py)
    for text in notices:  # still in this rank's log
        print(f"warning: {text}", flush=True)
    clock.lap("load")

    ref_dir = Path(spec.reference_dir)
    reference, disagreeing = compare.load_reference(ref_dir)
    cmp = compare.compare(model.sharded_state_dict(metadata=metadata), reference)
    per_rank = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(per_rank, (cmp, notices))
    verify = compare.merge([c for c, _ in per_rank], reference)
    verify["replica_disagreements"] = disagreeing
    verify["load_warnings"] = sorted({n for _, per in per_rank for n in per})
    verify["load_state_dict"] = {
        "missing": list(getattr(result, "missing_keys", []))[:20],
        "unexpected": list(getattr(result, "unexpected_keys", []))[:20],
    }
    if not _measures_logits(spec):
        verify["logits_skipped"] = ("pipeline parallel (pp > 1) on tier cpu: megatron-core's "
                                    "pipeline schedule allocates its receive buffers on CUDA")
    elif (ref_dir / "logits_checkpoint.pt").exists():
        logits = measure_logits(model, spec.model_size, spec.tier, device())
        figures = logits_figures(logits, ref_dir) if logits is not None else None
        # The asserted figure (harness/check/logits.py): the saved state written into this
        # model at the load topology; after the loaded model's pass, as it overwrites its state.
        written = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(written, compare.restore_from_reference(
            model.sharded_state_dict(metadata=metadata), reference))
        restored = measure_logits(model, spec.model_size, spec.tier, device())
        if figures is not None:
            figures["logits_at_load_topology"] = at_load_topology_figures(
                logits, restored, tensors_written=sum(written))
        if _measures_noise_floor(spec) and (ref_dir / "logits_checkpoint_fp32.pt").exists():
            fp32, error = fp32_pass(model, spec.model_size, device())  # last: model -> fp32
            if figures is not None:
                figures["noise_floor_figures"] = (
                    noise_floor_figures(restored, fp32, torch.load(ref_dir / "logits_checkpoint.pt"),
                                        torch.load(ref_dir / "logits_checkpoint_fp32.pt"))
                    if fp32 is not None else {"error": error or "fp32 logits not on this rank"})
        elif on_cuda(spec.tier) and figures is not None:
            err = ref_dir / "fp32_error.txt"
            figures["noise_floor_figures"] = {"error": (
                "not measured at pp > 1" if not _measures_noise_floor(spec)
                else err.read_text() if err.exists()
                else "no fp32 reference from the save (a save at pp > 1 measures none)")}
        # The logits live on one rank (tp 0, dp 0 of the last pipeline stage); rank 0 reports.
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, figures)
        verify.update(next((f for f in gathered if f), {}))
    else:
        verify["logits_skipped"] = ("no reference logits for this checkpoint (unpatched "
                                    "TEGroupedMLP reload drops amax, or a golden checkpoint)")
        if verify.get("mismatch_count"):
            verify["logits_effect"] = _state_logits_effect(model, spec, metadata, reference)
    clock.lap("verify")
    return {"durations": clock.durations, "clock_started_at": clock.started_at,
            "memory": peak_memory(), "verify": verify,
            "loaded": {"topology": spec.topology, "world_size": torch.distributed.get_world_size(),
                       "validated": spec.validate_sharding}}


def _state_logits_effect(model, spec: StageSpec, metadata, reference) -> dict | None:
    """What the differing state does to the quantized logits: the loaded model's NVFP4 logits
    against the same model after every differing tensor is set to the checkpoint's value.

    Answers whether a checkpoint that loads with placeholder or wrong amax still computes the
    same thing (tiers with NVFP4 fake quantization only; every rank takes part)."""
    from harness.rank.logits import measure_logits

    loaded = measure_logits(model, spec.model_size, spec.tier, device())
    written = compare.restore_from_reference(model.sharded_state_dict(metadata=metadata),
                                             reference)
    restored = measure_logits(model, spec.model_size, spec.tier, device())
    if loaded is None or "nvfp4" not in loaded:
        return None
    got, want = loaded["nvfp4"], restored["nvfp4"]
    finite = torch.isfinite(got) & torch.isfinite(want)
    diff = (got[finite] - want[finite]).abs().max().item() if finite.any() else None
    scale = want[finite].abs().max().item() if finite.any() else None
    return {
        "tensors_set_on_rank0": written,
        "nonfinite_loaded": int((~torch.isfinite(got)).sum()),
        "nonfinite_restored": int((~torch.isfinite(want)).sum()),
        "logits": got.numel(),
        "nvfp4_rel_max_abs": None if not scale else round(diff / scale, 6),
    }


def _record_sharding_stage(spec: StageSpec) -> dict:
    from harness.rank.record_sharding import record_stage

    return record_stage(spec)


STAGES = {Stage.SAVE: save_stage, Stage.LOAD: load_stage, Stage.DUMP_METADATA: _record_sharding_stage}


def configure_warnings() -> None:
    """The warning filters every stage runs under (``harness.rank`` and the warm pool alike)."""
    warnings.filterwarnings("ignore", category=UserWarning)  # megatron / TE import noise
    # ...but never the fix's back-compat notices (moe_ckpt_fix/legacy_load.py), which name experts.
    warnings.filterwarnings("always", message="moe-ckpt-fix")
