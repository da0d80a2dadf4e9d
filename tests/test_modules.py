"""The Nemotron-3 modules as [model] keys (harness/model/modules.py).

Why: the quarantined jobs checkpoint shared experts, a sigmoid router's expert_bias and MTP
layers that the plain GPT MoE does not have. The cpu tier builds the local-spec ones for real on
2 gloo ranks, saves, reloads at another topology and must hold every module tensor; a bad key is
one line in a scenario file's words; a hybrid Mamba cell without mamba-ssm is skipped with one
line while the other cells go on; and a model without the modules is the model it always was.
"""
from __future__ import annotations

import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest

from harness.model.gpt import GOLDEN_SIZE, GPU_SIZE, MODULE_FIELDS, ModelSize
from harness.paths import GOLDEN_DIR, REPO_ROOT, SCENARIO_DIR
from harness import machine
from harness.scenario.scenarios import ScenarioError, load_scenario
from tests.helpers import bounded

pytestmark = pytest.mark.cpu

CPU = 'tier = "cpu"\nbackend = "local"\n'
TE = 'tier = "gpu-shared"\nbackend = "te"\n'
SAVES = 'saves = ["tp1-etp1-ep1"]\n'
SIGMOID_BIAS = 'moe_router_score_function = "sigmoid"\nmoe_router_enable_expert_bias = true\n'
HYBRID = 'kind = "hybrid"\nnum_layers = 4\nhybrid_layer_pattern = "M*ME"\n'


def _refused(tmp_path, body: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text and text.startswith(f"{path}: "), text
    return text


BAD = [  # id, file body, the words of its one line
    ("kind", CPU + SAVES + '[model]\nkind = "mamba"\n', ["model.kind: 'mamba' is not one of gpt, hybrid"]),
    ("score-function", CPU + SAVES + '[model]\nmoe_router_score_function = "tanh"\n',
     ["model.moe_router_score_function: 'tanh' is not one of softmax, sigmoid, sqrtsoftplus"]),
    ("expert-bias-string", CPU + SAVES + '[model]\nmoe_router_enable_expert_bias = "yes"\n',
     ["model.moe_router_enable_expert_bias: expected true or false, got string 'yes'"]),
    ("shared-zero", CPU + SAVES + "[model]\nmoe_shared_expert_intermediate_size = 0\n",
     ["model.moe_shared_expert_intermediate_size: must be > 0, got 0"]),
    ("mtp-string", CPU + SAVES + '[model]\nmtp_num_layers = "1"\n',
     ["model.mtp_num_layers: expected an integer, got string '1'"]),
    ("pattern-symbol", TE + SAVES + '[model]\nkind = "hybrid"\nhybrid_layer_pattern = "MXE"\n',
     ["model.hybrid_layer_pattern: 'MXE' must be a layer pattern of megatron-core's symbols"]),
    # megatron-core transformer/transformer_config.py:2284: expert bias needs sigmoid or sqrtsoftplus
    ("expert-bias-softmax", CPU + SAVES + "[model]\nmoe_router_enable_expert_bias = true\n",
     ["model.moe_router_enable_expert_bias: true needs moe_router_score_function 'sigmoid' or "
      "'sqrtsoftplus', got 'softmax'", "transformer_config.py:2284"]),
    # transformer/moe/moe_layer.py:266: the latent projections are TELinear
    ("latent-local", CPU + SAVES + "[model]\nmoe_latent_size = 32\n",
     ["model.moe_latent_size: needs backend 'te'", "moe_layer.py:266"]),
    ("hybrid-local", CPU + SAVES + "[model]\n" + HYBRID, ["model.kind: 'hybrid' needs backend 'te'"]),
    ("pattern-without-hybrid", TE + SAVES + '[model]\nhybrid_layer_pattern = "M*ME"\n',
     ['model.hybrid_layer_pattern: only with kind = "hybrid"']),
    ("pattern-length", TE + SAVES + '[model]\nkind = "hybrid"\nhybrid_layer_pattern = "M*ME"\n',
     ["model.num_layers: 2, but hybrid_layer_pattern 'M*ME' has 4 layers"]),
    ("pattern-no-moe", TE + SAVES + '[model]\nkind = "hybrid"\nhybrid_layer_pattern = "M*"\n',
     ["model.hybrid_layer_pattern: 'M*' has no MoE layer 'E'"]),
    ("pattern-mtp-depths", TE + SAVES + '[model]\nkind = "hybrid"\nhybrid_layer_pattern = "ME/*E"\n',
     ["model.mtp_num_layers: None, but hybrid_layer_pattern 'ME/*E' has 1 MTP depths"]),
    ("mamba-heads", TE + SAVES + "[model]\n" + HYBRID + "hidden_size = 128\n",
     ["model.hidden_size: 128 gives 4 Mamba heads", "mamba_mixer.py:248"]),
    # the shared expert MLP is split over TP (tensor_parallel/layers.py:965)
    ("shared-tp", CPU + 'saves = ["tp4-etp1-ep1"]\n[model]\nmoe_shared_expert_intermediate_size = 6\n',
     ["saves[0]: topology tp4-etp1-ep1-pp1 cannot run",
      "moe_shared_expert_intermediate_size 6 is not divisible by tp 4"]),
    # hybrid_layer_allocation.py:459-464: the '|' segments split evenly over pp
    ("pattern-pp", TE + 'saves = ["tp1-etp1-ep1-pp2"]\n[model]\nkind = "hybrid"\nnum_layers = 3\n'
     'hybrid_layer_pattern = "M*|E|E"\n', ["its 3 '|' segments are not divisible by pp 2"]),
    # a position embedding megatron-core does not take from a scenario (modules.py POSITION_EMBEDDINGS)
    ("position-rope", CPU + SAVES + '[model]\nposition_embedding_type = "rope"\n',
     ["model.position_embedding_type", "learned_absolute", "none"]),
]


@pytest.mark.parametrize("body, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_module_key_is_one_line(tmp_path, body, words):
    text = _refused(tmp_path, body)
    for w in words:
        assert w in text, text


def test_module_keys_are_read_into_the_model(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text(TE + 'saves = ["tp2-etp1-ep2"]\n[model]\nmoe_shared_expert_intermediate_size = 512\n'
                    + SIGMOID_BIAS + "mtp_num_layers = 1\nmoe_latent_size = 128\n")
    size = load_scenario(path).size
    assert (size.moe_shared_expert_intermediate_size, size.moe_router_score_function,
            size.moe_router_enable_expert_bias, size.mtp_num_layers, size.moe_latent_size) == (
        512, "sigmoid", True, 1, 128)
    assert size.hidden_size == GPU_SIZE.hidden_size  # the backend's default size underneath


def test_a_model_without_modules_is_the_model_it_was():
    """spec.json, golden manifests and save ids (a hash of the repr) of every existing scenario
    stay byte for byte: no module field appears unless it is on."""
    for size in (ModelSize(), GPU_SIZE, GOLDEN_SIZE):
        assert not set(MODULE_FIELDS) & set(size.as_dict())
        assert repr(size) == "ModelSize(" + ", ".join(f"{k}={v!r}" for k, v in size.as_dict().items()) + ")"
    for manifest in GOLDEN_DIR.glob("*/manifest.json"):
        import json

        recorded = json.loads(manifest.read_text())["size"]
        assert ModelSize(**recorded).as_dict() == recorded, manifest
    on = ModelSize(mtp_num_layers=1)
    assert on.as_dict()["mtp_num_layers"] == 1 and on != ModelSize() and repr(on) != repr(ModelSize())


def _hybrid_scenario(tmp_path) -> Path:
    path = tmp_path / "hybrid.toml"
    path.write_text('name = "hybrid"\n' + TE + 'patch = "fix"\nsaves = ["tp1-etp1-ep2"]\n'
                    'loads = ["tp2-etp1-ep2"]\n[model]\n' + HYBRID)
    return path


def test_without_mamba_ssm_a_hybrid_cell_is_skipped_with_one_line(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mamba_ssm" else real(name, *a))
    size = load_scenario(_hybrid_scenario(tmp_path)).size
    reason = machine.model_skip_reason(size)
    assert reason.startswith("needs mamba-ssm: ") and "\n" not in reason and "mamba_mixer.py" in reason
    monkeypatch.setattr(machine, "tier_skip_reason", lambda *a: None)  # a GPU host without it
    assert machine.skip_reason("gpu-shared", 2, size) == reason
    assert machine.skip_reason("gpu-shared", 2, GPU_SIZE) is None  # the other cells go on
    assert machine.model_skip_reason(ModelSize(kind="hybrid", hybrid_layer_pattern="*E")) is None  # no Mamba


def test_a_megatron_core_without_hybrid_model_skips_a_hybrid_cell_with_one_line(tmp_path, monkeypatch):
    """megatron-core 0.16.1 ships models/mamba/ (MambaModel), not models/hybrid/: a hybrid cell
    there is skipped naming the missing files, not failed deep in its stage."""
    size = load_scenario(_hybrid_scenario(tmp_path)).size
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # mamba-ssm and einops "installed"
                        lambda name, *a: object() if name in ("mamba_ssm", "einops") else real(name, *a))
    monkeypatch.setattr(machine, "_megatron_core_dir", lambda: tmp_path)  # a release without them
    reason = machine.model_skip_reason(size)
    assert "\n" not in reason and reason.count("does not have") == 2
    assert "megatron/core/models/hybrid/hybrid_model.py" in reason
    assert "megatron/core/post_training/modelopt/hybrid/model_specs.py" in reason
    assert machine.model_skip_reason(GPU_SIZE) is None  # a plain GPT needs neither
    (tmp_path / "models/hybrid").mkdir(parents=True)
    (tmp_path / "models/hybrid/hybrid_model.py").write_text("")
    (tmp_path / "post_training/modelopt/hybrid").mkdir(parents=True)
    (tmp_path / "post_training/modelopt/hybrid/model_specs.py").write_text("")
    assert machine.model_skip_reason(size) is None


def test_the_installed_megatron_core_is_found():
    core = machine._megatron_core_dir()
    assert core is not None and (core / "models/hybrid/hybrid_model.py").is_file()  # 0.19.2 here
    assert core.name == "core" and (core / "__init__.py").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mamba_ssm") is not None, reason="mamba-ssm is installed here")
def test_pytest_collects_a_hybrid_scenario_and_skips_its_cells_with_one_line(tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "hybrid.toml").write_text(_hybrid_scenario(tmp_path).read_text())
    (d / "gpu_modules.toml").write_text((SCENARIO_DIR / "gpu_modules.toml").read_text())
    env = {**os.environ, "HARNESS_SCENARIO_DIR": str(d)}
    env.pop("PYTEST_ADDOPTS", None)
    r = bounded([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rs",
                 "--results-root", str(tmp_path / "results"), "tests/test_cells.py"],
                300, cwd=REPO_ROOT, env=env)
    assert r.returncode == 0 and "5 skipped" in r.stdout, r.stdout + r.stderr
    # pytest groups equal reasons: gpu-modules' 3 cells (the tier's), the hybrid's 2 (+ mamba-ssm)
    skips = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 2 and "needs mamba-ssm" not in skips[0] and skips[0].startswith("SKIPPED [3]")
    assert skips[1].startswith("SKIPPED [2]") and "; needs mamba-ssm: " in skips[1], r.stdout


def _modelopt_quantizes_mtp() -> bool:
    """False where NVFP4_DEFAULT_CFG turns off every quantizer under ``mtp.`` (0.47.0 does:
    ``{"quantizer_name": "mtp.*", "enable": False}``)."""
    import modelopt.torch.quantization as mtq

    cfg = mtq.NVFP4_DEFAULT_CFG["quant_cfg"]
    entries = cfg if isinstance(cfg, list) else [
        {"quantizer_name": k, **(v if isinstance(v, dict) else {})} for k, v in cfg.items()]
    return not any(e.get("quantizer_name") == "mtp.*" and e.get("enable") is False for e in entries)


CPU_MODULES = f"""name = "cpu-modules"
{CPU}expect = "pass"
saves = ["tp1-etp1-ep2"]
loads = ["tp1-etp1-ep1-pp1-w2"]
# no known_gaps: the local spec's LayerNorm input-quantizer amax is backend local's own gap
# (harness/check/gaps.py)

[model]
moe_shared_expert_intermediate_size = 96
{SIGMOID_BIAS}mtp_num_layers = 1
"""


@pytest.mark.slow  # every module in one real save/load; the MTP model at pp2 stays (tests/test_mtp_pp.py)
def test_cpu_tier_saves_and_reloads_every_local_spec_module(tmp_path):
    """Shared experts, sigmoid router with expert bias and one MTP layer, built by megatron-core's
    local spec on 2 gloo ranks: saved at tp1-etp1-ep2, reloaded at ep1 dp2, every tensor and the
    logits intact; the checkpoint holds each module's keys."""
    import torch

    from harness.rank.compare import load_reference
    from harness.golden.storage import read_metadata
    from harness.run.cells import run_cells

    reason = machine.tier_skip_reason("cpu", 2)  # e.g. Transformer Engine installed here
    if reason:
        pytest.skip(reason)
    path = tmp_path / "cpu_modules.toml"
    path.write_text(CPU_MODULES)
    scenario = load_scenario(path)
    doc = run_cells(scenario.cells(), tmp_path / "results", "modules", jobs=1, out=io.StringIO())
    outcomes = {c["cell_id"]: (c["outcome"], c["message"]) for c in doc["cells"]}
    assert [o for o, _ in outcomes.values()] == ["pass", "pass"], outcomes

    save = next((tmp_path / "results").glob("*/saves/*"))
    _, tensors = read_metadata(save / "ckpt")
    layers = scenario.size.num_layers
    for layer in range(layers):
        shared = f"decoder.layers.{layer}.mlp.shared_experts.linear_fc1."
        assert tensors[shared + "weight"] == ("torch.float32", (96, 64))
        assert tensors[shared + "weight_quantizer._amax"] == ("torch.float32", (1,))  # quantized
        # megatron-core transformer/moe/router.py:188-195: fp32, one entry per expert, replicated
        assert tensors[f"decoder.layers.{layer}.mlp.router.expert_bias"] == ("torch.float32", (8,))
    mtp = sorted(k for k in tensors if k.startswith("mtp.layers.0."))
    assert any(".mlp.router.expert_bias" in k for k in mtp) and any(".mlp.shared_experts." in k for k in mtp)
    assert any(".mlp.experts." in k and k.endswith("linear_fc1.weight") for k in mtp), mtp
    # ModelOpt's own NVFP4 default decides whether the MTP layers carry quantizer state
    assert _modelopt_quantizes_mtp() == any("quantizer" in k for k in mtp), mtp

    reference, disagreeing = load_reference(save / "reference")
    bias = reference["decoder.layers.0.mlp.router.expert_bias"]
    assert bias.dtype == torch.float32 and bias.abs().min() > 0  # seeded as training leaves it
    assert not [k for k in disagreeing if "expert_bias" in k]  # every replica holds the same
    logits = torch.load(save / "reference" / "logits_checkpoint.pt")["plain"]
    assert tuple(logits.shape) == (2, 16, 128)  # the main head's logits, not the MTP chunks
    load = next(c for c in doc["cells"] if c["load_topology"])
    assert load["verify"]["mismatch_count"] == 0 and load["verify"]["routing_flips"] == 0
