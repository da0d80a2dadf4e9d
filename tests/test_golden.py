"""Golden checkpoint manifests: a changed byte or a missing/unlisted file fails, naming the file.

The temp checkpoint is a real torch_dist save on CPU (one gloo rank, hand-built ShardedTensors
with the recorded keys of one layer: tests/rank_programs/make_ckpt.py, the same run that writes
tests/test_inspect_ckpt.py's checkpoints: conftest.py ``made_checkpoints``). Committed goldens
(tests/golden/*/manifest.json) are verified when there are any.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.golden.manifest import GoldenError, copy_to_temp, discover, verify_manifest, write_manifest
from tests.helpers import MAKE_CKPT_GROUP

GOLDEN_ROOT = Path(__file__).parent / "golden"

pytestmark = pytest.mark.xdist_group(MAKE_CKPT_GROUP)


@pytest.fixture(scope="module")
def golden(made_checkpoints) -> Path:
    """The keys of one layer of a tp2-etp2-ep4 recording, seed 3, written by the session's one
    make-ckpt torchrun (conftest.py ``made_checkpoints``), with its manifest."""
    d = made_checkpoints["golden/tiny-per-expert"].parent
    write_manifest(d, topology="tp2-etp2-ep4-pp1", made_by="tests/test_golden.py", layout="per-expert",
                   date="2026-12-02")
    return d


@pytest.mark.cpu
def test_manifest_pins_every_file(golden):
    doc = verify_manifest(golden)
    assert set(doc["files"]) == {"ckpt/.metadata", "ckpt/__0_0.distcp", "ckpt/metadata.json"}
    assert set(doc["versions"]) >= {"nvidia-modelopt", "megatron-core", "transformer-engine", "torch"}
    assert doc["versions"]["megatron-core"].startswith("0.19.2")


@pytest.mark.cpu
def test_modified_byte_is_named(golden, tmp_path):
    copy = copy_to_temp(golden, into=tmp_path)
    data = copy / "ckpt" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(GoldenError, match=r"file ckpt/__0_0\.distcp changed"):
        verify_manifest(copy)
    verify_manifest(golden)  # the original is untouched


@pytest.mark.cpu
def test_missing_and_unlisted_files_are_named(golden, tmp_path):
    copy = copy_to_temp(golden, into=tmp_path)
    (copy / "ckpt" / ".metadata").unlink()
    with pytest.raises(GoldenError, match=r"file ckpt/\.metadata listed in manifest\.json is missing"):
        verify_manifest(copy)
    copy2 = copy_to_temp(golden, into=tmp_path)
    (copy2 / "ckpt" / "extra.bin").write_bytes(b"x")
    with pytest.raises(GoldenError, match=r"file ckpt/extra\.bin is not in manifest\.json"):
        verify_manifest(copy2)
    copy3 = copy_to_temp(golden, into=tmp_path)
    (copy3 / "manifest.json").unlink()
    with pytest.raises(GoldenError, match="manifest.json missing"):
        verify_manifest(copy3)


@pytest.mark.cpu
def test_copy_to_temp_refuses_a_bad_golden(golden, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(golden, bad)
    (bad / "ckpt" / "metadata.json").write_text("{}")
    with pytest.raises(GoldenError, match="metadata.json changed"):
        copy_to_temp(bad, into=tmp_path)


@pytest.mark.cpu
def test_inspector_reads_the_copy(golden, tmp_path):
    from harness.golden.layout import inspect_checkpoint

    lay = inspect_checkpoint(copy_to_temp(golden, into=tmp_path) / "ckpt")
    assert lay.kind == "per-expert" and lay.num_experts == 8 and lay.missing == {}


_COMMITTED = discover(GOLDEN_ROOT)


@pytest.mark.cpu
@pytest.mark.parametrize("golden_dir", _COMMITTED or [None], ids=[p.name for p in _COMMITTED] or ["none"])
def test_committed_goldens_verify(golden_dir, tmp_path):
    if golden_dir is None:
        pytest.skip("no golden checkpoints committed yet: generate with tools/gpu-host/make-golden.sh on a GPU host")
    copy = copy_to_temp(golden_dir, into=tmp_path)
    doc = verify_manifest(copy)
    if doc.get("layout"):
        from harness.golden.layout import inspect_checkpoint

        assert inspect_checkpoint(copy / "ckpt").kind == doc["layout"]
