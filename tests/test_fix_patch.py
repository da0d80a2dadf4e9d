"""CPU checks of harness.fix and of patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff.

What runs here for real: the diff against the installed 0.47.0 sources; the refusals of
``apply()``; megatron-core's own ``make_sharded_tensors_for_checkpoint`` and its sharding
validator driven through the fix's wrapper with fake process groups; modelopt's real
``_ParallelLinear.modelopt_post_restore`` + ``quant_module_set_extra_state`` on a toy linear with a
per-expert ``GroupedQuantizer``; the autoload ``sitecustomize``. The TE classes themselves
(``_QuantMegatronTEGroupedLinear``) cannot exist without Transformer Engine: see
tests/gpu/test_fix_te.py.
"""
from __future__ import annotations

import os
import py_compile
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import harness.fix as fix
from moe_ckpt_fix import modelopt_0_47_0 as fx
from harness.bounded import Finished
from tests.helpers import bounded
from tests.rank_programs.static_block_reshard import Group  # stands in for a ProcessGroup

REPO = Path(__file__).resolve().parents[1]
DIFF = REPO / "patches" / "nvidia-modelopt-0.47.0-expert-amax-resharding.diff"
# Part (f), static NVFP4 experts across expert TP: applied after DIFF (patches/README.md).
STATIC_DIFF = REPO / "patches" / "nvidia-modelopt-0.47.0-static-block-expert-tp.diff"
AUTOLOAD = REPO / "harness" / "fix" / "autoload"

pytestmark = pytest.mark.cpu


def _site_packages() -> Path:
    import modelopt

    return Path(modelopt.__file__).resolve().parents[1]


def _te_importable() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


# --- the diffs ------------------------------------------------------------------------------------
def _diff_files(diff: Path) -> list[str]:
    return sorted({line[6:].split("\t")[0] for line in diff.read_text().splitlines()
                   if line.startswith("+++ b/")})


def apply_diffs(dest: Path, *diffs: Path) -> list[str]:
    """Copy the installed 0.47.0 files the diffs touch into ``dest`` and apply the diffs in
    order with ``patch -p1`` (a dry run first), each without offset or fuzz; the files."""
    assert fix._installed_modelopt_version() == "0.47.0", "this test needs the pinned modelopt"
    files = sorted({f for d in diffs for f in _diff_files(d)})
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_site_packages() / rel, dest / rel)
    patch = shutil.which("patch")
    assert patch, "the `patch` binary is needed (apt-get install patch)"
    for diff in diffs:
        for extra in (["--dry-run"], []):
            r = bounded([patch, "-p1", "--forward", "--batch", *extra, "-i", str(diff)], 60, cwd=dest)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "offset" not in r.stdout and "fuzz" not in r.stdout, r.stdout
    return files


def test_diff_applies_to_installed_0_47_0_and_compiles(tmp_path):
    assert _diff_files(DIFF) == [
        "modelopt/torch/quantization/plugins/custom.py",
        "modelopt/torch/quantization/plugins/megatron.py",
    ]
    for rel in apply_diffs(tmp_path, DIFF):
        py_compile.compile(str(tmp_path / rel), doraise=True)
        assert (tmp_path / rel).read_text() != (_site_packages() / rel).read_text()


def test_static_block_diff_applies_after_the_first_and_compiles(tmp_path):
    assert _diff_files(STATIC_DIFF) == [
        "modelopt/torch/quantization/model_calib.py",
        "modelopt/torch/quantization/plugins/megatron.py",
    ]
    for rel in apply_diffs(tmp_path, DIFF, STATIC_DIFF):
        py_compile.compile(str(tmp_path / rel), doraise=True)
        assert (tmp_path / rel).read_text() != (_site_packages() / rel).read_text()


def _patched_functions(path: Path, names: list[str]) -> dict:
    """The module-level functions ``names`` of a patched plugins/megatron.py, run with that
    file's own imports (its TE-dependent classes are not defined here: no Transformer Engine)."""
    import ast

    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    assert sorted(found) == sorted(names), f"{path.name} defines no {sorted(set(names) - set(found))}"
    namespace = {"__name__": "modelopt.torch.quantization.plugins.megatron_patched",
                 "__package__": "modelopt.torch.quantization.plugins", "HAS_TE": False}
    exec(compile(ast.Module(body=body + list(found.values()), type_ignores=[]), str(path), "exec"),
         namespace)
    return {n: namespace[n] for n in names}


@pytest.fixture(scope="module")
def static_diff_functions(tmp_path_factory):
    d = tmp_path_factory.mktemp("static-diff")
    apply_diffs(d, DIFF, STATIC_DIFF)
    return _patched_functions(d / "modelopt/torch/quantization/plugins/megatron.py",
                              ["_static_block_length", "_block_amax_parts", "_block_amax_replicated_whole",
                               "_check_nvfp4_static_tp_supported", "_block_amax_fits"])


def _rank_part(whole: torch.Tensor, rows: int, cols: int, axis: int, halves: int, rank: int, size: int):
    """The test's own rule: expert-TP rank ``rank``'s block amax of its ``(rows, cols)`` weight
    shard, cut from the expert's whole grid (ETP-1 order, a gated fc1's ``[W; V]`` rows):
    fc1 (axis 0) its row block of each half, fc2 (axis 1) its column block."""
    c = cols // 16
    if axis == 1:
        grid = whole.view(rows, size * c)
        return grid[:, rank * c:(rank + 1) * c].reshape(-1, 1)
    grid = whole.view(rows * size, c)
    n, half = rows // halves, rows * size // halves
    return torch.cat([grid[k * half + rank * n:k * half + (rank + 1) * n] for k in range(halves)]).reshape(-1, 1)


def test_the_static_diff_saves_and_loads_each_recorded_block_amax_as_the_fix_does(static_diff_functions,
                                                                                monkeypatch):
    """On every expert weight recorded on a GPU (tests/data/recorded) with its amax entry (key,
    replica id), fc1 plain and gated: the diff's factory and the runtime fix's declare the same
    whole (N, 1) under ModelOpt's key with the same replica id, build it from the ranks' parts
    (the all-gather answered by the test's rule) into the whole, and cut a loaded whole to the
    rank's part (tests/test_static_block.py and tests/test_static_block_reshard.py check the
    fix against megatron-core and a real gloo save/load)."""
    import json

    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from harness.check.keys import EXPERT_WEIGHT
    from moe_ckpt_fix import static_block

    upstream, upstream_fits = (static_diff_functions[n] for n in ("_block_amax_replicated_whole", "_block_amax_fits"))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    gathered = {}

    def all_gather(parts, local, group=None):
        for r in range(len(parts)):
            parts[r].copy_(_rank_part(gathered["whole"], *gathered["shape"], r, len(parts)))
        assert torch.equal(local, parts[group.rank()])

    monkeypatch.setattr(torch.distributed, "all_gather", all_gather)
    compared = 0
    for path in sorted((REPO / "tests" / "data" / "recorded").rglob("*.json")):
        entries = {(e["rank"], e["key"]): e for e in json.loads(path.read_text())["entries"]}
        for (rank, key), e in entries.items():
            scalar = entries.get((rank, key + "_quantizer._amax"))
            if not EXPERT_WEIGHT.match(key) or scalar is None:
                continue
            rows, cols = e["local_shape"]
            weight = ShardedTensor(key, torch.zeros(rows, cols), torch.float32, (rows, cols),
                                   tuple(e["global_shape"]), tuple(e["global_offset"]),
                                   tuple(e["axis_fragmentations"]), tuple(e["replica_id"]),
                                   e["prepend_axis_num"])
            axis = 0 if ".linear_fc1." in key else 1
            size = e["axis_fragmentations"][axis]
            group = Group(e["global_offset"][axis] // e["local_shape"][axis], size)
            whole = torch.randperm(rows * cols // 16 * size).float().reshape(-1, 1)
            for halves in ((1, 2) if axis == 0 else (1,)):
                local = _rank_part(whole, rows, cols, axis, halves, group.rank(), size)
                entry = ShardedTensor.from_rank_offsets(scalar["key"], local.clone(),
                                                        replica_id=tuple(scalar["replica_id"]),
                                                        prepend_axis_num=scalar["prepend_axis_num"])
                gathered.update(whole=whole, shape=(rows, cols, axis, halves))
                got = upstream(entry, rows, axis, halves, group)
                want = static_block.replicated_whole(entry, rows, axis, halves, group)
                assert (got.key, got.replica_id) == (want.key, want.replica_id) == (
                    scalar["key"], (scalar["replica_id"][0], group.rank(), *scalar["replica_id"][2:]))
                got_sh, want_sh = got.build(), want.build()
                assert got_sh.without_data() == want_sh.without_data()
                assert tuple(got_sh.global_shape) == (whole.numel(), 1)
                assert torch.equal(got_sh.data, whole) and torch.equal(want_sh.data, whole)
                assert torch.equal(got.merge_fn(whole), local) and torch.equal(want.merge_fn(whole), local)
            stale = torch.zeros(2 * local.numel(), 1)  # restored with half this expert TP's shape
            assert upstream_fits(local, weight, 16) and not upstream_fits(stale, weight, 16)
            assert not static_block.fits(stale, weight, 16)
            compared += 1
    assert compared > 100, compared


def test_the_static_diff_lets_only_reshardable_grouped_experts_calibrate_at_tp_above_one(
        static_diff_functions):
    from types import SimpleNamespace

    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import QuantModule, TensorQuantizer

    check = static_diff_functions["_check_nvfp4_static_tp_supported"]
    tp2 = SimpleNamespace(is_initialized=lambda: True, world_size=lambda: 2)

    class Quant(QuantModule, torch.nn.Module):
        pass

    def module(follows):
        m = Quant.__new__(Quant)
        torch.nn.Module.__init__(m)
        m.weight_quantizer = TensorQuantizer(QuantizerAttributeConfig(
            num_bits=(2, 1), block_sizes={-1: 16, "type": "static", "scale_bits": (4, 3)}))
        m.__dict__["_parallel_state"] = SimpleNamespace(tensor_parallel_group=tp2)
        if follows is not None:
            m.static_block_amax_follows_weight = lambda: follows
        return m

    assert static_diff_functions["_static_block_length"](module(None).weight_quantizer) == 16
    for follows, refused in ((None, True), (False, True), (True, False)):
        holder = torch.nn.Module()
        holder.add_module("m", module(follows))
        if refused:
            with pytest.raises(NotImplementedError, match=r"\('m', 2\)"):
                check(holder)
        else:
            check(holder)


# --- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("installed", ["0.46.1", "0.48.0", None])
def test_apply_refuses_other_modelopt_versions(monkeypatch, installed):
    monkeypatch.setattr(fix, "_installed_modelopt_version", lambda: installed)
    with pytest.raises(fix.UnsupportedModeloptVersion) as err:
        fix.apply()
    msg = str(err.value)
    assert "0.47.0" in msg and "Nothing was patched" in msg
    assert (installed or "not installed") in msg


@pytest.mark.parametrize("installed, module, parts", [
    ("0.47.0", "modelopt_0_47_0", ("expert-amax", "static-block", "unloaded-amax")),
    ("0.48.0rc1", "modelopt_0_48_0rc1", ("static-block", "unloaded-amax"))])
@pytest.mark.parametrize("value", [None, "static-block", "0.48.0rc1", "unloaded-amax"])
def test_every_proven_part_is_installed_by_the_switch_alone(monkeypatch, installed, module, parts, value):
    """Part (f) and 0.48.0rc1 have GPU records (docs/fix.md): MOE_CKPT_FIX=1 alone (a job's whole
    change) installs every proven part the release lacks (part (g) too since wheel 0.4.0), whatever
    MOE_CKPT_FIX_UNPROVEN says; a part still unproven only where MOE_CKPT_FIX_UNPROVEN names it
    (none at present); the release's own parts (0.48.0rc1 has a-e) are not installed again."""
    import importlib

    patcher = importlib.import_module(f"moe_ckpt_fix.{module}")
    called = []
    monkeypatch.setattr(fix, "_applied_version", None)  # restored after: nothing was patched
    monkeypatch.setattr(fix, "_installed_modelopt_version", lambda: installed)
    monkeypatch.setattr(fix, "_installed_mcore_version", lambda: fix.SUPPORTED_MCORE_VERSIONS[-1])
    monkeypatch.setattr(patcher, "apply", lambda unproven=(): called.append(unproven) or "ok")
    monkeypatch.setattr(patcher, "parts", lambda: parts, raising=False)
    monkeypatch.delenv(fix.UNPROVEN_VAR, raising=False)
    if value is not None:
        monkeypatch.setenv(fix.UNPROVEN_VAR, value)
    assert fix.apply() == "ok"
    assert called == [(value,) if value in fix.UNPROVEN_PARTS else ()]
    assert all(fix.wanted(p, ()) for p in parts)  # every part of the release, unasked
    assert fix.PARTS_ONLY_VERSIONS.get(installed, tuple(fix.PARTS)) == parts


def test_0_48_0rc1_passes_the_version_gate_without_asking(monkeypatch):
    """0.48.0rc1 gets part (f) with MOE_CKPT_FIX=1 alone (no MOE_CKPT_FIX_UNPROVEN): past the
    version gate. Where Transformer Engine imports (every GPU host, tiers gpu and gpu-shared) the
    0.48.0rc1 patcher is called, asked for no unproven part (stubbed: the modelopt installed is
    another release, not to be patched); without it (the cpu tier) the patcher stops at the
    missing Transformer Engine, having patched nothing."""
    monkeypatch.setattr(fix, "_installed_modelopt_version", lambda: "0.48.0rc1")
    monkeypatch.setattr(fix, "_installed_mcore_version", lambda: fix.SUPPORTED_MCORE_VERSIONS[-1])
    monkeypatch.delenv(fix.UNPROVEN_VAR, raising=False)
    if _te_importable():
        from moe_ckpt_fix import modelopt_0_48_0rc1 as patcher

        called = []
        monkeypatch.setattr(fix, "_applied_version", None)  # restored after: nothing was patched
        monkeypatch.setattr(fix, "_applied_parts", fix._applied_parts)
        monkeypatch.setattr(patcher, "apply", lambda unproven=(): called.append(unproven) or "patched")
        assert fix.apply() == "patched" and called == [()]
        assert fix.applied() is not None and tuple(fix.applied_parts()) == tuple(patcher.parts())
        return
    with pytest.raises(fix.TransformerEngineMissing):
        fix.apply()
    assert fix.applied() is None
    import modelopt.torch.quantization.model_calib as model_calib

    from moe_ckpt_fix import static_block

    assert not getattr(model_calib.max_calibrate, static_block.MARK, False)


@pytest.mark.skipif(_te_importable(), reason="Transformer Engine is importable here")
def test_apply_without_transformer_engine_refuses_and_patches_nothing():
    import modelopt.torch.quantization.plugins.custom as custom
    import modelopt.torch.quantization.plugins.megatron as mp

    with pytest.raises(fix.TransformerEngineMissing) as err:
        fix.apply()
    assert "Transformer Engine" in str(err.value) and "Nothing was patched" in str(err.value)
    assert not getattr(mp.make_sharded_tensors_for_checkpoint, fx._MARK, False)
    assert not getattr(custom._ParallelLinear.modelopt_post_restore, fx._MARK, False)
    assert not getattr(mp._MegatronRowParallelLinear._get_shard_axis_dict, fx._MARK, False)
    assert not getattr(mp._check_nvfp4_static_tp_supported, fx._MARK, False)
    assert fix.applied() is None


# --- (a) replica-id rule, through megatron-core's own builder and validator ------------------------
def _expert_amax_entries(topo_id: str, rule: str, local_experts: int = 2, rows: int = 0):
    """Per-expert amax ShardedTensors of every rank, built the way 0.47.0 builds them.

    The call pattern is the one of ``_QuantMegatronTEGroupedLinear.sharded_state_dict``
    (``make(expert_state, "", expert_axis, offsets)`` with no groups, key rewritten to the
    global expert, replica_id[2] rewritten to the expert-DP rank). ``rule="fixed"`` runs it
    inside the fix's scope with the expert groups; ``rule="0.47.0"`` gives it the dense groups
    that megatron's parallel_state default would supply.
    """
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    from harness.topology.coords import rank_coords
    from harness.topology.topology import Topology

    topo = Topology.parse(topo_id)
    make = fx.wrap_make_sharded_tensors(make_sharded_tensors_for_checkpoint)
    by_key, coords = defaultdict(list), {}
    for c in rank_coords(topo):
        coords[c.rank] = c
        etp, edp = Group(c.etp, topo.etp), Group(c.edp, topo.edp)
        dense_tp, dense_dp = Group(c.tp, topo.tp), Group(c.dp, topo.dp)
        for i in range(local_experts):
            key = f"{i}.weight_quantizer._amax"
            value = torch.ones(rows) if rows else torch.ones(1)
            axis = {key: 0} if rows else {}
            if rule == "fixed":
                with fx.expert_groups_scope(etp, edp):
                    sd = make({key: value}, "", axis, ())
            else:
                sd = make({key: value}, "", axis, (), tp_group=dense_tp, dp_cp_group=dense_dp)
            g = c.ep * local_experts + i
            replace_prefix_for_sharding(sd, f"{i}.", f"pp{c.pp}.experts.{g}.linear_fc1.")
            sh = sd[key]
            sh.replica_id = (*sh.replica_id[:2], c.edp)
            by_key[sh.key].append((c.rank, sh))
    return topo, coords, by_key


def _validation_errors(by_key):
    from megatron.core.dist_checkpointing.validation import _validate_sharding_for_key

    return [e for shards in by_key.values() for e in _validate_sharding_for_key(shards)]


@pytest.fixture
def dist_looks_initialized(monkeypatch):
    # megatron's get_pg_rank/get_pg_size return 0/1 unless torch.distributed is initialized.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)


# findings.md: failing at 0.47.0 (2 ranks tp2/etp1/ep2 count 0; tp1/etp2/ep1 count 2; the
# report's tp4/etp1/ep8) and passing ones (tp == etp; tp2/etp1/ep1 passes even at 0.47.0).
@pytest.mark.parametrize(
    "topo_id,fails_at_0_47_0",
    [
        ("tp2-etp1-ep2", True),
        ("tp1-etp2-ep1", True),
        ("tp4-etp1-ep8", True),
        ("tp2-etp2-ep2", False),
        ("tp2-etp1-ep1", False),
        ("tp1-etp1-ep1", False),
    ],
)
def test_per_expert_replica_id_uses_expert_groups(dist_looks_initialized, topo_id, fails_at_0_47_0):
    topo, coords, by_key = _expert_amax_entries(topo_id, "fixed")
    assert len(by_key) == topo.pp * topo.ep * 2  # every global expert of every stage, once
    for shards in by_key.values():
        mains = 0
        for rank, sh in shards:
            c = coords[rank]
            assert sh.replica_id == (0, c.etp, c.edp)  # the rule of findings.md
            assert sh.global_shape == (1,) and sh.global_offset == (0,)  # keys/shapes unchanged
            mains += sh.replica_id == (0, 0, 0)
        assert mains == 1
    assert _validation_errors(by_key) == []  # megatron-core's own check

    _, _, buggy = _expert_amax_entries(topo_id, "0.47.0")
    assert bool(_validation_errors(buggy)) == fails_at_0_47_0  # the control reproduces the bug


@pytest.mark.parametrize("topo_id", ["tp1-etp2-ep1", "tp2-etp1-ep2", "tp4-etp2-ep2"])
def test_channel_amax_is_sharded_over_expert_tp(dist_looks_initialized, topo_id):
    rows = 4
    topo, coords, by_key = _expert_amax_entries(topo_id, "fixed", rows=rows)
    for shards in by_key.values():
        for rank, sh in shards:
            c = coords[rank]
            assert sh.global_shape == (rows * topo.etp,)  # ETP, not dense TP
            assert sh.global_offset == (c.etp * rows,)
            assert sh.replica_id == (0, 0, c.edp)
    assert _validation_errors(by_key) == []


def test_shared_and_foreign_calls_pass_through_unchanged():
    calls = []

    def make(state_dict, prefix, tensor_parallel_layers_axis_map=None, sharded_offsets=(),
             extra_state_suffix="_extra_state", tp_group=None, dp_cp_group=None):
        calls.append((sorted(state_dict), tp_group, dp_cp_group))
        return {}

    wrapped = fx.wrap_make_sharded_tensors(make)
    etp, edp, mine = object(), object(), object()
    with fx.expert_groups_scope(etp, edp):
        wrapped({"input_quantizer._amax": 1}, "p.", {}, ())  # shared buffer: dense default
        wrapped({}, "", {}, ())
        wrapped({"0.weight_quantizer._amax": 1, "weight": 2}, "", {}, ())  # mixed: not ours
        wrapped({"3.weight_quantizer._amax": 1}, "", {}, (), tp_group=mine)  # caller chose
        wrapped({"3.weight_quantizer._amax": 1}, "", {}, ())  # per-expert: expert groups
    wrapped({"3.weight_quantizer._amax": 1}, "", {}, ())  # outside a grouped linear
    assert [c[1:] for c in calls] == [
        (None, None), (None, None), (None, None), (mine, None), (etp, edp), (None, None)
    ]


# --- (b) post-restore keeps every expert's amax ------------------------------------------------------
_N_EXPERTS = 4


def _toy_quant_linear_cls():
    """A registered toy linear whose weight quantizer is a per-expert GroupedQuantizer."""
    import torch.nn as nn
    from modelopt.torch.quantization.nn import GroupedQuantizer, QuantModuleRegistry, TensorQuantizer
    from modelopt.torch.quantization.plugins.custom import _ParallelLinear

    class ToyGroupedLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 16))

        def forward(self, x):
            return x @ self.weight.T

        # class-level hooks so torch emits/loads ``_extra_state`` (modelopt overrides per instance)
        def get_extra_state(self):
            return None

        def set_extra_state(self, state):
            pass

    if ToyGroupedLinear not in QuantModuleRegistry:

        @QuantModuleRegistry.register({ToyGroupedLinear: "moe_ckpt_fix_toy_grouped_linear"})
        class _QuantToy(_ParallelLinear):
            def _setup(self):
                super()._setup()
                self.weight_quantizer = GroupedQuantizer(
                    *(TensorQuantizer() for _ in range(_N_EXPERTS))
                )

    return ToyGroupedLinear


@pytest.fixture(scope="module")
def toy_cls():
    from harness.model.cpu_shims import apply_cpu_shims

    apply_cpu_shims()  # modelopt's get_extra_state calls torch.cuda.synchronize()
    return _toy_quant_linear_cls()


def _toy(toy_cls, amax=None):
    import modelopt.torch.quantization.plugins.megatron as mp
    from modelopt.torch.opt.plugins.megatron import register_modelopt_extra_state_callbacks
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    m = QuantModuleRegistry.convert(toy_cls())
    if amax is not None:
        for q, a in zip(m.weight_quantizer, amax):
            q.amax = torch.tensor(a)
    register_modelopt_extra_state_callbacks(
        m, mp.quant_module_get_extra_state, mp.quant_module_set_extra_state
    )
    return m


def _amaxes(m):
    return [None if getattr(q, "_amax", None) is None else q._amax.item() for q in m.weight_quantizer]


@pytest.fixture
def fixed_post_restore(monkeypatch):
    from modelopt.torch.quantization.plugins.custom import _ParallelLinear

    monkeypatch.setattr(
        _ParallelLinear, "modelopt_post_restore",
        fx.wrap_post_restore(_ParallelLinear.modelopt_post_restore),
    )


def test_load_state_dict_drops_expert_amax_without_fix(toy_cls):
    """Control: the second bug of findings.md, reproduced with modelopt's real code on CPU."""
    sd = _toy(toy_cls, [1.0, 2.0, 3.0, 4.0]).state_dict()
    dst = _toy(toy_cls, [9.0] * _N_EXPERTS)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*weight_quantizer\.1\._amax"):
        dst.load_state_dict(sd, strict=True)
    dst = _toy(toy_cls, [9.0] * _N_EXPERTS)
    dst.load_state_dict(sd, strict=False)
    assert _amaxes(dst)[1:] == [None] * (_N_EXPERTS - 1)


def test_load_state_dict_keeps_every_expert_amax(toy_cls, fixed_post_restore):
    src = [1.0, 2.0, 3.0, 4.0]
    sd = _toy(toy_cls, src).state_dict()
    dst = _toy(toy_cls, [9.0] * _N_EXPERTS)
    result = dst.load_state_dict(sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert _amaxes(dst) == src


def test_two_pass_resume_keeps_every_expert_amax(toy_cls, fixed_post_restore):
    """Megatron resume: first load carries only ``_extra_state`` into a model without buffers
    (restore_quantizer_state skips torch-dist), the next sharded_state_dict must then ask for
    every expert's amax, and the second load fills it."""
    src = [1.0, 2.0, 3.0, 4.0]
    full = _toy(toy_cls, src).state_dict()
    dst = _toy(toy_cls)
    assert _amaxes(dst) == [None] * _N_EXPERTS
    dst.load_state_dict({"_extra_state": full["_extra_state"]}, strict=False)
    wanted = {k for k in dst.state_dict() if k.startswith("weight_quantizer.")}
    assert wanted == {f"weight_quantizer.{i}._amax" for i in range(_N_EXPERTS)}
    dst.load_state_dict({k: v for k, v in full.items() if k != "_extra_state"}, strict=False)
    assert _amaxes(dst) == src


# --- (c) row-parallel shard axis ---------------------------------------------------------------------
def test_row_shard_axis_covers_every_expert():
    import torch.nn as nn
    import modelopt.torch.quantization.plugins.megatron as mp
    from modelopt.torch.quantization.nn import GroupedQuantizer, TensorQuantizer

    holder = nn.Module()
    holder.weight_quantizer = GroupedQuantizer(*(TensorQuantizer() for _ in range(_N_EXPERTS)))
    for q in holder.weight_quantizer:
        q.axis = (0,)  # static block amax: row-parallel shards it along dim 1
    keys = [f"weight_quantizer.{i}._amax" for i in range(_N_EXPERTS)]
    keys += ["weight_quantizer.2._global_amax", "input_quantizer._pre_quant_scale"]
    state = dict.fromkeys(keys)

    fixed = fx.row_parallel_shard_axis_dict(holder, state)
    assert fixed == {**{f"weight_quantizer.{i}._amax": 1 for i in range(_N_EXPERTS)},
                     "input_quantizer._pre_quant_scale": 0}
    original = mp._MegatronRowParallelLinear._get_shard_axis_dict(holder, state)
    if not getattr(mp._MegatronRowParallelLinear._get_shard_axis_dict, fx._MARK, False):
        assert "weight_quantizer.2._amax" not in original  # the latent bug, as shipped
    assert {k: v for k, v in fixed.items() if k in original} == original  # .0/.1 unchanged

    for q in holder.weight_quantizer:
        q.axis = None  # dynamic/per-tensor: nothing sharded
    assert fx.row_parallel_shard_axis_dict(holder, state) == {"input_quantizer._pre_quant_scale": 0}


# --- the environment route ---------------------------------------------------------------------------
def test_autoload_chains_other_sitecustomize_and_arms_lazily(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    probe = (
        "import os, sys\n"
        "print(os.environ.get('OTHER_SITECUSTOMIZE'))\n"
        "print([type(f).__name__ for f in sys.meta_path][0])\n"
        "print('modelopt' in sys.modules, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{AUTOLOAD}{os.pathsep}{other}", "MOE_CKPT_FIX": "1"}
    r = bounded([sys.executable, "-c", probe], 180, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["ran", "_ApplyAfterImport", "False False"]

    env["MOE_CKPT_FIX"] = "0"
    r = bounded([sys.executable, "-c", probe], 180, env=env)
    assert r.returncode == 0, r.stderr
    ran, first_finder = r.stdout.split("\n")[:2]
    assert ran == "ran" and first_finder != "_ApplyAfterImport"  # off: chains, arms nothing


def _autoload_python(fix_value: str | None, code: str) -> Finished:
    """``python -W ignore -c CODE`` through the autoload route, bounded; warnings off so that
    stderr holds only what the route itself says."""
    env = {k: v for k, v in os.environ.items() if k != "MOE_CKPT_FIX"}
    env.update({"PYTHONPATH": str(AUTOLOAD), "MOE_CKPT_FIX_VERBOSE": "1"})
    if fix_value is not None:
        env["MOE_CKPT_FIX"] = fix_value
    return bounded([sys.executable, "-W", "ignore", "-c", code], 180, env=env, cwd="/")


IMPORT_MODELOPT = "import modelopt.torch; print('imported')"


@pytest.mark.parametrize("value", ["banana", "2", "on", "enable", "tru"])
def test_autoload_bad_switch_value_stops_with_one_line(value):
    """A typo must not leave the job unpatched: one line naming the variable, the value and the
    accepted values, exit code 2, before anything is imported."""
    r = _autoload_python(value, IMPORT_MODELOPT)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "MOE_CKPT_FIX" in lines[0] and repr(value) in lines[0]
    assert "1/true/yes" in lines[0] and "unset/empty/0/false/no" in lines[0]
    assert "imported" not in r.stdout


@pytest.mark.parametrize("value", [None, "", "0", "false", "No", " FALSE "])
def test_autoload_off_values_arm_nothing(value):
    r = _autoload_python(value, "import sys; print([type(f).__name__ for f in sys.meta_path])")
    assert r.returncode == 0, r.stderr
    assert "_ApplyAfterImport" not in r.stdout and r.stderr == ""


@pytest.mark.parametrize("value", ["1", " Yes "])
def test_autoload_on_values_arm_the_hook(value):
    r = _autoload_python(value, "import sys; print(type(sys.meta_path[0]).__name__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "_ApplyAfterImport"


@pytest.mark.skipif(_te_importable(), reason="Transformer Engine is importable here")
@pytest.mark.slow  # an interpreter importing modelopt to be refused; the wheel's own autoload stays
@pytest.mark.parametrize("value", ["1", "TRUE"])
def test_autoload_refusal_stops_the_importing_process_with_one_line(value):
    """No Transformer Engine: the refusal is one line and exit code 3, not a traceback, and not
    swallowed (modelopt turns exceptions raised while importing its plugins into warnings)."""
    r = _autoload_python(value, IMPORT_MODELOPT)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("[MOE_CKPT_FIX] TransformerEngineMissing:")
    assert "Nothing was patched" in lines[0]
    assert "imported" not in r.stdout


def test_refusals_share_one_base_class():
    """The autoload route catches ``harness.fix.Refused``; every refusal of apply() must be one."""
    assert issubclass(fix.UnsupportedModeloptVersion, fix.Refused)
    assert issubclass(fix.TransformerEngineMissing, fix.Refused)
    with pytest.raises(fix.Refused, match="does not reference"):
        fx._require_calls(lambda: None, ["reset_amax"], "a changed method")
