"""Judging writes into no record: each step in harness/check/ returns the fields it decides, and
``judge_cell`` (harness/check/judge.py) builds the cell's record from them in one place. Checked
on the source, like the import rules (tests/test_architecture.py): nothing is imported.

Why: the steps used to write into one record in turn, so what a cell came to hung on which
step wrote last, an order no line of code stated. Now the precedence is written where the
record is built, and a step that writes into a record again fails here with its file and line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / "harness" / "check"
# Calls that make or judge a record: a name bound to one holds a record.
MAKERS = {"CellRecord", "judge_cell"}
# Calls that copy a record when their first argument is one.
COPIES = {"replace", "deepcopy", "copy"}
# Methods that change the container they are called on (a record's dict or list field).
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert",
            "remove", "sort", "reverse", "__setitem__", "__delitem__", "__setattr__"}

pytestmark = pytest.mark.cpu


def _root(node: ast.AST) -> tuple[str | None, bool]:
    """The name under ``a.b[c].d`` and whether an attribute or item of it is reached."""
    reached = False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node, reached = node.value, True
    return (node.id if isinstance(node, ast.Name) else None), reached


def _callee(call: ast.Call) -> str:
    """``CellRecord.of(...)`` -> CellRecord; ``judge.judge_cell(...)`` -> judge_cell."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "CellRecord":
        return "CellRecord"
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _annotated_record(arg: ast.arg) -> bool:
    ann = arg.annotation
    text = ann.value if isinstance(ann, ast.Constant) else ast.unparse(ann) if ann else ""
    return "CellRecord" in str(text)


def _record_names(fn: ast.AST) -> set[str]:
    """The names in ``fn`` that hold a CellRecord: parameters annotated ``CellRecord`` or named
    ``rec``, and names bound to a record made, judged or copied."""
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg for a in params if a is not None and (a.arg == "rec" or _annotated_record(a))}
    binds = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr))]
    while True:
        more = set()
        for node in binds:
            value = node.value
            if not isinstance(value, ast.Call):
                continue
            name = _callee(value)
            first = _root(value.args[0])[0] if value.args else None
            if name in MAKERS or (name in COPIES and first in names):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                more |= {t.id for t in targets if isinstance(t, ast.Name)}
        if more <= names:
            return names
        names |= more


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        out = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        out = [node.target]
    elif isinstance(node, ast.Delete):
        out = list(node.targets)
    else:
        return []
    flat = []
    while out:
        t = out.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            out += t.elts
        elif isinstance(t, ast.Starred):
            out.append(t.value)
        else:
            flat.append(t)
    return flat


def record_writes(source: str, where: str = "<source>") -> list[str]:
    """``where:line: text`` of every write into a record in ``source``: an attribute or item of
    it assigned, augmented or deleted, ``setattr``/``delattr`` on it, or a changing method called
    on one of its fields (``rec.durations.update(...)``)."""
    tree = ast.parse(source)
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = _record_names(fn)
        if not names:
            continue
        for node in ast.walk(fn):
            hits = [t for t in _targets(node) if _root(t) == (_root(t)[0], True) and _root(t)[0] in names]
            if isinstance(node, ast.Call):
                f = node.func
                if getattr(f, "id", "") in ("setattr", "delattr") and node.args and _root(node.args[0])[0] in names:
                    hits.append(node)
                elif isinstance(f, ast.Attribute) and f.attr in MUTATORS:
                    name, reached = _root(f.value)
                    if name in names and (reached or f.attr.startswith("__")):
                        hits.append(node)
            found |= {f"{where}:{h.lineno}: {ast.unparse(h)[:80]}" for h in hits}
    return sorted(found, key=lambda s: int(s.split(":")[1]))


def test_no_step_of_judging_writes_into_a_record():
    found = [w for p in sorted(CHECK.rglob("*.py"))
             for w in record_writes(p.read_text(), str(p.relative_to(CHECK.parent.parent)))]
    assert not found, "writes into a record while judging (return the fields instead):\n" + "\n".join(found)


BAD = '''
def a(rec):
    rec.outcome = "x"
def b(r: CellRecord, d):
    setattr(r, "reason", d)
def c(x: "CellRecord | None"):
    x.durations["save"] += 1.0
def d(cell):
    new = CellRecord(cell_id=cell)
    new.verify = {}
def e(rec):
    rec.memory.update({})
def f(plan):
    got = judge.judge_cell(plan)
    later = replace(got, reason="")
    later.reason, other = "", 1
def g(rec):
    del rec.finding
'''

CLEAN = '''
def judged(rec: CellRecord, stage) -> dict:
    fields = {"outcome": rec.outcome}
    fields["reason"] = stage.summary
    fields.update(finding=None)
    return fields
def built(rec, fields):
    return replace(rec, **fields)
'''


def test_the_write_checker_sees_what_it_must_refuse():
    """The checker can fail: each way of writing into a record is named, with its line; reading
    a record and writing a dict of fields is not a write."""
    lines = [int(w.split(":")[1]) for w in record_writes(BAD)]
    assert lines == [3, 5, 7, 10, 12, 16, 18], record_writes(BAD)
    assert record_writes(CLEAN) == []
