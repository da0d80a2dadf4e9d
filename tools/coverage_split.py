"""The comparison tools/coverage-split.sh prints: lines of harness/ and moe_ckpt_fix/ that
`make test` and `make test-slow` together cover, those `make test` covers alone, the ratio (issue
65 asks 97 % or more), and per module the lines that only `make test-slow` reaches.

    python tools/coverage_split.py REPO TEST.data TEST-SLOW.data

Figures only, markdown on stdout; the exit code is 0 whatever the ratio."""
from __future__ import annotations

import sys
from pathlib import Path

from coverage import CoverageData

PACKAGES = ("harness", "moe_ckpt_fix")


def covered(data_file: str, repo: Path) -> dict[str, set[int]]:
    """Repository-relative path -> executed lines, for the files of PACKAGES in ``repo``."""
    data = CoverageData(basename=data_file)
    data.read()
    out: dict[str, set[int]] = {}
    for name in data.measured_files():
        try:
            rel = Path(name).resolve().relative_to(repo).as_posix()
        except ValueError:  # an installed copy (the fix wheel's venv), not this tree
            continue
        if rel.split("/")[0] in PACKAGES:
            out.setdefault(rel, set()).update(data.lines(name) or ())
    return out


def ranges(lines: list[int]) -> str:
    spans, start = [], None
    for i, n in enumerate(lines):
        if start is None:
            start = n
        if i + 1 == len(lines) or lines[i + 1] != n + 1:
            spans.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(spans)


def main(repo: str, fast_file: str, slow_file: str) -> int:
    root = Path(repo).resolve()
    fast, slow = covered(fast_file, root), covered(slow_file, root)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
