"""The host-staged pipeline exchange that lets tier gpu-shared (gloo ranks on a GPU) run
megatron-core's pipeline schedule: real gloo ranks under torchrun, both directions at once."""
from __future__ import annotations

import pytest

from harness.launch.stages import run_module_stage

pytestmark = pytest.mark.cpu


def test_each_rank_gets_its_neighbours_tensors(tmp_path):
    r = run_module_stage("save", tmp_path / "ring", 4, [], 90.0, "tests.rank_programs.ring_exchange",
                         pg_timeout_s=20.0)
    assert r.ok and r.cause is None, r.summary()
    for rank, got in r.rank_results.items():
        prev, nxt = (rank - 1) % 4, (rank + 1) % 4
        assert got["from_prev"] == [float(prev)], got  # prev sent its rank to its next
        assert got["from_next"] == [100.0 + nxt], got  # next sent 100 + its rank to its prev
        assert got["only_next"] == [7.0, float(nxt)], got


def test_megatron_calls_it_through_the_ring_exchange_hook():
    """gpt.transformer_config switches megatron to ``use_ring_exchange_p2p`` only for pp > 1
    on gloo with CUDA; megatron then calls ``torch.distributed.ring_exchange`` with these names."""
    import inspect

    from megatron.core.pipeline_parallel import p2p_communication

    src = inspect.getsource(p2p_communication.P2PCommunicator)
    assert "torch.distributed.ring_exchange(**kwargs)" in src
    for name in ("tensor_send_prev", "tensor_recv_prev", "tensor_send_next", "tensor_recv_next"):
        assert f"{name}={name}" in src, name
    assert "prev_pipeline_rank=prev_rank" in src and "next_pipeline_rank=next_rank" in src


def test_router_records_of_all_stages_reach_every_stage(tmp_path):
    """At pp > 1 each stage records its own layers' routers; the logits owner (last stage) needs
    all of them to count routing flips."""
    r = run_module_stage("load", tmp_path / "gather", 2, [], 120.0,
                         "tests.rank_programs.routing_gather", pg_timeout_s=60.0)
    assert r.ok and r.cause is None, r.summary()
    for got in r.rank_results.values():
        assert got["layers"] == ["layer1", "layer2"], got
        assert got["values"] == {"layer1": False, "layer2": True}, got
