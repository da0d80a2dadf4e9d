"""One process, no torchrun (``python -m harness.rank.recipe_survey``): every recipe the installed
ModelOpt ships, found by walking it (its ``mtq.*_CFG`` constants and every recipe file of its
built-in library, ``modelopt_recipes/``), put on the cpu tier's model by ModelOpt itself; for
each that quantizes routed-expert weights, the amax kinds its configuration forecasts per module
family, and what a real calibration on that model made or ModelOpt's refusal. One JSON document
on stdout; ``python -m harness recipes`` (harness/report/recipes.py) prints it as a table.

Why: a new ModelOpt release must be enumerated without a code change, and a recipe ModelOpt
refuses on this model is a named outcome, not ``rule-unknown``. The cpu tier has no Transformer
Engine: its experts are megatron-core's SequentialMLP (backend local), so what ModelOpt does to
TE grouped experts (TEGroupedMLP) needs a GPU save to confirm; every row says which is which.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

SURVEY_TOPOLOGY = "tp1-etp1-ep1"
# The cpu model with a shared expert beside the routed ones: every module family is there.
SHARED_EXPERT_SIZE = 64
PREFIX = "RECIPE_SURVEY "  # the line of stdout the controller reads


def mtq_constants() -> list[str]:
    """Every ``modelopt.torch.quantization`` constant named ``*_CFG`` that is a quantize config."""
    import modelopt.torch.quantization as mtq

    return [f"mtq:{n}" for n in sorted(dir(mtq))
            if n.endswith("_CFG") and isinstance(getattr(mtq, n), dict) and "quant_cfg" in getattr(mtq, n)]


def library_files() -> list[str]:
    """Every recipe file of the built-in library, as a ``modelopt:`` reference: its YAML files
    outside ``configs/`` (the config fragments recipes import; their model presets are the
    ``mtq`` constants), each a recipe ``modelopt.recipe.load_recipe`` reads."""
    from harness.model.recipes import builtin_library

    root = builtin_library()
    refs = []
    for path in sorted(root.rglob("*.y*ml")) if root else []:
        rel = path.relative_to(root)
        if rel.parts[0] != "configs" and path.suffix in (".yaml", ".yml"):
            refs.append(f"modelopt:{rel.with_suffix('').as_posix()}")
    return refs


def survey_model():
    """The cpu tier's model (local spec) with a shared expert, at one rank."""
    import dataclasses

    from harness.model.gpt import CPU_SIZE, build_gpt
    from harness.tiers import Backend
    from harness.topology.topology import Topology

    size = dataclasses.replace(CPU_SIZE, moe_shared_expert_intermediate_size=SHARED_EXPERT_SIZE)
    return build_gpt(Topology.parse(SURVEY_TOPOLOGY), size, Backend.LOCAL), size


def weight_quantizers(model):
    """(name, quantizer) of every enabled weight quantizer, a SequentialQuantizer's stages each."""
    from harness.model.quant import tensor_quantizers

    return [(n, q) for n, q in tensor_quantizers(model) if "weight_quantizer" in n and q.is_enabled]


def configured_kinds(quant_cfg, only_named: bool = False) -> dict[str, list[str]]:
    """Per module family, the amax kinds ModelOpt's own matching (``set_quantizer_by_cfg``)
    configures the survey model's enabled weight quantizers for. ``only_named``: with every
    quantizer disabled first, so a quantizer counts only where the config itself enables it
    (a KV-cache config leaves the weights at ModelOpt's defaults without naming them)."""
    from modelopt.torch.quantization.conversion import replace_quant_module, set_quantizer_by_cfg

    from harness.model.quant import configured_kind
    from harness.model.recipes import module_family

    model, _ = survey_model()
    replace_quant_module(model)
    if only_named:
        quant_cfg = [{"quantizer_name": "*", "enable": False}, *quant_cfg]
    set_quantizer_by_cfg(model, quant_cfg)
    found: dict[str, set[str]] = {}
    for name, q in weight_quantizers(model):
        found.setdefault(module_family(name), set()).add(configured_kind(q))
    return {k: sorted(v) for k, v in sorted(found.items())}


FORECAST_ONLY = "--forecast-only"  # the kinds its configuration makes, no calibration


def survey_one(ref: str, forecast_only: bool = False) -> dict:
    """One recipe: why it is left out (not a PTQ recipe, no routed-expert weight quantized), or
    its forecast kinds per family and what calibrating it on the cpu model made (``calibrated``)
    or ModelOpt's refusal there (``refused``; ``needs_gpu`` where it asks for CUDA or triton)."""
    import torch

    from harness.model.quant import NotQuantizable, amax_kinds, quantize
    from harness.model.recipes import EXPERTS, Recipe, RecipeError, quant_config
    from harness.paths import REPO_ROOT

    row: dict = {"recipe": ref}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            config = quant_config(Recipe.parse(ref), REPO_ROOT)
    except RecipeError as exc:
        return {**row, "left_out": str(exc).removeprefix(f"{ref}: ")}
    except Exception as exc:  # noqa: BLE001  (a library file that is no recipe, or broken)
        # the library's own path, not the machine's: the same words on every machine
        said = re.sub(r"\S*/(?=modelopt_recipes/)", "", str(exc))
        return {**row, "left_out": f"not loadable: {type(exc).__name__}: {said[:200]}"}
    row["algorithm"] = _algorithm(config.get("algorithm"))
    if EXPERTS not in configured_kinds(config["quant_cfg"], only_named=True):
        return {**row, "left_out": "quantizes no routed-expert weight"}
    row["forecast"] = configured_kinds(config["quant_cfg"])
    if forecast_only:
        return row
    model, size = survey_model()
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantize(model, size, torch.device("cpu"), ref)
        row["calibrated"] = amax_kinds(model)
    except NotQuantizable as exc:
        row["refused"] = str(exc).splitlines()[0][:300]
        row["needs_gpu"] = any(w in str(exc).lower() for w in ("cuda", "triton"))
    except Exception as exc:  # noqa: BLE001  (not ModelOpt's: the harness's model; one row says it)
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def _algorithm(algorithm) -> str:
    if isinstance(algorithm, dict):
        return str(algorithm.get("method"))
    if isinstance(algorithm, list):
        return "+".join(_algorithm(a) for a in algorithm)
    return str(algorithm)


class SurveyImpossible(RuntimeError):
    """This machine's ModelOpt converts none of the survey model's megatron-core linears."""


def _check_the_plugin_converts(version: str) -> None:
    """Refuse, in one line, where ModelOpt's Megatron plugin did not register: every recipe would
    then read as "quantizes no routed-expert weight", a false forecast. ModelOpt 0.48.0rc1's
    plugin imports megatron.core.extensions.transformer_engine at its top
    (modelopt/torch/quantization/plugins/megatron.py:33), so without Transformer Engine (the cpu
    tier) ``import_plugin("megatron")`` skips it and nothing is converted."""
    from modelopt.torch.quantization.conversion import replace_quant_module

    model, _ = survey_model()
    with contextlib.redirect_stdout(io.StringIO()):
        replace_quant_module(model)
    if not list(weight_quantizers(model)):
        raise SurveyImpossible(
            f"ModelOpt {version} converted none of megatron-core's linear layers here (its Megatron "
            "plugin did not register: without Transformer Engine it does not import), so its "
            "matching cannot be surveyed on this machine; run `python -m harness recipes` on a "
            "GPU host with Transformer Engine")


def main(refs: list[str], forecast_only: bool = False) -> dict:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch.distributed as dist

    from harness.model.cpu_shims import apply_cpu_shims
    from harness.rank.setup import init_rank
    from harness.tiers import Tier
    from harness.topology.topology import Topology

    apply_cpu_shims()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        init_rank(Topology.parse(SURVEY_TOPOLOGY), Tier.CPU, 120)
        import modelopt

        _check_the_plugin_converts(modelopt.__version__)
        rows = [survey_one(ref, forecast_only) for ref in (refs or mtq_constants() + library_files())]
        dist.destroy_process_group()
    return {"modelopt": modelopt.__version__, "model": "cpu tier: local spec, SequentialMLP "
            f"experts, a shared expert, {SURVEY_TOPOLOGY}", "rows": rows}


SURVEY_MODULE = "harness.rank.recipe_survey"
SURVEY_TIMEOUT_S = 1800.0


def in_own_process(refs: list[str], forecast_only: bool = False,
                   timeout_s: float = SURVEY_TIMEOUT_S) -> dict:
    """The survey's document from ``python -m harness.rank.recipe_survey`` in a process of its
    own, bounded (its whole group killed past ``timeout_s``): it builds the cpu model, initialises
    a process group and calibrates, none of which the calling controller should hold. The one
    launcher for ``python -m harness recipes`` and a job's own recipe file (report/jobs.py)."""
    import subprocess

    from harness.bounded import run
    from harness.paths import REPO_ROOT

    # the repository first, the caller's PYTHONPATH kept: a ModelOpt release put ahead of the
    # base one there (tools/matrix-env.sh, system mode) is the one surveyed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", SURVEY_MODULE, *([FORECAST_ONLY] if forecast_only else []), *refs]
    done = run(argv, timeout_s, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True)
    line = next((l for l in (done.stdout or "").splitlines() if l.startswith(PREFIX)), None)
    if done.timed_out:
        raise RuntimeError(f"the recipe survey ran past {timeout_s:.0f} s")
    if done.returncode != 0 or line is None:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the recipe survey failed (exit {done.returncode}): {tail[0]}")
    return json.loads(line[len(PREFIX):])


if __name__ == "__main__":
    args = sys.argv[1:]
    try:
        doc = main([a for a in args if a != FORECAST_ONLY], FORECAST_ONLY in args)
    except SurveyImpossible as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    print(PREFIX + json.dumps(doc), flush=True)
