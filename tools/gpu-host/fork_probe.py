"""Which import of a GPU tier's fork preload leaves forked children unable to use CUDA.

For each module of the tier's ``fork_preload`` (harness/tiers.py), in order: import it, then fork
a child that reports torch's bad-fork state and tries one CUDA allocation. Run once with and once
without PYTORCH_NVML_BASED_CUDA_CHECK=1 (what the warm parent sets on CUDA tiers). One JSON line
per module. ``python tools/gpu-host/fork_probe.py [gpu-shared]``; run.sh mode fork-probe.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def probe_child() -> dict:
    """Fork a child: its bad-fork flag and whether a CUDA tensor can be made there."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        import torch

        out = {"bad_fork": bool(torch.cuda._is_in_bad_fork())}
        try:
            torch.ones(1, device="cuda").sum().item()
            out["cuda_ok"] = True
        except Exception as exc:  # noqa: BLE001 - the answer is the point
            out["cuda_ok"], out["error"] = False, f"{type(exc).__name__}: {str(exc)[:160]}"
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")


def main(tier: str) -> None:
    from harness.tiers import facts

    for name in facts(tier).fork_preload or ():
        importlib.import_module(name)
        torch = sys.modules.get("torch")
        print(json.dumps({"after": name, "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
                          "parent_cuda_initialized": bool(torch and torch.cuda.is_initialized()),
                          **probe_child()}), flush=True)


if __name__ == "__main__":
    from harness.tiers import Tier

    main(sys.argv[1] if len(sys.argv) > 1 else Tier.GPU_SHARED)
