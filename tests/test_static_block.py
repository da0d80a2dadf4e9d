"""Part (f) of the fix (moe_ckpt_fix/static_block.py): static NVFP4 expert block amax across expert TP.

Tier cpu, one process, real megatron-core and ModelOpt objects (no Transformer Engine here, so no
TEGroupedMLP: its sharded state dict is built by megatron-core's own functions as
tests/rank_programs/static_block_reshard.py says). What must hold, from the packages' rules:
- the checkpoint is ModelOpt's ETP-1 one at every topology: per expert ONE ``(N, 1)`` block amax,
  the whole expert's per-block max|W| in row-major block order (a gated fc1's ``[W; V]`` rows),
  and megatron-core's own validator finds one main replica of it;
- a block of 16 lies in one row of the weight: what a rank keeps of that whole is the block amax
  of its own weight shard (fc1 rows, the W and V halves of a gated unit; fc2 columns), and the
  whole is those parts put back;
- on the GPU recordings (tests/data/recorded/, real TEGroupedMLP sharded state dicts), the
  declaration keeps ModelOpt's key and validates across the recorded ranks;
- without (f), ModelOpt's declaration is another global fc2 tensor at every expert TP (the
  "Global shape mismatch" of the GPU runs) and gives a gated fc1 rank rows that are not its own.
The gather itself (a collective) and the real save at one topology and load at another are
tests/test_static_block_reshard.py.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from moe_ckpt_fix import static_block
from tests.rank_programs import static_block_reshard as model

pytestmark = pytest.mark.cpu

RECORDED = Path(__file__).parent / "data" / "recorded"
# (tp, etp, ep) topologies: ETP below, equal to and above TP; 2 to 8 ranks
TOPOLOGIES = ["tp1-etp1-ep4", "tp2-etp2-ep2", "tp4-etp4-ep1", "tp2-etp1-ep4", "tp1-etp2-ep2",
              "tp4-etp2-ep2", "tp2-etp2-ep4", "tp4-etp1-ep4-pp1-w8", "tp2-etp2-ep1-pp1-w4"]


@pytest.fixture
def dist_looks_initialized(monkeypatch):
    # megatron's get_pg_rank/get_pg_size return 0/1 unless torch.distributed is initialized.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)


def grid(layer: int, linear: str, expert: int) -> torch.Tensor:
    """The expert's whole block amax as (rows, cols / 16): per-block max|W| of its whole weight."""
    w = model.full_weight(layer, linear, expert)
    return w.abs().reshape(w.shape[0], -1, model.BLOCK).amax(dim=2)


def whole(key: str) -> torch.Tensor:
    """The global tensor a ShardedTensor key names, from the full weights (the test's own rule:
    a block amax is the expert's flat (N, 1) per-block max|W|; a gated fc1 weight's ``_w`` key
    holds the W rows, ``_v`` the V rows, as megatron-core splits them)."""
    layer = int(key.split("decoder.layers.")[1].split(".")[0])
    expert = int(key.split(".experts.experts.")[1].split(".")[0])
    linear = "linear_fc1" if ".linear_fc1." in key else "linear_fc2"
    if key.endswith("weight_quantizer._amax"):
        return grid(layer, linear, expert).reshape(-1, 1)
    t = model.full_weight(layer, linear, expert)
    half = t.shape[0] // 2
    return t[:half] if key.endswith("_w") else t[half:] if key.endswith("_v") else t


@pytest.fixture
def group_of_a_rank(monkeypatch):
    """The fix's gather (a collective, run by tests/test_static_block_reshard.py) replaced by the
    whole this test computes from the full weights: what is checked here is the declaration."""
    wholes = {}

    def gather_whole(local, rows, axis, halves, group):
        return wholes["next"]

    monkeypatch.setattr(static_block, "gather_whole", gather_whole)
    return wholes


def shards(topo_id: str, fixed: bool, wholes=None):
    """{key: [(rank, ShardedTensor, entry)]} of every rank's state at ``topo_id`` (factories
    built; ``wholes``: the ``group_of_a_rank`` fixture, fed each block amax's whole)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from harness.topology.coords import rank_coords
    from harness.topology.topology import Topology

    topo = Topology.parse(topo_id)
    by_key = defaultdict(list)
    for c in rank_coords(topo):
        group = model.Group(c.etp, topo.etp)
        for entry in model.model_state(c, topo, fixed, data=True, group=group).values():
            if wholes is not None:
                wholes["next"] = whole(entry.key)
            built = entry.build() if isinstance(entry, ShardedTensorFactory) else [entry]
            for sh in built if isinstance(built, list) else [built]:
                assert isinstance(sh, ShardedTensor)
                by_key[sh.key].append((c.rank, sh, entry))
    return by_key


def validation_errors(by_key) -> list:
    """megatron-core's own sharding validation of every key, over ``(rank, ShardedTensor, ...)``."""
    from megatron.core.dist_checkpointing.validation import _validate_sharding_for_key

    return [e for s in by_key.values() for e in _validate_sharding_for_key([h[:2] for h in s])]


@pytest.mark.parametrize("topo_id", TOPOLOGIES)
def test_the_block_amax_is_declared_whole_and_each_rank_keeps_its_weight_shards_blocks(dist_looks_initialized, group_of_a_rank,
                                                                                        topo_id):
    from harness.topology.coords import rank_coords
    from harness.topology.topology import Topology

    topo = Topology.parse(topo_id)
    coords = rank_coords(topo)
    by_key = shards(topo_id, fixed=True, wholes=group_of_a_rank)
    amax_keys = [k for k in by_key if k.endswith("weight_quantizer._amax")]
    assert len(amax_keys) == model.EXPERTS * 4, sorted(amax_keys)  # one per expert and linear
    assert validation_errors(by_key) == []  # megatron-core: one main replica per chunk, all covered
    for key in amax_keys:
        full = whole(key)
        layer = int(key.split("decoder.layers.")[1].split(".")[0])
        expert = int(key.split(".experts.experts.")[1].split(".")[0])
        linear = "linear_fc1" if ".linear_fc1." in key else "linear_fc2"
        for rank, sh, entry in by_key[key]:
            assert (tuple(sh.global_shape), tuple(sh.global_offset), sh.dtype) == ((full.numel(), 1), (0, 0), torch.float32)
            assert torch.equal(sh.data, full), (topo_id, rank, key)
            c = coords[rank]
            assert sh.replica_id == (0, c.etp, c.edp)  # replicated over expert TP and expert DP
            mine = model.block_amax(model.local_weight(layer, linear, expert, c.etp, topo.etp))
            assert torch.equal(entry.merge_fn(full.clone()), mine), (topo_id, rank, key)


def test_the_whole_is_every_ranks_part_put_back_in_expert_tp_1_order():
    """``whole_from_parts`` (the gather's assembly) against the test's own full-weight whole."""
    for layer, (_, gated) in enumerate(model.LAYERS):
        for linear in model.LINEARS:
            axis = 0 if linear == "linear_fc1" else 1
            halves = 2 if gated and axis == 0 else 1
            full = model.full_weight(layer, linear, 0)
            want = full.abs().reshape(-1, model.BLOCK).amax(dim=1, keepdim=True)
            for size in (1, 2, 4):
                parts = [model.block_amax(model.local_weight(layer, linear, 0, r, size)) for r in range(size)]
                rows = model.local_weight(layer, linear, 0, 0, size).shape[0]
                assert torch.equal(static_block.whole_from_parts(parts, rows, axis, halves), want), (layer, linear, size)
                for r in range(size):
                    assert torch.equal(static_block.local_part(want, rows, axis, halves, r, size), parts[r])


@pytest.mark.parametrize("topo_id", [t for t in TOPOLOGIES if "etp1-" not in t])
def test_without_the_fix_the_declaration_moves_with_the_expert_tp(dist_looks_initialized, topo_id):
    """ModelOpt's own declaration (0.47.0 + fix (a)): fc2's global tensor is another at each
    expert TP (the load's "Global shape mismatch"), and a gated fc1 rank's amax rows are not the
    rows of its weight. The control: what the test above catches."""
    saved_at_etp1 = shards("tp1-etp1-ep4", fixed=False)
    by_key = shards(topo_id, fixed=False)
    fc2 = [k for k in by_key if ".linear_fc2.weight_quantizer._amax" in k]
    assert fc2 and all(by_key[k][0][1].global_shape != saved_at_etp1[k][0][1].global_shape for k in fc2)
    assert all(saved_at_etp1[k][0][1].global_shape == whole(k).shape for k in fc2)  # the format kept
    gated = [k for k in by_key if "layers.0" in k and ".linear_fc1.weight_quantizer._amax" in k]
    wrong = 0
    for key in gated:
        flat = whole(key)  # the flat (N, 1) layout an ETP-1 save writes
        for rank, sh, _ in by_key[key]:
            wrong += not torch.equal(sh.data, flat[sh.global_slice()])
    assert gated and wrong == sum(len(by_key[k]) for k in gated)  # every gated rank: wrong rows


def _recordings() -> list[Path]:
    return sorted(RECORDED.rglob("*.json"))


@pytest.mark.parametrize("path", _recordings(), ids=lambda p: str(p.relative_to(RECORDED)))
def test_recorded_topologies_declare_each_block_amax_whole_under_modelopts_key(dist_looks_initialized, group_of_a_rank,
                                                                              path):
    """The expert weights and their scalar amax entries recorded on a GPU (real TEGroupedMLP at
    tp/etp/ep != 1): a block amax of the recorded weight shard, declared by the fix from the
    recorded amax entry (its key, prefix axes, replica id) at the expert-TP rank and size the
    weight's chunk gives, is the whole expert's (N, 1) under the same key, and megatron-core
    validates it across the recorded ranks where the recorded replica ids are ModelOpt's fixed
    ones (the fix's records; 0.48.0rc1 has parts a-e itself)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from harness.check.keys import EXPERT_WEIGHT

    rec = json.loads(path.read_text())
    entries = {(e["rank"], e["key"]): e for e in rec["entries"]}
    by_key = defaultdict(list)
    for (rank, key), e in entries.items():
        scalar = entries.get((rank, key + "_quantizer._amax"))
        if not EXPERT_WEIGHT.match(key) or scalar is None:
            continue
        axis = 0 if ".linear_fc1." in key else 1  # column- and row-parallel, as recorded
        rows, cols = e["local_shape"]
        size = e["axis_fragmentations"][axis]
        etp_rank = e["global_offset"][axis] // e["local_shape"][axis]
        n = rows * cols // 16
        entry = ShardedTensor.from_rank_offsets(
            scalar["key"], torch.zeros(n, 1), replica_id=tuple(scalar["replica_id"]),
            prepend_axis_num=scalar["prepend_axis_num"])
        group_of_a_rank["next"] = torch.zeros(n * size, 1)
        sh = static_block.replicated_whole(entry, rows, axis, 1, model.Group(etp_rank, size)).build()
        assert (sh.key, tuple(sh.global_shape)) == (scalar["key"], (n * size, 1))
        assert sh.replica_id == (scalar["replica_id"][0], etp_rank, *scalar["replica_id"][2:])
        by_key[sh.key].append((rank, sh))
    assert by_key, path
    if rec["provenance"].get("patch") == "fix" or rec["provenance"]["nvidia-modelopt"] != "0.47.0":
        assert validation_errors(by_key) == []


# --- the restore --------------------------------------------------------------------------------
class _Grouped(torch.nn.Module):
    """A grouped linear as fit_block_amax and the check read it: weight{i}, weight_quantizer[i]."""

    def __init__(self, weights):
        super().__init__()
        for i, w in enumerate(weights):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(w, requires_grad=False))
        self.weight_quantizer = model.grouped_quantizers(len(weights))


def test_a_block_amax_restored_at_another_expert_tp_is_refitted_to_the_local_weight():
    """Restored with the save's ETP-1 shape (the buffer ``_pytorch_state_metadata`` re-creates),
    loaded at ETP 2: the expert's amax must have the local weight's blocks (numel / 16, 1) before
    the load writes into it; max calibration gives per-block max|W| (ModelOpt's remedy)."""
    local = [model.local_weight(1, "linear_fc2", e, 1, 2) for e in range(2)]
    m = _Grouped(local)
    m.weight_quantizer[0].register_buffer("_amax", model.block_amax(model.full_weight(1, "linear_fc2", 0)))
    m.weight_quantizer[1].register_buffer("_amax", model.block_amax(local[1]) + 1)  # fits: kept
    assert static_block.fit_block_amax(m) == [0]
    assert torch.equal(m.weight_quantizer[0]._amax, model.block_amax(local[0]))
    assert torch.equal(m.weight_quantizer[1]._amax, model.block_amax(local[1]) + 1)


# --- the calibration check ----------------------------------------------------------------------
class _TP:
    def __init__(self, size):
        self.size = size

    def is_initialized(self):
        return True

    def world_size(self):
        return self.size


def _quant_modules(cols: int):
    """A grouped expert linear and a plain linear, both static NVFP4, both at tensor parallel 2;
    registered as ModelOpt QuantModules (what the check looks at)."""
    from types import SimpleNamespace

    from modelopt.torch.quantization.nn import QuantModule

    class GroupedQ(QuantModule, _Grouped):
        pass

    class PlainQ(QuantModule, torch.nn.Module):
        pass

    state = SimpleNamespace(tensor_parallel_group=_TP(2))  # QuantModule.parallel_state reads
    grouped = GroupedQ.__new__(GroupedQ)                  # ``_parallel_state``
    _Grouped.__init__(grouped, [torch.randn(8, cols) for _ in range(2)])
    plain = PlainQ.__new__(PlainQ)
    torch.nn.Module.__init__(plain)
    plain.weight_quantizer = model.static_nvfp4_quantizer()
    for m in (grouped, plain):
        m.__dict__["_parallel_state"] = state
    return GroupedQ, grouped, plain


def test_calibration_at_expert_tp_2_is_refused_only_where_blocks_cannot_follow_the_weight():
    import modelopt.torch.quantization.plugins.megatron as mp

    grouped_cls, grouped, plain = _quant_modules(cols=32)
    check = static_block.nvfp4_static_tp_check(grouped_cls)
    for name, module in (("grouped", grouped), ("plain", plain)):
        holder = torch.nn.Module()
        holder.add_module(name, module)
        with pytest.raises(NotImplementedError, match="not supported with TP > 1"):
            mp._check_nvfp4_static_tp_supported(holder)  # ModelOpt refuses both
        if name == "grouped":
            check(holder)  # the fix: a grouped expert linear whose blocks lie in one shard passes
        else:
            with pytest.raises(NotImplementedError, match=r"\('plain', 2\)"):
                check(holder)  # a dense linear stays refused
    _, odd, _ = _quant_modules(cols=24)  # 24 columns: a block would straddle two shards
    holder = torch.nn.Module()
    holder.add_module("odd", odd)
    with pytest.raises(NotImplementedError, match=r"\('odd', 2\)"):
        static_block.nvfp4_static_tp_check(type(odd))(holder)


def test_global_amax_is_reduced_only_after_a_distributed_calibration(monkeypatch):
    calls, reduced = [], []

    def max_calibrate(model, forward_loop=None, distributed_sync=True, sync_expert_weight_amax=False):
        calls.append(distributed_sync)

    monkeypatch.setattr(static_block, "reduce_global_amax", lambda m, cls: reduced.append(m))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    wrapped = static_block.wrap_max_calibrate(max_calibrate, _Grouped)
    wrapped("m1", None)  # mse_calibrate's call: distributed_sync by default
    wrapped("m2", lambda m: None, False)  # ModelOpt's post-restore re-calibration
    wrapped(model="m3", distributed_sync=True)
    wrapped("m4", distributed_sync=False)
    assert calls == [True, False, True, False] and reduced == ["m1", "m3"]


def test_block_length_is_the_static_block_along_the_last_axis_only():
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    def q(**cfg):
        return TensorQuantizer(QuantizerAttributeConfig(**cfg))

    assert static_block.block_length(model.static_nvfp4_quantizer()) == 16
    assert static_block.block_length(q(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic",
                                                                     "scale_bits": (4, 3)})) is None
    assert static_block.block_length(q(num_bits=(4, 3), axis=None)) is None  # FP8 per tensor
    assert static_block.block_length(q(num_bits=4, block_sizes={-1: 128, -2: 128})) is None  # 2-D


def test_a_block_amax_that_does_not_fit_its_weight_keeps_modelopts_declaration(dist_looks_initialized):
    """Padded blocks (cols % 16 != 0) or a stale buffer: nothing is redeclared (ModelOpt's entry
    stays, its calibration check refuses expert TP > 1 for such a linear)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    weight = ShardedTensor.from_rank_offsets("w", torch.zeros(8, 32), (1, 0, 2), replica_id=(0, 0, 0))
    modelopt_entry = ShardedTensor.from_rank_offsets("a", torch.zeros(8 * 32 // 16 * 2, 1), replica_id=(0, 1, 0))
    sd = {"l.weight0": weight, "l.weight_quantizer.0._amax": modelopt_entry}
    group = model.Group(0, 2)
    assert static_block.redeclare(sd, "l.", [model.static_nvfp4_quantizer()], 1, False, group) == []
    assert sd["l.weight_quantizer.0._amax"] is modelopt_entry
    sd["l.weight_quantizer.0._amax"] = ShardedTensor.from_rank_offsets("a", torch.zeros(16, 1), replica_id=(0, 1, 0))
    assert static_block.redeclare(sd, "l.", [model.static_nvfp4_quantizer()], 1, False, group) == [0]
    assert isinstance(sd["l.weight_quantizer.0._amax"], ShardedTensorFactory)


def test_the_calibration_source_check_reads_through_modelopts_decorators():
    """part (f) checks that the installed max_calibrate sets the global amax where it wraps it;
    0.47.0's max_calibrate is decorated, and the check must read the function under the
    decorator (on the H100 it refused the real 0.47.0: tests/gpu/test_fix_te.py, 6 errors)."""
    import modelopt.torch.quantization.model_calib as model_calib

    from moe_ckpt_fix.static_block import calls_finalize

    assert "_finalize_with_shared_state" not in model_calib.max_calibrate.__code__.co_names
    assert calls_finalize(model_calib.max_calibrate)
