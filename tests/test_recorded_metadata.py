"""Recordings of REAL sharded-state-dict metadata (TE TEGroupedMLP + ModelOpt, on an H200 GPU)
replayed on the cpu tier: through megatron-core's real validation on gloo ranks, and against
the oracle's replica rule. This is what ties the CPU-only oracle to the GPU code path.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from harness.topology import oracle
from harness.check.keys import is_expert_weight_amax
from harness.run.validation_probes import run_probe
from harness.topology.coords import rank_coords
from harness.topology.topology import Topology
from harness.check.versions import rules_for

RECORDED = Path(__file__).parent / "data" / "recorded"
# 0.47.0 at the top level (buggy and patched), other versions in a directory named after them.
RECORDINGS = sorted(RECORDED.rglob("*.json"))
REPORT_ERROR = re.compile(
    r"^CheckpointingException: Invalid sharding pattern validation\. Errors: Invalid access "
    r"pattern for ShardedTensor\(key='decoder\.layers\.\d+\.mlp\.experts\.experts\.\d+\."
    r"linear_fc[12]\.weight_quantizer\._amax', dtype=torch\.bfloat16, local_shape=\(1,\), "
    r"global_shape=\(1,\)"
)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _version(doc: dict) -> str:
    return doc["provenance"]["nvidia-modelopt"]


def _rule(doc: dict) -> str:
    """The fix's rule when patched, else the rule of the (modelopt, megatron-core) pair that
    recorded it."""
    if doc["provenance"]["patch"] == "fix":
        return "fixed"
    # the pair that recorded it (every recording so far: megatron-core 0.19.2)
    return rules_for(_version(doc), doc["provenance"].get("megatron-core", "0.19.2")).replica_rule


def _id(path: Path) -> str:
    return str(path.relative_to(RECORDED).with_suffix(""))


@pytest.mark.cpu
def test_recordings_cover_buggy_and_patched_topologies():
    docs = [_load(p) for p in RECORDINGS]
    bug = [d for d in docs if _version(d) == "0.47.0"]
    assert len({d["topology"] for d in bug}) >= 6
    assert {d["provenance"]["patch"] for d in bug} == {"none", "fix"}
    assert all(d["provenance"]["gpu"] and d["provenance"]["transformer-engine"] for d in docs)


@pytest.mark.cpu
@pytest.mark.parametrize("version", ["0.48.0rc1"])
def test_each_later_version_recorded_at_the_same_topologies(version):
    """Unpatched recordings of a later release, at every topology 0.47.0 was recorded at."""
    docs = [_load(p) for p in RECORDINGS]
    want = {d["topology"] for d in docs if _version(d) == "0.47.0"}
    got = {d["topology"] for d in docs if _version(d) == version and d["provenance"]["patch"] == "none"}
    assert got >= want, f"missing under {version}: {sorted(want - got)}"


@pytest.mark.cpu
@pytest.mark.parametrize("path", RECORDINGS, ids=_id)
def test_oracle_predicts_recorded_outcome(path):
    doc = _load(path)
    topo = Topology.parse(doc["topology"])
    assert oracle.predicts_failure(topo, _rule(doc)) == (doc["validation_error"] is not None)
    if doc["validation_error"]:
        assert REPORT_ERROR.match(doc["validation_error"]), doc["validation_error"][:300]


@pytest.mark.cpu
@pytest.mark.parametrize("path", RECORDINGS, ids=_id)
def test_recorded_expert_amax_replica_ids_follow_the_rule(path):
    """Every per-expert amax replica_id the real code emitted equals the oracle's rule."""
    doc = _load(path)
    coords = rank_coords(Topology.parse(doc["topology"]))
    entries = [e for e in doc["entries"] if is_expert_weight_amax(e["key"])]
    assert entries
    for e in entries:
        assert tuple(e["replica_id"]) == oracle.replica_id(coords[e["rank"]], _rule(doc)), e


@pytest.mark.cpu
# Replays above 4 ranks (the report's 8-rank topologies: 27 s on 2 cores) run under -m slow; the
# oracle tests above check every recording, whatever its world size, in `make test` too.
@pytest.mark.parametrize("world", [pytest.param(w, marks=pytest.mark.slow) if w > 4 else w
                                   for w in sorted({_load(p)["world"] for p in RECORDINGS})])
def test_real_validation_replays_recorded_outcome(world, tmp_path):
    """megatron-core's validate_sharding_integrity on gloo ranks, fed the recorded metadata."""
    paths = [str(p) for p in RECORDINGS if _load(p)["world"] == world]
    run = run_probe({"probe": "replay", "recordings": paths}, world, tmp_path / "replay")
    assert run.ok, run.summary()
    replays = {r["recording"]: r["error"] for r in run.rank_results[0]["replays"]}
    for p in paths:
        doc = _load(Path(p))
        got, want = replays[p], doc["validation_error"]
        assert (got is None) == (want is None), (p, got, want)
        if want:  # the same failing keys, in the same words
            assert _keys(got) == _keys(want)


def _keys(error: str) -> list[str]:
    return sorted(re.findall(r"ShardedTensor\(key='([^']+)'", error))
