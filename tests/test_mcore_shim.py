"""The megatron-core shims (harness/model/mcore_shims.py) are version-gated: they define names
0.15.x/0.16.x use but forget, and touch nothing on a megatron-core that has them.

Runs under the reference .venv (0.19.2: both no-ops) and, for the 0.15 branch, under a layered
env: PYTHONPATH=. .venv-mo0.47.0-mc0.15.3/bin/python -m pytest tests/test_mcore_shim.py
"""
from __future__ import annotations

import importlib.metadata as md

import pytest

pytestmark = pytest.mark.cpu

ON_015 = md.version("megatron-core").startswith("0.15.")


def test_te_general_gemm_shim_only_where_the_name_is_missing():
    from megatron.core.transformer.moe import moe_utils

    from harness.model import mcore_shims

    had = "te_general_gemm" in vars(moe_utils)
    applied = mcore_shims.shim_te_general_gemm()
    assert applied == (not had)  # 0.15.3 and 0.16.1 lack it without TE; 0.19.2 has it
    assert moe_utils.te_general_gemm is None  # no TE on the cpu tier
    assert ("mcore-te_general_gemm" in mcore_shims.applied()) == (not had)


def test_a_tp_ep_config_builds_on_this_megatron_core():
    """Without the shim megatron-core 0.15.3 raises NameError: name 'warnings' is not defined
    for any TransformerConfig at EP > 1 and TP > 1 (the report's shape)."""
    from harness.model import mcore_shims
    from harness.model.gpt import transformer_config
    from harness.scenario.scenarios import load_all
    from harness.topology.topology import Topology

    size = next(s for s in load_all() if s.name == "gpu-witness").size
    cfg = transformer_config(Topology.parse("tp4-etp1-ep8"), size, "local")
    assert (cfg.tensor_model_parallel_size, cfg.expert_model_parallel_size) == (4, 8)
    assert ("mcore-0.15-model_parallel_config-warnings" in mcore_shims.applied()) == ON_015
