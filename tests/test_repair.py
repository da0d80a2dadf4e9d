"""``python -m harness repair`` and the per-pair forecast of ``inspect``, cpu tier.

The rules checked come from the files and the releases' sources, not from repair's own output:
ModelOpt's max calibration stored max|W_e| in every amax of the complete 0.47.0 golden (so a
recompute must match it bit for bit); the 0.46.1 golden's shared amax is what 0.46.x applied to
every expert; the 0.47.0 golden (same seed and topology) shows what a per-expert release writes
for each expert linear's ``_extra_state``.
"""
from __future__ import annotations

import dataclasses

import errno
import hashlib
import io
import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.golden import forecast, repair, repair_plan, synthetic
from harness.golden.layout import inspect_checkpoint
from harness.golden.manifest import copy_to_temp, verify_manifest
from harness.scenario.scenarios import GOLDEN_DIR

A, B, C = ("modelopt-0.46.1-tp1-etp1-ep8", "modelopt-0.47.0-tp1-etp1-ep8",
           "modelopt-0.47.0-tp2-etp1-ep2-novalidate")
LINEARS = [f"decoder.layers.{l}.mlp.experts.experts.{{e}}.linear_fc{f}" for l in (0, 1) for f in (1, 2)]
ROOT = Path(__file__).resolve().parents[1]


def _tree_hash(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    root = tmp_path_factory.mktemp("goldens")
    return {n: copy_to_temp(GOLDEN_DIR / n, into=root) for n in (A, B, C)}


@pytest.fixture(scope="module")
def repaired(goldens, tmp_path_factory):
    out = tmp_path_factory.mktemp("repaired")
    result = {}
    for n in (A, C):
        before = _tree_hash(goldens[n] / "ckpt")
        plan = repair.repair(goldens[n] / "ckpt", out / n)
        assert _tree_hash(goldens[n] / "ckpt") == before  # SRC untouched
        verify_manifest(goldens[n])
        result[n] = (plan, repair.Source(out / n))
    return result


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.cpu
def test_recomputed_amax_equals_the_complete_goldens_saved_amax_bit_for_bit(goldens):
    src = repair.Source(goldens[B] / "ckpt")
    n = 0
    for lin in LINEARS:
        for e in range(8):
            saved = src.tensor(lin.format(e=e) + ".weight_quantizer._amax")
            again = repair.max_calibrated_amax(src.tensor(lin.format(e=e) + ".weight"), saved.dtype)
            assert torch.equal(_bits(saved), _bits(again)), (lin, e)
            n += 1
    assert n == 32
    plan = repair_plan.plan_repair(goldens[B] / "ckpt", goldens[B].parent / "unused")
    assert plan.derived == {} and plan.dropped == [] and plan.rewritten_objects == []


@pytest.mark.cpu
def test_repaired_shared_golden_is_complete_with_the_shared_value(goldens, repaired):
    plan, dst = repaired[A]
    lay = inspect_checkpoint(plan.dst)
    assert lay.kind == "per-expert" and lay.missing == {}
    assert sum(len(li.present) for li in lay.linears) == 32 and not lay.shared_keys
    src = repair.Source(goldens[A] / "ckpt")
    for lin in LINEARS:
        shared = src.tensor(lin.replace(".{e}", "") + ".weight_quantizer._amax")
        for e in range(8):
            assert torch.equal(_bits(dst.tensor(lin.format(e=e) + ".weight_quantizer._amax")), _bits(shared))
    # 0.46.1's shared amax is expert 0's own (EP rank 0 wrote it): the 0.47.0 golden agrees
    b = repair.Source(goldens[B] / "ckpt")
    for lin in LINEARS:
        k = lin.format(e=0) + ".weight_quantizer._amax"
        assert torch.equal(_bits(dst.tensor(k)), _bits(b.tensor(k)))


@pytest.mark.cpu
def test_repaired_shared_golden_extra_state_is_what_a_per_expert_release_writes(goldens, repaired):
    plan, dst = repaired[A]
    keys = sorted(k for k in dst.md.state_dict_metadata if "_extra_state" in k)
    assert len(plan.rewritten_objects) == 32
    got, want = dst.raw_objects(keys), repair.Source(goldens[B] / "ckpt").raw_objects(keys)
    assert [k for k in keys if got[k] != want[k]] == []  # byte-equal to the 0.47.0 golden's


@pytest.mark.cpu
def test_repaired_novalidate_golden_gets_max_abs_weight_for_its_missing_experts(goldens, repaired):
    plan, dst = repaired[C]
    assert inspect_checkpoint(plan.dst).missing == {}
    assert sorted({int(k.split(".experts.experts.")[1].split(".")[0]) for k in plan.derived}) == [4, 5, 6, 7]
    src = repair.Source(goldens[C] / "ckpt")
    for lin in LINEARS:
        for e in range(8):
            w = src.tensor(lin.format(e=e) + ".weight")  # the global tensor: both TP shards
            want = w.float().abs().amax().reshape(1).to(torch.bfloat16)
            assert torch.equal(_bits(dst.tensor(lin.format(e=e) + ".weight_quantizer._amax")), _bits(want))


@pytest.mark.cpu
@pytest.mark.parametrize("name", [A, C])
def test_every_other_tensor_is_sha256_equal(goldens, repaired, name):
    plan, dst = repaired[name]
    src = repair.Source(goldens[name] / "ckpt")
    assert plan.copied and set(plan.hashes) == set(plan.copied)
    for k in plan.copied:
        assert repair.tensor_sha256(dst.tensor(k)) == repair.tensor_sha256(src.tensor(k)), k
    for rel in ("metadata.json", "modelopt_state/.metadata", "modelopt_state/__0_0.distcp"):
        assert (plan.dst / rel).read_bytes() == (goldens[name] / "ckpt" / rel).read_bytes()


LOAD_SCRIPT = textwrap.dedent("""
    import sys, warnings; warnings.filterwarnings("ignore")
    import torch.distributed as dist
    if __name__ == "__main__":
        dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
        from megatron.core import dist_checkpointing
        for ckpt in sys.argv[2:]:
            sd = dist_checkpointing.load_plain_tensors(ckpt)
            print(ckpt, len(sd), sum(".experts.experts." in k and k.endswith("weight_quantizer._amax") for k in sd))
        dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def loaded(repaired, tmp_path_factory) -> dict[str, list[str]]:
    """Every repaired DST loaded by megatron-core's own torch_dist load in ONE process (a gloo
    world of one): what each printed (tensors, per-expert weight amax), by name. One megatron
    import for all of them instead of one per checkpoint."""
    from tests.helpers import bounded

    d = tmp_path_factory.mktemp("load")
    (d / "load.py").write_text(LOAD_SCRIPT)
    names = list(repaired)
    out = bounded([sys.executable, str(d / "load.py"), str(d / "store"),
                   *(str(repaired[n][0].dst) for n in names)], 180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.rsplit(" ", 2) for line in out.stdout.splitlines() if line.count(" ") >= 2]
    by_dst = {dst: counts for dst, *counts in lines}
    return {n: by_dst.get(str(repaired[n][0].dst), []) for n in names}


@pytest.mark.cpu
@pytest.mark.parametrize("name", [A, C])
def test_repaired_checkpoint_loads_through_megatron_core(loaded, name):
    """megatron-core's own torch_dist load (a gloo world of one) reads every tensor of DST."""
    assert loaded[name] == ["95", "32"], loaded


def _args(src, dst, dry_run=False):
    return SimpleNamespace(src=str(src), dst=str(dst), dry_run=dry_run)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.cpu
def test_dst_exists_is_one_line(goldens, tmp_path, capsys):
    (tmp_path / "dst").mkdir()
    assert repair.main(_args(goldens[A] / "ckpt", tmp_path / "dst")) == 2
    assert "exists" in _one_line_error(capsys)


@pytest.mark.cpu
def test_dst_inside_src_is_refused(goldens, capsys):
    before = _tree_hash(goldens[A] / "ckpt")
    assert repair.main(_args(goldens[A] / "ckpt", goldens[A] / "ckpt" / "fixed")) == 2
    assert "inside" in _one_line_error(capsys)
    assert _tree_hash(goldens[A] / "ckpt") == before


@pytest.mark.cpu
def test_not_a_checkpoint_and_damaged_src_are_one_line(tmp_path, goldens, capsys):
    (tmp_path / "plain").mkdir()
    assert repair.main(_args(tmp_path / "plain", tmp_path / "d1")) == 2
    assert "metadata.json" in _one_line_error(capsys)
    bad = copy_to_temp(GOLDEN_DIR / C, into=tmp_path) / "ckpt"
    f = bad / "__1_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    before = _tree_hash(bad)
    assert repair.main(_args(bad, tmp_path / "d2")) == 3
    assert "__1_0.distcp: truncated" in _one_line_error(capsys)
    assert _tree_hash(bad) == before and not (tmp_path / "d2").exists()


@pytest.mark.cpu
def test_no_space_is_one_line(goldens, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(repair.shutil, "disk_usage", lambda p: SimpleNamespace(free=1000))
    assert repair.main(_args(goldens[A] / "ckpt", tmp_path / "dst")) == 2
    assert "no space left" in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cpu
@pytest.mark.parametrize("failure", ["enospc", "crash"])
def test_a_failure_mid_write_leaves_no_dst(goldens, tmp_path, capsys, monkeypatch, failure):
    real, calls = repair.Source.tensor, []

    def failing(self, key):
        calls.append(key)
        if len(calls) == 20:  # well into the writing of the tensors
            if failure == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("injected")
        return real(self, key)

    monkeypatch.setattr(repair.Source, "tensor", failing)
    before = _tree_hash(goldens[C] / "ckpt")
    if failure == "enospc":
        assert repair.main(_args(goldens[C] / "ckpt", tmp_path / "dst")) == 2
        assert "no space left" in _one_line_error(capsys)
    else:
        with pytest.raises(Exception, match="injected"):
            repair.repair(goldens[C] / "ckpt", tmp_path / "dst")
    assert len(calls) == 20 and list(tmp_path.iterdir()) == []  # no DST, no partial directory
    assert _tree_hash(goldens[C] / "ckpt") == before


@pytest.mark.cpu
def test_dry_run_writes_nothing(goldens, tmp_path, capsys):
    assert repair.main(_args(goldens[C] / "ckpt", tmp_path / "dst", dry_run=True)) == 0
    out = capsys.readouterr().out
    assert "dry run (nothing written)" in out and "16 by max calibration" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cpu
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_complete_checkpoint_is_nothing_to_repair_and_no_dst(goldens, tmp_path, capsys, dry_run):
    """The complete 0.47.0 golden needs nothing: one line, exit 0, no copy written."""
    before = _tree_hash(goldens[B] / "ckpt")
    assert repair.main(_args(goldens[B] / "ckpt", tmp_path / "dst", dry_run=dry_run)) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.strip().splitlines()) == 1, out
    assert out.startswith("nothing to repair: ") and "(layout per-expert, 32 present)" in out
    assert f"{tmp_path / 'dst'} not written" in out
    assert list(tmp_path.iterdir()) == [] and _tree_hash(goldens[B] / "ckpt") == before


@pytest.mark.cpu
def test_golden_repair_of_a_complete_golden_writes_no_golden(goldens, tmp_path):
    with pytest.raises(repair.NothingToRepair, match="nothing to repair"):
        repair.repair_golden(goldens[B], tmp_path / "new-golden")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cpu
def test_forecast_per_pair_from_the_version_rules(goldens):
    every = {n: {(f.modelopt, f.megatron_core): f
                 for f in forecast.forecast(inspect_checkpoint(goldens[n] / "ckpt"))}
             for n in (A, B, C)}
    got = {n: {mo: f for (mo, mc), f in fs.items() if mc == "0.19.2"} for n, fs in every.items()}
    assert got[A]["0.48.0rc1"].outcome == forecast.LOADS_ABSENT and got[A]["0.48.0rc1"].absent == 32
    assert got[A]["0.46.x"].outcome == forecast.LOADS_COMPLETE
    assert got[B]["0.48.0rc1"].outcome == forecast.LOADS_COMPLETE
    assert got[C]["0.48.0rc1"].outcome == forecast.REFUSED and got[C]["0.48.0rc1"].absent == 16
    assert "CheckpointException" in got[C]["0.48.0rc1"].line
    assert got[C]["0.47.0"].outcome == forecast.DEPENDS
    assert all(f.megatron_core == "0.19.2" for fs in got.values() for f in fs.values())
    # these files were written by megatron-core 0.19.2 (no common.pt): 0.16.1 cannot read them
    assert "common.pt" in every[B][("0.48.0rc1", "0.16.1")].line
    # the other megatron-core bands (harness/check/versions.py) for a checkpoint of this kind in
    # that megatron-core's own format: 0.48.0rc1 on 0.15 cannot build any checkpoint request;
    # 0.47.0 on 0.15 is refused on the shared input amax at TP > ETP
    every = {n: {(f.modelopt, f.megatron_core): f for f in forecast.forecast(dataclasses.replace(
                 inspect_checkpoint(goldens[n] / "ckpt"), has_common_pt=None))}
             for n in (A, B, C)}
    assert every[B][("0.48.0rc1", "0.15.3")].outcome == forecast.REFUSED
    assert "TypeError" in every[B][("0.48.0rc1", "0.15.3")].line
    assert every[B][("0.48.0rc1", "0.16.1")].outcome == forecast.LOADS_COMPLETE
    assert "input_quantizer" in every[B][("0.47.0", "0.15.3")].line
    assert ("0.46.x", "0.15.3") not in every[A]  # no rule for that pair


@pytest.mark.cpu
def test_inspect_json_carries_the_forecast(goldens, capsys):
    from harness.golden.inspect import main

    assert main(SimpleNamespace(ckpt=str(goldens[C] / "ckpt"), json=True)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {f["modelopt"]: f["outcome"] for f in doc["forecast"]
            if f["megatron_core"] == "0.19.2"}["0.48.0rc1"] == "refused"


@pytest.mark.cpu
@pytest.mark.parametrize("layout", [synthetic.SHARED, synthetic.INCOMPLETE])
def test_a_non_harness_checkpoint_is_inspected_and_repaired_by_pattern(tmp_path, layout):
    src = synthetic.synthesize(tmp_path / "src", layers=3, experts=6, layout=layout,
                               prefix="model.language_model.decoder")
    lay = inspect_checkpoint(src)
    assert (lay.num_layers, lay.num_experts) == (3, 6)
    assert lay.kind == ("shared" if layout == synthetic.SHARED else "per-expert")
    plan = repair.repair(src, tmp_path / "dst")
    fixed = inspect_checkpoint(tmp_path / "dst")
    assert fixed.kind == "per-expert" and fixed.missing == {}
    assert sum(len(li.present) for li in fixed.linears) == 3 * 2 * 6
    want = 36 if layout == synthetic.SHARED else 18
    assert len(plan.derived) == want
    fc = {f.modelopt: f.outcome for f in forecast.forecast(fixed) if f.megatron_core == "0.19.2"}
    assert fc["0.48.0rc1"] == forecast.LOADS_COMPLETE
    if layout == synthetic.SHARED:
        raw = repair.Source(tmp_path / "dst").raw_objects(plan.rewritten_objects[:1])
        (data,) = torch.load(io.BytesIO(next(iter(raw.values()))), weights_only=False)
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)
        assert "weight_quantizer.0" in state["modelopt_quantizer_state"]
        assert "weight_quantizer" not in state["modelopt_quantizer_state"]


@pytest.mark.cpu
@pytest.mark.parametrize("name", [A, C])
def test_committed_repaired_golden_is_what_repair_writes(goldens, repaired, name):
    """tests/golden/<name>-repaired (what the GPU scenario gpu-golden-repaired loads) holds the
    same keys, tensors and objects as a repair made now."""
    plan, fresh = repaired[name]
    committed = repair.Source(copy_to_temp(GOLDEN_DIR / f"{name}-repaired", into=plan.dst.parent) / "ckpt")
    assert set(committed.md.state_dict_metadata) == set(fresh.md.state_dict_metadata)
    for k in plan.copied + list(plan.derived):
        assert repair.tensor_sha256(committed.tensor(k)) == repair.tensor_sha256(fresh.tensor(k)), k
    objs = plan.copied_objects + plan.rewritten_objects
    assert committed.raw_objects(objs) == fresh.raw_objects(objs)


@pytest.mark.cpu
def test_repaired_shared_golden_differs_from_a_fresh_calibration_only_in_experts_1_to_7_amax(goldens, repaired):
    """The 0.47.0 golden is the same weights (seed, topology) calibrated fresh: the repaired
    0.46.1 golden equals it in every key but the weight amax of experts 1-7 whose own max|W|
    differs from expert 0's: they carry the shared value (expert 0's) that 0.46.x loads for
    every expert."""
    _, dst = repaired[A]
    fresh = repair.Source(goldens[B] / "ckpt")
    tensors = [k for k, v in fresh.md.state_dict_metadata.items() if hasattr(v, "chunks")]
    assert set(tensors) == {k for k, v in dst.md.state_dict_metadata.items() if hasattr(v, "chunks")}
    differing = sorted(k for k in tensors if not torch.equal(_bits(dst.tensor(k)), _bits(fresh.tensor(k))))
    # exactly the experts whose own max|W| differs from expert 0's (one of 28 happens to tie in bf16)
    own_differs = sorted(
        lin.format(e=e) + ".weight_quantizer._amax" for lin in LINEARS for e in range(1, 8)
        if not torch.equal(_bits(fresh.tensor(lin.format(e=e) + ".weight_quantizer._amax")),
                           _bits(fresh.tensor(lin.format(e=0) + ".weight_quantizer._amax"))))
    assert differing == own_differs and len(differing) >= 24


@pytest.mark.cpu
def test_verdict_advice_names_the_command_per_release():
    from harness.golden.forecast import advice

    on_048 = "\n".join(advice("0.48.0rc1"))
    # the 0.46.x and the novalidate kinds, on megatron-core 0.16.1 and 0.19.2; on 0.15.3
    # 0.48.0rc1 refuses every load (TypeError): move megatron-core first
    assert on_048.count("python -m harness repair") == 4
    assert on_048.count("move to megatron-core >= 0.16") == 3
    assert "TP == ETP + megatron-core 0.19.2: loads complete (32 expert amax restored) -> nothing to do" in on_048
    on_047 = "\n".join(advice("0.47.0"))
    assert "python -m harness repair" not in on_047 and on_047.count("harness.fix") == 6
    assert on_047.count("+ megatron-core 0.15.3") == 3  # harness.fix refuses there
