"""Where each expert-TP rank's static NVFP4 block amax sits in the expert's whole ``(N, 1)``
(ModelOpt's ETP-1 order): cutting a rank's part out and putting the parts back together. Pure
tensor arithmetic for part (f) (static_block.py); torch is imported when called."""
from __future__ import annotations


def _grid_pieces(full, rows: int, axis: int, halves: int, size: int):
    """``full`` (the expert's ``(N, 1)`` block amax in ETP-1 order) viewed so that index
    ``[:, r]`` is expert-TP rank r's local ``(rows, N / rows / size)`` grid (its own order):
    fc1 (axis 0) ``(halves, size, rows / halves, c)``: rank r holds row block r of every half
    (``[W_r; V_r]`` of a gated unit); fc2 (axis 1) ``(rows, size, c)``: its column block r."""
    c = full.numel() // (rows * size)
    if axis == 0:
        return full.view(halves, size, rows // halves, c)
    return full.view(rows, size, c)


def local_part(full, rows: int, axis: int, halves: int, rank: int, size: int):
    """Expert-TP rank ``rank`` of ``size``'s block amax ``(N / size, 1)``, in its local weight's
    row-major block order, cut from the whole expert's ``full`` ``(N, 1)``."""
    return _grid_pieces(full, rows, axis, halves, size)[:, rank].reshape(-1, 1).clone()


def whole_from_parts(parts, rows: int, axis: int, halves: int):
    """Inverse of ``local_part``: the expert's ``(N, 1)`` in ETP-1 order from every rank's part
    (expert-TP rank order)."""
    import torch

    size = len(parts)
    full = torch.empty((parts[0].numel() * size, 1), dtype=parts[0].dtype, device=parts[0].device)
    grid = _grid_pieces(full, rows, axis, halves, size)
    c = grid.shape[-1]
    for r, p in enumerate(parts):
        grid[:, r] = p.reshape(halves, rows // halves, c) if axis == 0 else p.reshape(rows, c)
    return full
