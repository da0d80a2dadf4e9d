"""``--shard K/N`` (harness/scenario/shards.py): the shards of a run are the run, each unit in
exactly one, the deciding cells first, the shards of about equal estimated seconds."""
from __future__ import annotations

import pytest

from harness.report.jobs import deciding_scenarios
from harness.scenario.shards import parse_shard, split


@pytest.mark.parametrize("text, want", [("1/3", (1, 3)), (" 2 / 2 ", (2, 2))])
def test_a_shard_is_k_of_n(text, want):
    assert parse_shard(text) == want


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "3", "a/b", ""])
def test_a_bad_shard_is_one_line(text):
    with pytest.raises(ValueError, match="--shard") as err:
        parse_shard(text)
    assert "\n" not in str(err.value)


def test_the_shards_are_the_run_in_order_and_about_equal():
    units = {f"u{i}": float(s) for i, s in enumerate([50, 10, 10, 30, 40, 20, 20, 10, 5, 5])}
    shards = split(units, first=["u4", "u8"], n=3)
    flat = [u for shard in shards for u in shard]
    assert sorted(flat) == sorted(units) and len(flat) == len(set(flat))
    assert flat[:2] == ["u4", "u8"]  # the deciding units open the first shard, in run order
    assert flat[2:] == [u for u in units if u not in ("u4", "u8")]
    seconds = [sum(units[u] for u in shard) for shard in shards]
    target = sum(units.values()) / 3  # each shard within one unit of its share
    assert all(abs(s - target) <= max(units.values()) for s in seconds), seconds


def test_more_shards_than_units_leaves_some_empty():
    shards = split({"a": 1.0, "b": 1.0}, first=[], n=4)
    assert sorted(u for s in shards for u in s) == ["a", "b"] and [] in shards


def test_the_quarantined_jobs_scenarios_decide():
    from harness.report.jobs import load_quarantine
    from harness.scenario.scenarios import load_all

    deciding = deciding_scenarios()
    job = load_quarantine().jobs[0]
    assert {job.profile.witness, job.profile.fix} <= deciding
    assert deciding <= {s.name for s in load_all()}  # every one is a scenario that exists
