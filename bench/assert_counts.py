"""Tests and ``assert`` statements per test file at two git revisions: what a change to the
suite kept.

    python bench/assert_counts.py BEFORE_REF [AFTER_REF] [--all]

AFTER_REF defaults to the working tree. Per file under tests/: test functions (``def test_*``)
and ``assert`` statements (``ast.Assert`` nodes, helpers and fixtures included), before and
after; only files whose counts differ unless ``--all``; then the totals. Counts, no verdict:
a moved assert shows as one file losing it and another gaining it.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def sources(ref: str | None) -> dict[str, str]:
    """tests/**/*.py at ``ref`` (None: the working tree)."""
    if ref is None:
        return {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "tests").rglob("*.py"))}
    names = _git("ls-tree", "-r", "--name-only", ref, "--", "tests").split()
    return {n: _git("show", f"{ref}:{n}") for n in names if n.endswith(".py")}


def counts(source: str) -> tuple[int, int]:
    """(test functions, assert statements) of one file."""
    tree = ast.parse(source)
    tests = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
                for n in ast.walk(tree))
    asserts = sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
    return tests, asserts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after", nargs="?", help="a git revision (default: the working tree)")
    p.add_argument("--all", action="store_true", help="every file, not only those that changed")
    args = p.parse_args(argv)
    before, after = sources(args.before), sources(args.after)
    print(f"tests and assert statements per file: {args.before} -> {args.after or 'working tree'}")
    print()
    print("| file | tests before | tests after | asserts before | asserts after |")
    print("| --- | ---: | ---: | ---: | ---: |")
    total = [0, 0, 0, 0]
    for name in sorted(set(before) | set(after)):
        b = counts(before[name]) if name in before else (0, 0)
        a = counts(after[name]) if name in after else (0, 0)
        total = [total[0] + b[0], total[1] + a[0], total[2] + b[1], total[3] + a[1]]
        if args.all or a != b or (name in before) != (name in after):
            print(f"| {name} | {b[0]} | {a[0]} | {b[1]} | {a[1]} |")
    print(f"| all files | {total[0]} | {total[1]} | {total[2]} | {total[3]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
