"""The comparison tools/coverage-split.sh prints: lines of harness/ and moe_ckpt_fix/ that
`make test` and `make test-slow` together cover, those `make test` covers alone, the ratio (issue
65 asks 97 % or more), and per module the lines that only `make test-slow` reaches.

    python tools/coverage_split.py REPO TEST.data TEST-SLOW.data
    python tools/coverage_split.py REPO TEST.data TEST-SLOW.data --split FAST.txt [--plan [--target 97]]

Both data files carry each test's lines under its node id (conftest.py's coverage contexts), so
the split can be judged again without running anything: ``--split FAST.txt`` (the node ids of
`pytest --collect-only -q -m "not slow"`) gives the figures of that split, lines reached by no
test (collection, imports) counted where they were measured. ``--plan`` then lists the tests of
FAST.txt that can move to `make test-slow`, longest first by ``--durations`` (default
tests/durations.json), while
`make test` keeps the target ratio and one test of each test function (each behaviour once).
Figures only, markdown on stdout; the exit code is 0 whatever the ratio."""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from coverage import CoverageData

PACKAGES = ("harness", "moe_ckpt_fix")
Lines = dict[str, set[int]]


def _rel(name: str, repo: Path) -> str | None:
    try:
        rel = Path(name).resolve().relative_to(repo).as_posix()
    except ValueError:  # an installed copy (the fix wheel's venv), not this tree
        return None
    return rel if rel.split("/")[0] in PACKAGES else None


def covered(data_file: str, repo: Path) -> Lines:
    """Repository-relative path -> executed lines, for the files of PACKAGES in ``repo``."""
    return {f: set().union(*per.values()) for f, per in by_context(data_file, repo).items()}


def by_context(data_file: str, repo: Path) -> dict[str, dict[str, set[int]]]:
    """path -> context (a test's node id, "" outside every test) -> lines."""
    data = CoverageData(basename=data_file)
    data.read()
    out: dict[str, dict[str, set[int]]] = {}
    for name in data.measured_files():
        rel = _rel(name, repo)
        if rel is None:
            continue
        per = out.setdefault(rel, {})
        for line, contexts in (data.contexts_by_lineno(name) or {}).items():
            for context in contexts or [""]:
                per.setdefault(context, set()).add(line)
    return out


def per_test(data: dict[str, dict[str, set[int]]]) -> tuple[dict[str, set], set]:
    """node id -> {(path, line)}, and the lines reached outside every test."""
    tests: dict[str, set] = defaultdict(set)
    outside: set = set()
    for path, per in data.items():
        for context, lines in per.items():
            # the outer test (a pytest run by a test adds "|<its own test>"), without
            # xdist's "@<group>" of --dist loadgroup
            test = re.sub(r"@[^\[\]]*$", "", context.split("|")[0])
            (tests[test] if test else outside).update((path, n) for n in lines)
    return tests, outside


def ranges(lines: list[int]) -> str:
    spans, start = [], None
    for i, n in enumerate(lines):
        if start is None:
            start = n
        if i + 1 == len(lines) or lines[i + 1] != n + 1:
            spans.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(spans)


def compare(fast: Lines, slow: Lines) -> None:
    union = {f: fast.get(f, set()) | slow.get(f, set()) for f in {*fast, *slow}}
    n_union = sum(len(v) for v in union.values())
    n_fast = sum(len(fast.get(f, set())) for f in union)
    print("| lines of harness/ and moe_ckpt_fix/ | count |\n| --- | ---: |")
    print(f"| covered by `make test` ∪ `make test-slow` | {n_union} |")
    print(f"| covered by `make test` alone | {n_fast} |")
    print(f"| ratio | {100.0 * n_fast / max(n_union, 1):.1f} % |")
    print(f"| files measured | {len(union)} |\n")
    missed = sorted(((f, sorted(union[f] - fast.get(f, set()))) for f in union), key=lambda x: -len(x[1]))
    missed = [(f, lines) for f, lines in missed if lines]
    print(f"Modules where `make test` alone misses lines that `make test-slow` covers ({len(missed)}):\n")
    print("| module | lines only under -m slow | which |\n| --- | ---: | --- |")
    for f, lines in missed:
        print(f"| {f} | {len(lines)} | {ranges(lines)} |")


def _as_lines(pairs: set) -> Lines:
    out: Lines = {}
    for path, n in pairs:
        out.setdefault(path, set()).add(n)
    return out


def plan(tests: dict[str, set], fast_ids: list[str], fast_floor: set, union: set,
         durations: dict[str, float], target: float, keep_one: bool = True) -> list[tuple[str, float, int]]:
    """Greedy: the longest test of `make test` moves when what only it reaches still leaves the
    target ratio and its test function keeps another test in `make test`."""
    count = Counter(line for t in fast_ids for line in tests.get(t, ()))
    covered_n = len(fast_floor | set(count))
    function = Counter(re.sub(r"\[.*", "", t) for t in fast_ids)
    moves = []
    for t in sorted(fast_ids, key=lambda t: -durations.get(t, 0.0)):
        if durations.get(t, 0.0) < 1.0:
            break
        if keep_one and function[re.sub(r"\[.*", "", t)] < 2:
            continue
        lost = [line for line in tests.get(t, ()) if count[line] == 1 and line not in fast_floor]
        if covered_n - len(lost) < target / 100.0 * len(union):
            continue
        for line in tests.get(t, ()):
            count[line] -= 1
        covered_n -= len(lost)
        function[re.sub(r"\[.*", "", t)] -= 1
        moves.append((t, durations.get(t, 0.0), len(lost)))
    return moves


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo")
    ap.add_argument("fast_data")
    ap.add_argument("slow_data")
    ap.add_argument("--split", help="node ids of `make test`, one per line")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--any", action="store_true",
                    help="--plan may move a test function's last test (a behaviour then checked per landing only)")
    ap.add_argument("--target", type=float, default=97.0)
    ap.add_argument("--durations", default="tests/durations.json",
                    help="node id -> seconds (bench/junit_times.py --write-durations of a cpu-tier run)")
    args = ap.parse_args()
    root = Path(args.repo).resolve()
    if not args.split:
        compare(covered(args.fast_data, root), covered(args.slow_data, root))
        return 0
    fast_tests, fast_floor = per_test(by_context(args.fast_data, root))  # floor: collection, imports
    slow_tests, slow_floor = per_test(by_context(args.slow_data, root))
    tests = {t: fast_tests.get(t, set()) | slow_tests.get(t, set()) for t in {*fast_tests, *slow_tests}}
    fast_ids = [t for t in Path(args.split).read_text().splitlines() if "::" in t]
    fast = fast_floor.union(*(tests.get(t, set()) for t in fast_ids))
    union = fast | slow_floor | set().union(*tests.values())
    compare(_as_lines(fast), _as_lines(union))
    if args.plan:
        durations = json.loads((root / args.durations).read_text())
        moves = plan(tests, fast_ids, fast_floor, union, durations, args.target, keep_one=not args.any)
        print(f"\nTests of `make test` that can move to `make test-slow` ({len(moves)}, "
              f"{sum(m[1] for m in moves):.0f} s by {args.durations}):\n")
        print("| test | s | lines only it reached in `make test` |\n| --- | ---: | ---: |")
        for t, s, lost in moves:
            print(f"| {t} | {s:.1f} | {lost} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
