"""harness/check/defects.py as a unit: which megatron-core releases a band holds, the torch_dist
checkpoint a release cannot read (no common.pt: megatron-core 0.15/0.16 dist_checkpointing/
strategies/common.py load_common needs it, 0.19.2 writes none), the MTP position-embedding
refusal (a learned absolute position embedding at pp > 1 with MTP, read in megatron-core 0.19.2)
and where it is met, and ModelOpt's restore dry run known by its own words (nvidia-modelopt
0.47.0 quantization/tensor_quant.py raises ValueError "Negative values in amax" without the CUDA
extension; CUDA's kernel assert reports "device-side assert triggered"). The bands are those of
moe_ckpt_fix/releases.py. Pure: no rank starts. The mutation run over defects.py
(docs/mutation.md) found these branches untested."""
from __future__ import annotations

import pytest

from harness.check.defects import (COMMON_PT, MODEL_DEFECTS, MTP_POSITION_EMBEDDING, RESTORE_DRY_RUN,
                                   common_pt_problem, defect_covers, in_band, model_defect)
from harness.records import Stage
from harness.topology.topology import Topology
from moe_ckpt_fix.releases import NEEDS_COMMON_PT

pytestmark = pytest.mark.cpu

PP1, PP2, PP4 = (Topology.parse(t) for t in ("tp1-etp1-ep1-pp1", "tp1-etp1-ep1-pp2", "tp1-etp1-ep1-pp4"))
LEARNED = "learned_absolute"


# --- in_band ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mcore,held", [
    ("0.15.3", True), ("0.16.1", True), ("0.16.0", True), ("0.16.1+g51f9c11", True),
    ("0.16.0rc1", True),  # a pre-release of a release the band holds is held
    ("0.19.2", False), ("0.14.0", False), ("0.17.0rc0", False)])
def test_the_common_pt_band_holds_megatron_core_0_15_and_0_16(mcore, held):
    assert NEEDS_COMMON_PT == "==0.15.* || ==0.16.*"
    assert in_band(NEEDS_COMMON_PT, mcore) is held


@pytest.mark.parametrize("band", ["", " ", "||", " || "])
def test_an_empty_band_holds_nothing(band):
    assert in_band(band, "0.19.2") is False


def test_each_alternative_of_a_band_counts_spaces_and_empty_parts_aside():
    assert in_band(" ==0.19.2 ", "0.19.2") is True
    assert in_band("==0.15.* || || ==0.19.2", "0.19.2") is True
    assert in_band("==0.15.* ||", "0.15.3") is True
    assert in_band(">=0.15, <0.16 || ==0.19.2", "0.16.1") is False


# --- common_pt_problem ------------------------------------------------------------------------

@pytest.mark.parametrize("mcore", ["0.15.3", "0.16.1", "0.16.1+g51f9c11"])
def test_a_checkpoint_without_common_pt_is_unreadable_to_0_15_and_0_16(tmp_path, mcore):
    problem = common_pt_problem(tmp_path, mcore)
    assert problem.startswith(f"{tmp_path}: no {COMMON_PT}: megatron-core {mcore} reads only "
                              "torch_dist checkpoints that have one (written by megatron-core <= 0.16)")
    assert "load it with the megatron-core that wrote it" in problem
    # the path to show, where given, stands for the directory
    assert common_pt_problem(str(tmp_path), mcore, shown="tests/golden/g/ckpt").startswith(
        f"tests/golden/g/ckpt: no {COMMON_PT}: megatron-core {mcore} ")


@pytest.mark.parametrize("mcore", ["0.19.2", "0.19.2+g51f9c11", None, "", "not-a-version"])
def test_a_checkpoint_without_common_pt_is_readable_to_the_others(tmp_path, mcore):
    assert common_pt_problem(tmp_path, mcore) is None


def test_a_checkpoint_with_common_pt_is_readable_to_0_16(tmp_path):
    (tmp_path / COMMON_PT).write_bytes(b"")
    assert common_pt_problem(tmp_path, "0.16.1") is None
    assert common_pt_problem(str(tmp_path), "0.15.3") is None


def test_a_common_pt_that_is_not_a_file_does_not_count(tmp_path):
    (tmp_path / COMMON_PT).mkdir()
    assert common_pt_problem(tmp_path, "0.16.1") is not None


# --- the MTP position embedding ---------------------------------------------------------------

def test_the_mtp_defect_is_the_only_model_defect_and_read_in_0_19_2():
    assert MODEL_DEFECTS == (MTP_POSITION_EMBEDDING,)
    assert MTP_POSITION_EMBEDDING.key == "embedding.position_embeddings.weight"
    assert (MTP_POSITION_EMBEDDING.exception, MTP_POSITION_EMBEDDING.text) == (
        "CheckpointingException", "Invalid access pattern")


@pytest.mark.parametrize("mtp,embedding,topo,reached", [
    (1, LEARNED, PP2, True), (2, LEARNED, PP4, True),
    (1, LEARNED, PP1, False),          # one stage: the MTP block shares the first stage's embedding
    (0, LEARNED, PP2, False), (None, LEARNED, PP2, False),   # no MTP
    (1, "rope", PP2, False), (1, None, PP2, False), (1, "none", PP2, False)])
def test_the_mtp_defect_needs_mtp_a_learned_position_embedding_and_pp_above_1(mtp, embedding, topo, reached):
    assert MTP_POSITION_EMBEDDING.reached(mtp, embedding, topo) is reached


def test_the_stage_that_meets_the_mtp_defect_first():
    assert model_defect(1, LEARNED, PP2, PP1) == (MTP_POSITION_EMBEDDING, Stage.SAVE)
    assert model_defect(1, LEARNED, PP2, PP4) == (MTP_POSITION_EMBEDDING, Stage.SAVE)
    assert model_defect(1, LEARNED, PP1, PP2) == (MTP_POSITION_EMBEDDING, Stage.LOAD)
    assert model_defect(1, LEARNED, PP2, None) == (MTP_POSITION_EMBEDDING, Stage.SAVE)
    assert model_defect(1, LEARNED, None, PP2) == (MTP_POSITION_EMBEDDING, Stage.LOAD)


def test_no_stage_meets_the_mtp_defect_without_its_modules_or_pp_above_1():
    assert model_defect(1, LEARNED, PP1, PP1) is None
    assert model_defect(1, LEARNED, PP1, None) is None
    assert model_defect(None, LEARNED, PP2, PP2) is None
    assert model_defect(1, "rope", PP2, PP2) is None


@pytest.mark.parametrize("mcore,covers", [("0.19.2", True), ("0.19.2+g51f9c11", True),
                                          ("0.16.1", False), ("0.19.3", False), (None, False),
                                          ("", False), ("not-a-version", False)])
def test_the_mtp_defect_is_covered_only_where_it_was_read(mcore, covers):
    assert defect_covers(MTP_POSITION_EMBEDDING, mcore) is covers


# --- the restore dry run ----------------------------------------------------------------------

@pytest.mark.parametrize("message", [
    "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`",
    "torch.AcceleratorError: CUDA error: device-side assert triggered",
    "ValueError: Negative values in amax"])
def test_the_dry_run_is_seen_by_its_own_words(message):
    assert RESTORE_DRY_RUN.seen(message) is True


@pytest.mark.parametrize("message", [None, "", "CUDA error: out of memory",
                                     "Invalid access pattern for ShardedTensor", "negative values"])
def test_another_failure_is_not_the_dry_run(message):
    assert RESTORE_DRY_RUN.seen(message) is False
