"""Static NVFP4 expert block amax through a real torch_dist save at one expert TP and load at another.

Tier cpu, 4 gloo ranks (tests/rank_programs/static_block_reshard.py; one run, ~30 s). Expected
values come from the full weights and megatron-core's layout of an expert weight over expert TP,
written here independently of the fix: a rank at expert-TP rank r of E holds the r-th row block
of fc1 (of each of the W and V halves of a gated unit) and the r-th column block of fc2, and a
block of 16 lies in one row, so its amax is the per-block max|W| of the whole expert's grid at
those rows or columns. What a checkpoint stores is ModelOpt's ETP-1 format whatever the ETP of
the save: per expert one ``(N, 1)`` block amax, the whole expert's grid in row-major block order
(a gated fc1's ``[W; V]`` rows), float32, and the scalar ``_global_amax`` (the whole weight's
max|W|, reduced over the expert TP group at the save). So an unpatched job at ETP 1 reads what
the fix wrote at ETP 2. The controls are ModelOpt's own declaration (what 0.47.0 and 0.48.0rc1
write and ask for) at ETP 2: its fc2 is refused with the GPU runs' "Global shape mismatch", its
gated fc1 loads other rows.
"""
from __future__ import annotations

import pytest
import torch

from harness.launch.stages import run_module_stage
from harness.topology.coords import rank_coords
from harness.topology.topology import Topology
from tests.rank_programs import static_block_reshard as prog

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = tmp_path_factory.mktemp("static-block")
    run = run_module_stage("static-block-reshard", d / "stage", prog.WORLD, [str(d / "ckpts")], 300,
                           "tests.rank_programs.static_block_reshard")
    assert run.ok, run.summary()
    return d / "ckpts"


def expected(layer: int, linear: str, expert: int, etp_rank: int, etp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(local weight, local block amax (numel / 16, 1)) at expert-TP rank ``etp_rank`` of ``etp``."""
    w = prog.full_weight(layer, linear, expert)
    grid = w.abs().reshape(w.shape[0], -1, prog.BLOCK).amax(dim=2)  # (rows, cols / 16)

    def rows(t, lo, n):
        return t[lo:lo + n]

    if linear == "linear_fc2":
        n, nb = w.shape[1] // etp, grid.shape[1] // etp
        return w[:, etp_rank * n:(etp_rank + 1) * n], grid[:, etp_rank * nb:(etp_rank + 1) * nb].reshape(-1, 1)
    halves = (0, w.shape[0] // 2) if prog.LAYERS[layer][1] else (0,)
    n = (w.shape[0] // len(halves)) // etp
    return (torch.cat([rows(w, h + etp_rank * n, n) for h in halves]),
            torch.cat([rows(grid, h + etp_rank * n, n) for h in halves]).reshape(-1, 1))


def whole_amax(layer: int, linear: str, expert: int) -> torch.Tensor:
    """What ModelOpt at ETP 1 stores for the expert: the full weight's block amax (N, 1) in
    row-major block order (a gated fc1's full weight is [W; V] rows)."""
    w = prog.full_weight(layer, linear, expert)
    return w.abs().reshape(-1, prog.BLOCK).amax(dim=1, keepdim=True)


def _check(state: dict, topo_id: str, rank: int, global_amax: bool = True) -> int:
    """Every expert tensor the rank loaded at ``topo_id`` is its slice; the count checked."""
    topo = Topology.parse(topo_id)
    c = rank_coords(topo)[rank]
    local_experts = prog.EXPERTS // topo.ep
    checked = 0
    for layer, (prefix, _) in enumerate(prog.LAYERS):
        for linear in prog.LINEARS:
            for i in range(local_experts):
                g = c.ep * local_experts + i
                want_w, want_a = expected(layer, linear, g, c.etp, topo.etp)
                got_w = state[f"{prefix}{linear}.weight{i}"]
                got_a = state[f"{prefix}{linear}.weight_quantizer.{i}._amax"]
                assert torch.equal(got_w, want_w), (topo_id, rank, layer, linear, g)
                assert torch.equal(got_a.reshape(-1, 1), want_a), (topo_id, rank, layer, linear, g)
                if global_amax:
                    got_g = state[f"{prefix}{linear}.weight_quantizer.{i}._global_amax"]
                    assert got_g.item() == prog.full_weight(layer, linear, g).abs().max().item()
                checked += 1
    return checked


def _loaded(out, name: str, rank: int) -> dict:
    return torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)


def _stored(out) -> dict:
    return torch.load(out / "stored.pt", weights_only=False)


def _amax_keys(stored: dict) -> list[str]:
    return sorted(k for k in stored if k.endswith("weight_quantizer._amax"))


@pytest.mark.parametrize("name,save,load", prog.CASES, ids=[c[0] for c in prog.CASES])
def test_a_load_at_another_expert_tp_gives_each_rank_the_rows_or_columns_of_its_weight(out, name, save, load):
    for rank in range(prog.WORLD):
        got = _loaded(out, name, rank)["fixed"]
        assert "error" not in got, got.get("error")
        local_experts = prog.EXPERTS // Topology.parse(load).ep
        assert _check(got, load, rank) == len(prog.LAYERS) * len(prog.LINEARS) * local_experts


def test_the_saved_global_amax_is_the_experts_maximum_on_every_expert_tp_rank(out):
    """Calibration at ETP 2: each rank's local max reduced over the expert TP group."""
    for name, save, _ in prog.CASES:
        for rank in range(prog.WORLD):
            saved = _loaded(out, name, rank)["saved_global_amax"]
            assert saved, name
            for k, v in saved.items():
                layer, linear, expert = k.split("/")
                assert v.item() == prog.full_weight(int(layer), linear, int(expert)).abs().max().item(), (name, rank, k)


def test_every_checkpoint_stores_the_block_amax_as_modelopt_does_at_expert_tp_1(out):
    """Each expert's block amax is ONE (N, 1) float32 key holding the whole expert's grid in ETP-1
    order, whatever the ETP of the save (cases saved at ETP 1 and 2, and ModelOpt's own save)."""
    stored = _stored(out)
    for name in [c[0] for c in prog.CASES] + [prog.MODELOPT]:
        keys = _amax_keys(stored[name])
        assert len(keys) == len(prog.LAYERS) * len(prog.LINEARS) * prog.EXPERTS, (name, keys)
        for layer, (prefix, _) in enumerate(prog.LAYERS):
            for linear in prog.LINEARS:
                for g in range(prog.EXPERTS):
                    key = f"{prefix}experts.experts.{g}.{linear}.weight_quantizer._amax"
                    shape, dtype, whole = stored[name][key]
                    want = whole_amax(layer, linear, g)
                    assert (shape, dtype) == (tuple(want.shape), torch.float32), (name, key, shape, dtype)
                    assert torch.equal(whole, want), (name, key)


def test_a_save_at_expert_tp_2_is_the_checkpoint_a_save_at_expert_tp_1_writes(out):
    """Same keys, global shapes and dtypes for every tensor, and the same bytes for every block
    amax and global amax: the fix saving at ETP 2 (tp2-etp2-ep2, tp2-etp2-ep1) against the fix at
    ETP 1 (tp1-etp1-ep4, tp2-etp1-ep4) and ModelOpt's own ETP-1 save of the same weights."""
    stored = _stored(out)
    etp1 = [c[0] for c in prog.CASES if Topology.parse(c[1]).etp == 1] + [prog.MODELOPT]
    etp2 = [c[0] for c in prog.CASES if Topology.parse(c[1]).etp == 2]
    assert etp1 and etp2
    ref = stored[prog.MODELOPT]
    for name in etp1 + etp2:
        assert {k: v[:2] for k, v in stored[name].items()} == {k: v[:2] for k, v in ref.items()}, name
        for k, (_, _, whole) in ref.items():
            if "_quantizer." in k:
                assert whole.numpy().tobytes() == stored[name][k][2].numpy().tobytes(), (name, k)


@pytest.mark.parametrize("name,save,load", prog.CASES, ids=[c[0] for c in prog.CASES])
def test_an_unpatched_job_at_expert_tp_1_reads_what_the_fix_saved(out, name, save, load):
    """No fix at the load: ModelOpt's own declaration at ETP 1 (tp1-etp1-ep4), megatron-core's load."""
    for rank in range(prog.WORLD):
        got = _loaded(out, name, rank)["unpatched_etp1"]
        assert "error" not in got, got.get("error")
        assert _check(got, prog.UNPATCHED_ETP1, rank) == len(prog.LAYERS) * len(prog.LINEARS) * prog.EXPERTS // 4


def test_modelopts_etp1_checkpoint_loads_under_the_fix_at_expert_tp_2_and_4(out):
    """Every static NVFP4 checkpoint written so far, read with megatron-core's own load."""
    for rank in range(prog.WORLD):
        got = _loaded(out, prog.MODELOPT, rank)
        assert "error" not in got["fixed"], got["fixed"].get("error")
        assert "error" not in got["fixed_etp4"], got["fixed_etp4"].get("error")
        _check(got["fixed"], "tp2-etp2-ep2", rank)
        _check(got["fixed_etp4"], "tp4-etp4-ep1", rank)


def test_unpatched_the_fc2_block_amax_is_refused_at_expert_tp_2(out):
    for rank in range(prog.WORLD):
        error = _loaded(out, prog.MODELOPT, rank)["unpatched_fc2"].get("error", "")
        assert "Global shape mismatch" in error and "linear_fc2.weight_quantizer._amax" in error, error


def test_unpatched_a_gated_fc1_rank_loads_rows_that_are_not_its_own(out):
    """No error: the ETP-1 layout split in two along rows gives rank 0 all of W, rank 1 all of V."""
    topo = Topology.parse("tp2-etp2-ep2")
    wrong = 0
    for rank in range(prog.WORLD):
        got = _loaded(out, prog.MODELOPT, rank)["unpatched_gated_fc1"]
        assert "error" not in got, got.get("error")
        c = rank_coords(topo)[rank]
        for i in range(prog.EXPERTS // topo.ep):
            _, want = expected(0, "linear_fc1", c.ep * 2 + i, c.etp, topo.etp)
            wrong += not torch.equal(got[f"{prog.LAYERS[0][0]}linear_fc1.weight_quantizer.{i}._amax"], want)
    assert wrong == prog.WORLD * 2
