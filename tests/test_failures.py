"""Classifier unit tests on the exact texts of the bug report and torchrun logs (docs/findings.md)."""
import json
from pathlib import Path

import pytest

from harness.launch import failures as F

DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.cpu

KEY = "decoder.layers.0.mlp.experts.experts.2.linear_fc1.weight_quantizer._amax"
CKPT_MSG = (
    "Invalid sharding pattern validation.\nInvalid access pattern for ShardedTensor("
    f"key='{KEY}', dtype=torch.bfloat16, local_shape=(1,), global_shape=(1,), global_offset=(0,), "
    "axis_fragmentations=(1,), replica_id=(0, 1, 0), prepend_axis_num=0, allow_shape_mismatch=False, "
    "flattened_range=None): tensor([0], dtype=torch.int32)"
)
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:41897. This is typically caused by a remote worker crashing."
)
NCCL_REMOTE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited "
    "or there was a network error, NCCL version 2.27.3\nncclRemoteError: remote process exited prematurely"
)
GLOO_TIMEOUT = "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"

ELASTIC_BLOCK = """\
============================================================
tests.rank_programs.collectives FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_11:52:14
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7707)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7707
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_11:52:14
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 7708)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 7708
============================================================
"""


def err(rank, msg, t, exc="RuntimeError"):
    return {"rank": rank, "stage": "save", "time": t, "exc_type": exc, "message": msg, "traceback": "", "pid": 1}


@pytest.mark.parametrize("text", [GLOO_CLOSED, NCCL_REMOTE, GLOO_TIMEOUT, "ncclRemoteError: remote process exited prematurely",
                                  "Read error [127.0.0.1]:9088: Connection reset by peer", "Broken pipe",
                                  "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"])
def test_secondary_texts(text):
    assert F.secondary_reason(text) is not None


def test_primary_texts():
    assert F.secondary_reason(CKPT_MSG, "megatron.core.dist_checkpointing.core.CheckpointingException") is None
    assert F.secondary_reason("injected failure at before_save on rank 1", "RuntimeError") is None
    assert F.secondary_reason("anything", "torch.distributed.DistBackendError") == "dist-error-type"


def test_failing_key():
    assert F.failing_key(CKPT_MSG) == KEY
    assert F.failing_key("no key here") is None


def test_checkpointing_exception_on_rank0_is_cause_even_when_later():
    """The report's shape: rank 0 raises, rank 1 sees gloo/NCCL fallout (even stamped earlier)."""
    errors = [err(1, GLOO_CLOSED, 100.0), err(0, CKPT_MSG, 100.5, "megatron.core.dist_checkpointing.core.CheckpointingException"),
              err(2, NCCL_REMOTE, 100.7)]
    cause, sec = F.classify("save", errors, [])
    assert (cause.rank, cause.kind, cause.key, cause.secondary) == (0, "exception", KEY, False)
    assert cause.exc_type.endswith("CheckpointingException")
    assert [s.rank for s in sec] == [1, 2] and all(s.secondary for s in sec)


def test_earliest_primary_wins():
    cause, sec = F.classify("load", [err(3, "boom B", 5.0), err(2, "boom A", 4.0)], [])
    assert cause.rank == 2 and sec[0].rank == 3 and sec[0].secondary


def test_elastic_block_parsing():
    assert F.parse_elastic_failures(ELASTIC_BLOCK) == {0: (-15, 7707), 1: (-9, 7708)}
    log = "W... api.py:1028] Sending process 7707 closing signal SIGTERM\n"
    assert F.parse_elastic_signalled(log) == {7707}


def test_unsent_sigkill_is_cause_torchrun_sigterm_is_not():
    exits = [F.RankExit(rank=0, pid=7707, exitcode=-15, died_at=10.2, signalled=True),
             F.RankExit(rank=1, pid=7708, exitcode=-9, died_at=10.1)]
    cause, sec = F.classify("save", [err(2, GLOO_CLOSED, 10.15)], exits)
    assert (cause.rank, cause.kind, cause.exc_type) == (1, "signal", "SIGKILL")
    assert {s.rank for s in sec} == {0, 2}


def test_sigabrt_from_cpp_terminate_names_the_what():
    tail = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 516 vs 8. "
            "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?\n")
    cause, _ = F.classify("save", [], [F.RankExit(rank=0, pid=5, exitcode=-6, died_at=1.0, log_tail=tail)])
    assert cause.kind == "signal" and cause.exc_type == "gloo::EnforceNotMet" and "mismatch" in cause.message


def test_hang_is_the_rank_outside_any_collective():
    in_coll = 'File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce'
    outside = 'File "/repo/harness/rank/inject.py", line 77 in _fire'
    exits = [F.RankExit(rank=1, pid=9, exitcode=-15, died_at=20.0, signalled=True, stack=outside),
             F.RankExit(rank=3, pid=8, exitcode=-15, died_at=20.0, signalled=True, stack=in_coll)]
    cause, sec = F.classify("save", [err(0, GLOO_TIMEOUT, 19.9), err(2, GLOO_TIMEOUT, 19.95)], exits)
    assert (cause.rank, cause.kind) == (1, "hang")
    assert cause.time == 19.9
    assert {s.rank for s in sec} == {0, 2, 3}


# torch's ProcessGroupNCCL watchdog text (ProcessGroupNCCL.cpp, checkTimeout / the watchdog's
# exit message) as a rank's log ends when TORCH_NCCL_ASYNC_ERROR_HANDLING=3 aborts it
NCCL_WATCHDOG_ABORT = (
    "[rank2]:[E1206 08:10:01.1 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
    "Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=16, NumelOut=16, "
    "Timeout(ms)=10000) ran for 10001 milliseconds before timing out.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n")


def test_peers_aborted_by_the_nccl_watchdog_are_secondary_the_hung_rank_is_the_cause():
    outside = 'File "/repo/harness/rank/inject.py", line 77 in _fire'
    exits = [F.RankExit(rank=0, pid=9, exitcode=-15, died_at=11.0, signalled=True, stack=outside),
             *(F.RankExit(rank=r, pid=10 + r, exitcode=-6, died_at=10.0 + r / 100,
                          log_tail=NCCL_WATCHDOG_ABORT.replace("Rank 2", f"Rank {r}")) for r in (1, 2, 3))]
    cause, sec = F.classify("save", [], exits)
    assert (cause.rank, cause.kind) == (0, "hang")
    assert cause.time == 10.01  # stuck at least since the first peer gave up on it
    assert {s.rank for s in sec} == {1, 2, 3} and all(s.secondary for s in sec)


def test_a_cuda_fault_through_the_nccl_watchdog_stays_a_cause():
    tail = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with "
            "exception: CUDA error: an illegal memory access was encountered\n"
            "terminate called after throwing an instance of 'c10::DistBackendError'\n")
    exits = [F.RankExit(rank=0, pid=9, exitcode=-15, died_at=11.0, signalled=True),
             F.RankExit(rank=1, pid=10, exitcode=-6, died_at=10.0, log_tail=tail)]
    cause, _ = F.classify("save", [], exits)
    assert (cause.rank, cause.kind, cause.exc_type) == (1, "signal", "SIGABRT")


def test_a_rank_caught_writing_its_own_error_is_not_the_stuck_one():
    """A peer whose gloo timeout has fired may still be in the guard's failure path, its error
    file unwritten, when the teardown SIGTERM comes: its dump is outside any collective too, and
    as the lower rank it would be named instead of the hung one."""
    reporting = ('File "/repo/harness/rank/guard.py", line 153 in fail\n'
                 'File "/repo/harness/rank/guard.py", line 167 in guarded')
    hung = 'File "/repo/harness/rank/inject.py", line 77 in _fire'
    exits = [F.RankExit(rank=2, pid=8, exitcode=-15, died_at=20.0, signalled=True, stack=reporting),
             F.RankExit(rank=3, pid=9, exitcode=-15, died_at=20.0, signalled=True, stack=hung)]
    cause, sec = F.classify("save", [err(0, GLOO_TIMEOUT, 19.9), err(1, GLOO_TIMEOUT, 19.95)], exits)
    assert (cause.rank, cause.kind) == (3, "hang")
    assert {s.rank for s in sec} == {0, 1, 2}


def test_timeout_without_errors():
    exits = [F.RankExit(rank=r, stack='torch/distributed/distributed_c10d.py' if r != 2 else 'time.sleep') for r in range(4)]
    cause, sec = F.classify("load", [], exits, timed_out=True)
    assert (cause.rank, cause.kind) == (2, "timeout") and len(sec) == 3


def test_no_failures():
    assert F.classify("save", [], []) == (None, [])


def test_all_timed_out_odd_call_site_is_the_mismatch():
    def tb(line):
        return (f'  File "/repo/tests/prog.py", line {line}, in body\n'
                '  File "/v/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n')
    errors = [err(r, GLOO_TIMEOUT, 10.0 + r) for r in range(4)]
    for e in errors:
        e["traceback"] = tb(26 if e["rank"] else 91)
    cause, sec = F.classify("save", errors, [])
    assert cause.rank == 0 and "collective mismatch" in cause.message and len(sec) == 3


def test_failing_key_of_a_key_the_checkpoint_lacks():
    """modelopt 0.48.0rc1 loading a 0.47.0 checkpoint saved without validation (seen on the H200)."""
    from harness.check.keys import failing_key

    text = ('KeyError: "decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax '
            "from model not in state dict: ['common_state/shard_0_1', ...]\"")
    assert failing_key(text) == "decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax"


SIMULTANEOUS = Path(__file__).resolve().parent / "data" / "runs" / "20261203-golden-eq-simultaneous-errors.json"


@pytest.mark.parametrize("mode", ["fresh", "pool"])
def test_simultaneous_primaries_recorded_on_the_gpu_name_the_lowest_rank(mode):
    """Recorded: two ranks fail on their own for the same missing key 1-3 ms apart, rank 1
    first in one run and rank 0 first in the other; both runs must name the same cause."""
    errors = json.loads(SIMULTANEOUS.read_text())["runs"][mode]
    assert {e["rank"] for e in errors} == {0, 1}
    cause, sec = F.classify("load", errors, [])
    assert (cause.rank, cause.exc_type) == (0, "megatron.core.dist_checkpointing.core.CheckpointingException")
    assert cause.key == "decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax"
    assert [s.rank for s in sec] == [1]


def test_primaries_further_apart_than_the_window_keep_their_order():
    late = 4.0 + F.SIMULTANEOUS_S + 0.05
    cause, _ = F.classify("load", [err(0, "boom B", late), err(2, "boom A", 4.0)], [])
    assert cause.rank == 2
    cause, _ = F.classify("load", [err(0, "boom B", 4.0 + F.SIMULTANEOUS_S / 2), err(2, "boom A", 4.0)], [])
    assert cause.rank == 0


def test_ranks_waiting_on_a_torch_extension_build_lock_say_so():
    """Every rank at the stage timeout inside torch's FileBaton.wait: the stack dump of a cut
    cell on the H100 (20261206, a stale lock from a killed build). The cause names the lock and
    what to do, not only "stuck outside any collective"."""
    dump = (DATA / "stacks" / "build-lock-wait-h100-20261206.txt").read_text()
    exits = [F.RankExit(rank=r, pid=10 + r, stack=dump) for r in range(4)]
    cause, sec = F.classify("load", [], exits, timed_out=True)
    assert (cause.rank, cause.kind) == (0, "timeout") and len(sec) == 3
    assert "extension build lock" in cause.message and "'lock' file" in cause.message
    busy = [F.RankExit(rank=r, stack='File "/x/prog.py", line 3 in body') for r in range(2)]
    assert "build lock" not in F.classify("load", [], busy, timed_out=True)[0].message


def test_every_rank_in_modelopts_calibration_check_at_the_timeout_says_so():
    """The Nano production shape on NCCL's socket transport (H100, 20261206): every rank's dump at
    the 300 s stage timeout is in ModelOpt's per-quantizer all_gather_object. The cause says the
    ranks were still calibrating and what to raise, not that one of them was stuck."""
    dump = (DATA / "stacks" / "calibration-check-nccl-h100-20261206.txt").read_text()
    exits = [F.RankExit(rank=r, pid=10 + r, stack=dump) for r in range(8)]
    cause, sec = F.classify("save", [], exits, timed_out=True)
    assert (cause.rank, cause.kind) == (0, "timeout") and len(sec) == 7
    assert "still calibrating, not deadlocked" in cause.message and "stage_timeout_s" in cause.message
    # one rank elsewhere: not every rank in the check, so no such claim
    odd = exits[:7] + [F.RankExit(rank=7, pid=17, stack='pid 17\nFile "/x/prog.py", line 3 in body')]
    assert "calibrating" not in F.classify("save", [], odd, timed_out=True)[0].message
    # the same dumps without a timeout (peers gave up first): no claim about the stage timeout
    assert "calibrating" not in F.classify("save", [], exits, timed_out=False)[0].message
