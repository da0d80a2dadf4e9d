"""The megatron-core 0.15 cpu shim (harness/model/cpu_shims.py) is version-gated: it defines the
``te_general_gemm`` that 0.15.x's moe_utils forgets without TE, and touches nothing elsewhere."""
from __future__ import annotations

import importlib.metadata as md

import pytest

pytestmark = pytest.mark.cpu


def test_the_015_shim_applies_only_where_megatron_core_lacks_the_name():
    from megatron.core.transformer.moe import moe_utils

    from harness.model.cpu_shims import mcore_0_15_shim

    had = "te_general_gemm" in vars(moe_utils)
    applied = mcore_0_15_shim()
    if md.version("megatron-core").startswith("0.15."):  # run under .venv-mo0.47.0-mc0.15.3
        assert applied or had
        assert moe_utils.te_general_gemm is None
    else:
        assert not applied and had  # 0.16+ define it themselves (None without TE)
        assert not getattr(moe_utils, "_harness_shimmed", False)
