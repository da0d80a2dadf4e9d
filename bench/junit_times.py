"""Where the test suite's time goes, from the JUnit file pytest wrote (`make test` writes one).

    python bench/junit_times.py results/junit.xml [--top 15] [--files 0] [--write-durations F]

Prints one row per test file (seconds summed over its tests, setup and teardown included, as
pytest's JUnit ``time`` counts them; passed / skipped / failed), largest first, then the slowest
tests. Under xdist the per-file sums add up to more than the wall clock (tests run side by
side); the suite line gives pytest's own wall. Figures only, no thresholds.

``--write-durations tests/durations.json`` also writes each test's seconds (1 s and more), the
order conftest.py hands work to the xdist workers in (longest first).
"""
from __future__ import annotations

import argparse
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
    times = {test_key(c): round(float(c.get("time") or 0), 1) for c in cases
             if outcome(c) == "passed" and float(c.get("time") or 0) >= floor_s}
    path.write_text(json.dumps(dict(sorted(times.items())), indent=0) + "\n")
    return len(times)


def read(path: Path) -> tuple[list[ET.Element], list[ET.Element]]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise SystemExit(f"{path}: not a readable JUnit XML file ({exc})")
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise SystemExit(f"{path}: no <testsuite> element (want the file pytest --junitxml writes)")
    return suites, [c for s in suites for c in s.iter("testcase")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit", type=Path)
    p.add_argument("--top", type=int, default=15, help="slowest tests to list (default 15)")
    p.add_argument("--files", type=int, default=0, help="files to list, largest first (0: all)")
    p.add_argument("--write-durations", type=Path, metavar="FILE",
                   help="write the seconds of every passed test of 1 s or more (tests/durations.json)")
    args = p.parse_args(argv)
    suites, cases = read(args.junit)
    if args.write_durations:
        n = write_durations(cases, args.write_durations)
        print(f"{args.write_durations}: {n} tests of 1 s or more")
    per_file: dict[str, float] = defaultdict(float)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for case in cases:
        f = file_of(case)
        per_file[f] += float(case.get("time") or 0)
        counts[f][outcome(case)] += 1
    total = defaultdict(int)
    for c in counts.values():
        for k, v in c.items():
            total[k] += v
    wall = sum(float(s.get("time") or 0) for s in suites)
    print(f"{args.junit}: {len(cases)} tests, {total['passed']} passed, {total['skipped']} skipped, "
          f"{total['failed']} failed, {total['error']} errors; pytest wall {wall:.0f} s, "
          f"sum of test times {sum(per_file.values()):.0f} s")
    print()
    print("| file | s | passed | skipped | failed |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rows = sorted(per_file.items(), key=lambda kv: -kv[1])
    for f, secs in rows[:args.files or None]:
        c = counts[f]
        print(f"| {f} | {secs:.1f} | {c['passed']} | {c['skipped']} | {c['failed'] + c['error']} |")
    if args.top:
        print()
        print(f"slowest {args.top} tests (s):")
        slow = sorted(cases, key=lambda c: -float(c.get("time") or 0))[:args.top]
        for case in slow:
            print(f"  {float(case.get('time') or 0):7.1f}  {file_of(case)}::{case.get('name')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
