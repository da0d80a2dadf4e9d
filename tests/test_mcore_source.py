"""megatron-core's pure-Python pieces run from its installed source (harness/topology/
mcore_source.py): the same rank layout and StrictHandling values as the imported modules, and
the read-only commands (``verdict``, the gate) start without importing torch or megatron-core,
which cost each of them 3-6 s on the 2-core machine."""
from __future__ import annotations

import sys

import pytest

from harness.paths import REPO_ROOT
from harness.topology import coords, mcore_source
from harness.topology.topology import enumerate_topologies
from tests.helpers import bounded

pytestmark = pytest.mark.cpu


def test_the_source_rank_generator_lays_out_every_topology_as_the_imported_one():
    from megatron.core.parallel_state import RankGenerator

    source = mcore_source.definitions(
        "parallel_state", ("generate_masked_orthogonal_rank_groups", "RankGenerator"))["RankGenerator"]
    assert source is not RankGenerator and source.__module__.endswith("(source)")
    topologies = list(enumerate_topologies(16))
    assert len(topologies) > 50
    order = coords.MEGATRON_DEFAULT_ORDER
    for topo in topologies:
        assert coords._rank_coords(topo, order, source) == \
            coords._rank_coords(topo, order, RankGenerator), topo.id


def test_the_strictness_values_read_from_the_source_are_the_imported_enums():
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from harness.model.checkpoint import strictness_values

    assert strictness_values() == tuple(v.value for v in StrictHandling)
    assert "log_all" in strictness_values()


def test_what_the_source_lacks_is_none_and_the_caller_imports():
    assert mcore_source.source_file("no_such_module") is None
    assert mcore_source.definitions("no_such_module", ("X",)) is None
    assert mcore_source.definitions("parallel_state", ("RankGenerator", "no_such_name")) is None


def test_a_read_only_gate_imports_neither_torch_nor_megatron_core():
    """The gate over the committed records for a pair, through the CLI's own entry point in a
    fresh interpreter: its verdict, and no torch, megatron.core or modelopt in sys.modules."""
    code = ("import sys\nfrom harness.cli import main\n"
            "rc = main(['verdict', '--job', 'nano-30b-a3b-qad', '--gate', '--modelopt', '0.47.0',"
            " '--mcore', '0.19.2'])\n"
            "print('imported:', sorted(m for m in ('torch', 'megatron.core', 'modelopt')"
            " if m in sys.modules), 'rc:', rc)")
    done = bounded([sys.executable, "-W", "ignore", "-c", code], 120, cwd=REPO_ROOT)
    assert done.stdout.splitlines()[-1] == "imported: [] rc: 3", done.stdout + done.stderr
