"""Which GPUs each pytest-xdist worker owns, and the device list a controller may hand out.

Why: cells of two workers on one GPU make NCCL ranks fight over a device, so every worker gets
a DISJOINT block of the visible GPUs through ``CUDA_VISIBLE_DEVICES``, set before anything
initialises CUDA (conftest.py). This module imports neither torch nor CUDA.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Sequence, Union


Gpus = Union[int, Sequence[str], str]

"""A GPU count, a list of device ids, or a ``CUDA_VISIBLE_DEVICES``-style string."""


def visible_gpus(gpus: Gpus | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Device ids the pool may hand out.

    ``None`` reads ``CUDA_VISIBLE_DEVICES`` (unset: no GPUs, since this module must not ask CUDA);
    an int ``n`` means devices ``0..n-1``; a string is parsed like ``CUDA_VISIBLE_DEVICES``
    (indices, ``GPU-<uuid>`` or ``MIG-<uuid>``; an empty string or ``-1`` hides every GPU).
    """
    if gpus is None:
        env = os.environ if environ is None else environ
        gpus = env.get("CUDA_VISIBLE_DEVICES", "")
    if isinstance(gpus, int):
        if gpus < 0:
            raise ValueError(f"GPU count must be >= 0 (got {gpus})")
        return [str(i) for i in range(gpus)]
    if isinstance(gpus, str):
        out = []
        for item in (p.strip() for p in gpus.split(",")):
            # CUDA stops at the first invalid entry; "-1" is the usual way to hide all GPUs.
            if not item or item.startswith("-"):
                break
            out.append(item)
        return out
    return [str(g) for g in gpus]


def plural_gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


_WORKER_RE = re.compile(r"^gw(\d+)$")


def worker_visible_devices(worker_id: str, n_gpus: Gpus, n_workers: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for one pytest-xdist worker: a disjoint block of the GPUs.

    Called from a conftest hook before anything initialises CUDA (CUDA reads the variable once).
    ``worker_id`` is xdist's ``gw<k>``; ``"master"`` (no xdist) gets every GPU. ``n_gpus`` is a
    count or the parent's visible device list. G GPUs over W workers gives blocks of G // W,
    the first G % W workers one more. No GPUs gives ``""`` (cpu tests hide the devices). More
    workers than GPUs cannot be disjoint and raises, naming the fix.
    """
    devices = visible_gpus(n_gpus)
    if worker_id in ("master", "", None):
        return ",".join(devices)
    m = _WORKER_RE.match(worker_id)
    if not m:
        raise ValueError(f"not a pytest-xdist worker id: {worker_id!r} (expected gw0, gw1, ...)")
    k = int(m.group(1))
    if n_workers < 1 or k >= n_workers:
        raise ValueError(f"worker {worker_id} is outside {n_workers} workers")
    if not devices:
        return ""
    g = len(devices)
    if n_workers > g:
        raise ValueError(
            f"{n_workers} xdist workers for {plural_gpus(g)}: each worker needs a GPU of its own; "
            f"run with -n {g} or fewer"
        )
    base, extra = divmod(g, n_workers)
    first = k * base + min(k, extra)
    width = base + (1 if k < extra else 0)
    return ",".join(devices[first:first + width])
