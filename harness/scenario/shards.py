"""A test run cut into N shards that run one after the other (``make test-gpu SHARD=K/N``).

Why: the whole nightly GPU command outlasts what one lent GPU host call may run; its shards,
run back to back on one host (or on N nodes), are the whole run. A shard holds whole xdist work
units (the cells of one save stay together, so the save runs once), the cells that decide a
quarantined job's verdict come first (a session cut short has still run them), and the shards
are contiguous runs of about equal estimated seconds. Every shard is computed the same way on
every xdist worker: the split depends only on the collected ids and the seconds file.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 1 <= K <= N; ValueError in one line otherwise."""
    m = SHARD_RE.match(text or "")
    if not m:
        raise ValueError(f"--shard {text!r}: want K/N, e.g. 1/3")
    k, n = int(m[1]), int(m[2])
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be between 1 and N")
    return k, n


def split(units: Mapping[str, float], first: Iterable[str], n: int) -> list[list[str]]:
    """The units (name -> estimated seconds, in run order) cut into ``n`` contiguous shards of
    about equal seconds, the units in ``first`` at the front (their order kept). A shard may be
    empty where there are fewer units than shards."""
    first = set(first)
    order = [u for u in units if u in first] + [u for u in units if u not in first]
    total = sum(units.values()) or 1.0
    shards: list[list[str]] = [[] for _ in range(n)]
    done = 0.0
    for unit in order:
        # the shard whose share of the total this unit's midpoint falls in
        k = min(n - 1, int((done + units[unit] / 2) / total * n))
        shards[k].append(unit)
        done += units[unit]
    return shards
