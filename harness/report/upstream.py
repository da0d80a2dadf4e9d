"""``python -m harness upstream CELL --results R``: the skeleton of a standalone reproducer of one
failing cell of a results file (the layout of upstream/<finding>/repro.py, docs/upstream.md).

The skeleton imports only torch, megatron-core, ModelOpt and Transformer Engine, never this
repository: it builds the cell's model (the record's ``model`` sizes and modules, or the GPU
default a record without them ran), quantizes it with the cell's recipe, saves it at the save
topology (``--stage save``) and loads it at the load topology (``--stage load``) as Megatron-LM
resumes, and names the recorded failure (stage, exception type, failing key). Its exit codes are
the reproducers': 1 and ``REPRO: defect present: ...`` when the recorded exception type is raised,
0 and ``REPRO: defect absent`` when the stage passes, 2 on anything else. What a finding needs
beyond it (a fill of uninitialised memory, a bit-exact comparison, a second release) is added by
hand, and the reproducer says so.

Reads the results file as JSON only (no rank, no torch): the command runs in a fraction of a
second on any machine.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from harness.outcomes import Outcome, Patch
from harness.tiers import Backend

# The record's model keys that are megatron-core TransformerConfig fields of the same name
# (harness/model/modules.py CONFIG_FIELDS) and the GPU default of a record that names no model
# (harness/model/gpt.py GPU_SIZE, the size every GPU tier built before records named it).
CONFIG_FIELDS = ("moe_shared_expert_intermediate_size", "moe_router_score_function",
                 "moe_router_enable_expert_bias", "mtp_num_layers", "moe_latent_size")
GPU_DEFAULT_MODEL = {"kind": "gpt", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                     "ffn_hidden_size": 512, "moe_ffn_hidden_size": 256, "num_experts": 8,
                     "moe_router_topk": 2, "vocab_size": 128, "seq_length": 16,
                     "micro_batch_size": 2, "position_embedding_type": "learned_absolute"}
PASSING = (Outcome.PASS, Outcome.SKIPPED)  # a cell that is no finding
_TOPOLOGY = re.compile(r"^tp(\d+)-etp(\d+)-ep(\d+)(?:-pp(\d+))?$")


class SkeletonError(ValueError):
    """A results file or cell the skeleton cannot come from: one line."""


def parse_topology(text: str) -> dict:
    """``tp2-etp1-ep2-pp1`` -> {"tp": 2, "etp": 1, "ep": 2, "pp": 1}."""
    m = _TOPOLOGY.match(text or "")
    if not m:
        raise SkeletonError(f"{text!r} is not a topology of the form tpN-etpN-epN[-ppN]")
    tp, etp, ep, pp = (int(g) if g else 1 for g in m.groups())
    return {"tp": tp, "etp": etp, "ep": ep, "pp": pp}


def world_size(topo: dict) -> int:
    """Ranks of a topology: TP x PP x the data-parallel size, which ranks of megatron-core must
    make divisible by EP x ETP; the smallest such world."""
    dense = topo["tp"] * topo["pp"]
    expert = topo["ep"] * topo["etp"] * topo["pp"]
    world = dense
    while world % expert:
        world += dense
    return world


def read_results(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SkeletonError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SkeletonError(f"{path}: not a readable results file ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise SkeletonError(f"{path}: not a results file (no 'cells' list)")
    return doc


def find_cell(doc: dict, cell_id: str, path: Path) -> dict:
    cells = [c for c in doc["cells"] if isinstance(c, dict)]
    found = [c for c in cells if c.get("cell_id") == cell_id]
    if not found:
        failing = [c["cell_id"] for c in cells if c.get("outcome") not in PASSING][:3]
        hint = f"; failing cells there include {', '.join(failing)}" if failing else ""
        raise SkeletonError(f"{path}: no cell {cell_id!r}{hint}")
    cell = found[0]
    if cell.get("outcome") in PASSING:
        raise SkeletonError(f"{cell_id}: outcome {cell.get('outcome')!r}, not a failing cell")
    if cell.get("backend", Backend.TE.value) != Backend.TE:
        raise SkeletonError(f"{cell_id}: backend {cell.get('backend')!r}; the skeleton builds "
                            "Transformer Engine grouped experts (backend te) only")
    return cell


def facts(doc: dict, cell: dict, results_name: str) -> dict:
    """What the skeleton is made of, every value from the record."""
    save = parse_topology(cell.get("save_topology"))
    load = parse_topology(cell["load_topology"]) if cell.get("load_topology") else None
    message = (cell.get("message") or "").strip()
    first = next((line for line in reversed(message.splitlines()) if line.strip()), "")
    return {
        "cell_id": cell["cell_id"], "results": results_name,
        "versions": {k: v for k, v in (doc.get("versions") or {}).items()
                     if k not in ("gpu_count", "mcore_override")},  # the packages and the GPU
        "tier": cell.get("tier") or doc.get("tier"), "patch": cell.get("patch", Patch.NONE.value),
        "fix_parts": cell.get("fix_parts"),
        "recipe": cell.get("recipe") or "mtq:NVFP4_DEFAULT_CFG",
        "model": cell.get("model") or dict(GPU_DEFAULT_MODEL),
        "model_recorded": bool(cell.get("model")),
        "save_topology": save, "load_topology": load, "outcome": cell.get("outcome"),
        "failed_stage": cell.get("failed_stage"),
        "exception": cell.get("exception_type"), "failing_key": cell.get("failing_key"),
        "message": first[:300],
    }


def _header(f: dict) -> str:
    def topo(t):
        return f"tp{t['tp']}-etp{t['etp']}-ep{t['ep']}-pp{t['pp']}" if t else "none (save only)"

    versions = ", ".join(f"{k} {v}" for k, v in f["versions"].items()) or "not recorded"
    save_n = world_size(f["save_topology"])
    lines = [
        f"Skeleton of a standalone reproducer of the harness cell {f['cell_id']}",
        f"(results file {f['results']}), written by `python -m harness upstream`.",
        "",
        f"Recorded on: {versions}; tier {f['tier']}, patch {f['patch']}"
        + (f" (fix parts {', '.join(f['fix_parts'])})" if f["fix_parts"] else "") + ".",
        f"Recipe: {f['recipe']}.",
        f"Save topology: {topo(f['save_topology'])} ({save_n} ranks).",
        f"Load topology: {topo(f['load_topology'])}"
        + (f" ({world_size(f['load_topology'])} ranks)." if f["load_topology"] else "."),
        f"Model: {'as recorded' if f['model_recorded'] else 'the GPU default (the record names none)'}.",
        f"Recorded failure: outcome {f['outcome']}, stage {f['failed_stage']}, "
        f"{f['exception']}, key {f['failing_key']}.",
        f"  {f['message']}" if f["message"] else "  (no message recorded)",
        "",
        "    torchrun --nproc-per-node %d --rdzv-backend c10d --rdzv-endpoint localhost:0 \\" % save_n,
        "        repro.py --stage save --ckpt DIR",
    ]
    if f["load_topology"]:
        lines += [
            "    torchrun --nproc-per-node %d --rdzv-backend c10d --rdzv-endpoint localhost:0 \\"
            % world_size(f["load_topology"]), "        repro.py --stage load --ckpt DIR"]
    lines += ["", "Added by hand: nothing yet (say here what the finding needed beyond this)."]
    return '"""' + "\n".join(line.replace('"""', "'''").replace("\\", "\\\\")
                             for line in lines) + '\n"""\n'


_BODY = r'''
def init():
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    return backend


def finish(code, line):
    if dist.get_rank() == 0:
        print(line, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def build(topo):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel, gpt_layer_specs as specs
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=topo["tp"],
                                 pipeline_model_parallel_size=topo["pp"],
                                 expert_model_parallel_size=topo["ep"],
                                 expert_tensor_parallel_size=topo["etp"])
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    m = MODEL
    config = TransformerConfig(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"],
        num_attention_heads=m["num_attention_heads"], ffn_hidden_size=m["ffn_hidden_size"],
        moe_ffn_hidden_size=m["moe_ffn_hidden_size"], num_moe_experts=m["num_experts"],
        moe_router_topk=m["moe_router_topk"], moe_grouped_gemm=True,
        moe_token_dispatcher_type="allgather", moe_router_load_balancing_type="none",
        tensor_model_parallel_size=topo["tp"], pipeline_model_parallel_size=topo["pp"],
        expert_model_parallel_size=topo["ep"], expert_tensor_parallel_size=topo["etp"],
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, add_bias_linear=False, gradient_accumulation_fusion=False,
        gated_linear_unit=False, activation_func=torch.nn.functional.gelu,
        **{k: m[k] for k in CONFIG_FIELDS if k in m})
    spec = specs.get_gpt_layer_with_transformer_engine_spec(m["num_experts"], moe_grouped_gemm=True)
    extra = {}
    if m.get("mtp_num_layers"):
        extra["mtp_block_spec"] = specs.get_gpt_mtp_block_spec(config, spec,
                                                               use_transformer_engine=True)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=m["vocab_size"],
                     max_sequence_length=m["seq_length"], share_embeddings_and_output_weights=False,
                     position_embedding_type=m.get("position_embedding_type", "learned_absolute"),
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(), **extra)
    return model.cuda().eval()


def recipe_config():
    kind, _, target = RECIPE.partition(":")
    if kind == "mtq":
        import modelopt.torch.quantization as mtq
        return copy.deepcopy(getattr(mtq, target))
    from modelopt.recipe import load_recipe
    return load_recipe(target).quantize.model_dump()  # kind file: give the YAML's own path


def quantize(model):
    # At pp > 1 the calibration forward must go through megatron-core's pipeline schedule
    # (add it by hand); at pp 1 a plain forward under bf16 autocast.
    import modelopt.torch.quantization as mtq

    m = MODEL
    def loop(mod):
        for seed in range(3):
            g = torch.Generator().manual_seed(100 + seed)
            b, s = m["micro_batch_size"], m["seq_length"]
            tokens = torch.randint(0, m["vocab_size"], (b, s), generator=g).cuda()
            pos = torch.arange(s).unsqueeze(0).expand(b, s).cuda()
            mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).view(1, 1, s, s).cuda()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                mod(input_ids=tokens, position_ids=pos, attention_mask=mask)
    mtq.quantize(model, recipe_config(), loop)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("save", "load"), required=True)
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (outside any repository)")
    args = ap.parse_args()
    backend = init()
    from megatron.core import dist_checkpointing
    from modelopt.torch.opt.plugins import mcore_dist_checkpointing as mdc

    topo = SAVE if args.stage == "save" else LOAD
    if dist.get_rank() == 0:
        print(f"stage {args.stage} at {topo} on {dist.get_world_size()} ranks over {backend}")
    os.makedirs(args.ckpt, exist_ok=True)
    try:
        model = build(topo)
        if args.stage == "save":
            quantize(model)
            dist_checkpointing.save(model.sharded_state_dict(), args.ckpt)
            mdc.save_sharded_modelopt_state([model], args.ckpt)
        else:
            mdc.restore_sharded_modelopt_state([model], args.ckpt)
            loaded = dist_checkpointing.load(model.sharded_state_dict(), args.ckpt)
            model.load_state_dict(loaded, strict=True)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the verdict names what was raised
        text = str(exc)
        print(f"rank {dist.get_rank()}: {type(exc).__name__}: {text[-1500:]}", file=sys.stderr)
        if args.stage == FAILED_STAGE and EXCEPTION.rsplit(".", 1)[-1] in (
                f"{type(exc).__module__}.{type(exc).__name__} {text}"):
            key = re.search(r"key='([^']+)'", text) or re.search(r"for key (\S+)", text)
            finish(1, f"REPRO: defect present: {EXCEPTION.rsplit('.', 1)[-1]}: "
                      f"{key.group(1) if key else FAILING_KEY}")
        traceback.print_exc()
        finish(2, f"REPRO: unexpected: {type(exc).__name__}: {text[:200]}")
    dist.barrier()
    finish(0, f"REPRO: defect absent: the {args.stage} stage at {topo} passed")


if __name__ == "__main__":
    main()
'''


def skeleton(results: Path, cell_id: str) -> str:
    """The reproducer skeleton's text for ``cell_id`` of ``results``; SkeletonError: one line."""
    doc = read_results(results)
    f = facts(doc, find_cell(doc, cell_id, results), Path(results).name)
    constants = "\n".join([
        f"RECIPE = {f['recipe']!r}",
        f"MODEL = {f['model']!r}",
        f"CONFIG_FIELDS = {CONFIG_FIELDS!r}",
        f"SAVE = {f['save_topology']!r}",
        f"LOAD = {(f['load_topology'] or f['save_topology'])!r}",
        f"FAILED_STAGE = {f['failed_stage']!r}",
        f"EXCEPTION = {(f['exception'] or 'Exception')!r}",
        f"FAILING_KEY = {(f['failing_key'] or '-')!r}",
    ])
    imports = ("import argparse\nimport copy\nimport datetime\nimport os\nimport re\nimport sys\n"
               "import traceback\n\nimport torch\nimport torch.distributed as dist\n\n")
    return _header(f) + imports + constants + "\n\n" + _BODY
