# Test for the change in modelopt.diff, to sit in Model-Optimizer's
# tests/gpu_megatron/torch/quantization/plugins/ beside the Megatron plugin tests. There it would
# use the suite's own multiprocess helpers; here it launches the standalone reproducer beside it
# with torchrun (2 ranks, gloo when they share one GPU), so it runs against an installed ModelOpt
# with nothing else checked out. Fails on stock 0.48.0rc1 / 0.47.0, passes with the change.
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPRO = Path(__file__).with_name("repro.py")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _torchrun(tmp_path, *args):
    script = tmp_path / "repro.py"  # outside any checkout: only installed packages import
    shutil.copy(REPRO, script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script), *args]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=os.environ.copy())  # the host's own packages; no checkout
    verdict = [l for l in done.stdout.splitlines() if l.startswith("REPRO:")]
    return done.returncode, (verdict or ["(no verdict)"])[-1], done.stdout + done.stderr


@pytest.mark.parametrize(("save_etp", "load_etp"), [(1, 2), (2, 1)])
def test_static_nvfp4_expert_amax_reshards_across_expert_tp(tmp_path, save_etp, load_etp):
    rc, verdict, log = _torchrun(tmp_path, "--save-etp", str(save_etp), "--load-etp",
                                 str(load_etp))
    assert rc == 0 and "defect absent" in verdict, f"{verdict}\n{log[-3000:]}"
