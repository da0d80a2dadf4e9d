"""Where the test suite's time goes, from the JUnit file pytest wrote (`make test` writes one).

    python bench/junit_times.py results/junit.xml [--top 15] [--files 0] [--write-durations F]
    python bench/junit_times.py --compare BEFORE.xml AFTER.xml [--files 0]

Prints one row per test file (seconds summed over its tests, setup and teardown included, as
pytest's JUnit ``time`` counts them; passed / skipped / failed), largest first, then the slowest
tests. Under xdist the per-file sums add up to more than the wall clock (tests run side by
side); the suite line gives pytest's own wall. Figures only, no thresholds.

``--write-durations tests/durations.json`` also writes each test's seconds (1 s and more), the
order conftest.py hands work to the xdist workers in (longest first).

``--compare BEFORE.xml AFTER.xml``: the two runs side by side, per file (seconds before, after,
after/before, tests before and after) and in total (pytest wall, sum of test times, outcomes).
A JUnit file may be gzipped (``.xml.gz``: the baseline kept under docs/bench/).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def outcome(case: ET.Element) -> str:
    for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        if case.find(tag) is not None:
            return name
    return "passed"


def file_of(case: ET.Element) -> str:
    """tests/test_x.py from the classname pytest writes (``tests.test_x`` or ``tests.test_x.Cls``;
    a module skipped at collection has no classname, its name is the module)."""
    parts = (case.get("classname") or case.get("name", "")).split(".")
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py"
    return case.get("classname") or "?"


def test_key(case: ET.Element) -> str:
    """``file::name`` with xdist's ``@group`` suffix off (the JUnit name of a parametrized test
    in a group reads ``test_x[p]@group]``): what conftest.py looks up."""
    name = case.get("name", "")
    if "@" in name:
        head = name[:name.rfind("@")]
        name = head if head.count("[") == head.count("]") else name
    return f"{file_of(case)}::{name}"


def write_durations(cases: list[ET.Element], path: Path, floor_s: float = 1.0) -> int:
    """This run's passed tests of ``floor_s`` and more into ``path``; the tests the file already
    has and this run did not pass keep their seconds (a `make test-gpu` run's JUnit adds the GPU
    cells beside the cpu suite's, and a narrowed run forgets nothing)."""
    times = {test_key(c): round(float(c.get("time") or 0), 1) for c in cases
             if outcome(c) == "passed" and float(c.get("time") or 0) >= floor_s}
    kept = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps(dict(sorted({**kept, **times}.items())), indent=0) + "\n")
    return len(times)


def read(path: Path) -> tuple[list[ET.Element], list[ET.Element]]:
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                root = ET.parse(f).getroot()
        else:
            root = ET.parse(path).getroot()
    except (OSError, EOFError, ET.ParseError) as exc:
        raise SystemExit(f"{path}: not a readable JUnit XML file ({exc})")
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise SystemExit(f"{path}: no <testsuite> element (want the file pytest --junitxml writes)")
    return suites, [c for s in suites for c in s.iter("testcase")]


def per_file(cases: list[ET.Element]) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    """Seconds and outcome counts per test file."""
    secs: dict[str, float] = defaultdict(float)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for case in cases:
        f = file_of(case)
        secs[f] += float(case.get("time") or 0)
        counts[f][outcome(case)] += 1
    return secs, counts


def headline(path: Path, suites: list[ET.Element], cases: list[ET.Element]) -> tuple[str, float, float]:
    """One line about a run: tests and outcomes, pytest's wall, the sum of test times."""
    total: dict[str, int] = defaultdict(int)
    for case in cases:
        total[outcome(case)] += 1
    wall = sum(float(s.get("time") or 0) for s in suites)
    summed = sum(float(c.get("time") or 0) for c in cases)
    return (f"{path}: {len(cases)} tests, {total['passed']} passed, {total['skipped']} skipped, "
            f"{total['failed']} failed, {total['error']} errors; pytest wall {wall:.0f} s, "
            f"sum of test times {summed:.0f} s"), wall, summed


def _ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}" if before > 0 else "-"


def compare(before: Path, after: Path, files: int = 0) -> None:
    """Per-file seconds of two runs side by side, largest before first."""
    (s_b, c_b), (s_a, c_a) = read(before), read(after)
    line_b, wall_b, sum_b = headline(before, s_b, c_b)
    line_a, wall_a, sum_a = headline(after, s_a, c_a)
    print(f"before: {line_b}")
    print(f"after:  {line_a}")
    print()
    print(f"pytest wall {wall_b:.0f} -> {wall_a:.0f} s (after/before {_ratio(wall_a, wall_b)}); "
          f"sum of test times {sum_b:.0f} -> {sum_a:.0f} s ({_ratio(sum_a, sum_b)})")
    print()
    (sec_b, cnt_b), (sec_a, cnt_a) = per_file(c_b), per_file(c_a)
    print("| file | before s | after s | after/before | tests before | tests after |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    names = sorted(set(sec_b) | set(sec_a), key=lambda f: (-sec_b.get(f, 0.0), -sec_a.get(f, 0.0), f))
    for f in names[:files or None]:
        b, a = sec_b.get(f), sec_a.get(f)
        n_b, n_a = sum(cnt_b[f].values()) if f in cnt_b else 0, sum(cnt_a[f].values()) if f in cnt_a else 0
        print(f"| {f} | {'-' if b is None else f'{b:.1f}'} | {'-' if a is None else f'{a:.1f}'} | "
              f"{_ratio(a, b) if a is not None and b is not None else '-'} | {n_b} | {n_a} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit", type=Path, nargs="?")
    p.add_argument("--top", type=int, default=15, help="slowest tests to list (default 15)")
    p.add_argument("--files", type=int, default=0, help="files to list, largest first (0: all)")
    p.add_argument("--write-durations", type=Path, metavar="FILE",
                   help="write the seconds of every passed test of 1 s or more (tests/durations.json)")
    p.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                   help="two JUnit files side by side, per file, with after/before")
    args = p.parse_args(argv)
    if args.compare:
        if args.junit or args.write_durations:
            p.error("--compare takes its two files and no other JUnit file")
        compare(*args.compare, files=args.files)
        return 0
    if args.junit is None:
        p.error("a JUnit file, or --compare BEFORE AFTER")
    suites, cases = read(args.junit)
    if args.write_durations:
        n = write_durations(cases, args.write_durations)
        print(f"{args.write_durations}: {n} tests of 1 s or more")
    secs, counts = per_file(cases)
    print(headline(args.junit, suites, cases)[0])
    print()
    print("| file | s | passed | skipped | failed |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rows = sorted(secs.items(), key=lambda kv: -kv[1])
    for f, sec in rows[:args.files or None]:
        c = counts[f]
        print(f"| {f} | {sec:.1f} | {c['passed']} | {c['skipped']} | {c['failed'] + c['error']} |")
    if args.top:
        print()
        print(f"slowest {args.top} tests (s):")
        slow = sorted(cases, key=lambda c: -float(c.get("time") or 0))[:args.top]
        for case in slow:
            print(f"  {float(case.get('time') or 0):7.1f}  {file_of(case)}::{case.get('name')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
