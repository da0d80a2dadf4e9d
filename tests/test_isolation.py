"""Isolation by construction: no test, rank program, tool or harness path takes a fixed or
inherited rendezvous port, and nothing running inside a pytest process writes ``os.environ``.

Why: an xdist worker's ``os.environ.setdefault("MASTER_PORT", ...)`` leaked into a later
test's child on the GPU host, whose group then met the first one's port (EADDRINUSE). Ports come
from ``harness.launch.nodes.rendezvous_port`` or a store bound on port 0; environment changes in
tests go through ``monkeypatch`` or a child's ``env=``; each xdist worker gets its GPUs from its
``--tx`` spec before its interpreter runs a test (conftest.py ``give_workers_their_gpus``).
A line that must spell a port (a command line checked as text, never bound) says so with
``# isolation: <why>``.
"""
from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.paths import REPO_ROOT

SCANNED_SUFFIXES = (".py", ".sh", ".yml", ".yaml", ".toml", ".cfg", ".ini")
SCANNED_NAMES = ("Makefile", "Dockerfile")
PORT_PATTERNS = {
    "a MASTER_PORT default": re.compile(r"MASTER_PORT['\"]?\s*[,=:]\s*['\"]?\d"),
    "a --master-port literal": re.compile(r"--master[-_]port['\"]?[\s=,]+['\"]?\d"),
    "a host:port literal": re.compile(
        r"(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]|tcp://[\w.-]+):(?!0\b)\d{2,5}\b"),
    "a rendezvous endpoint literal": re.compile(
        r"rdzv[-_]endpoint['\"]?[\s=:,]+['\"]?[\w.-]+:(?!0\b)\d{2,5}\b"),
    "a port= literal": re.compile(r"\bport\s*=\s*(?!0\b)\d{2,5}\b", re.IGNORECASE),
}
PRAGMA = re.compile(r"#\s*isolation:\s*\S")
# What runs inside pytest's own processes (the controller and its xdist workers).
PYTEST_PROCESS_FILES = ("conftest.py", "tests/helpers.py", "tests/test_*.py", "tests/gpu/test_*.py")
# harness/ modules that run as processes of their own (ranks, the CLI's commands, an extension
# build), where the environment is theirs to set; each with why. Anything else must not write it.
OWN_PROCESS_MODULES = {
    "harness/rank/": "rank processes: a stage's ranks, forked or started by torchrun",
    "harness/commands.py": "the CLI's command handlers, in the `python -m harness` process",
    "harness/launch/extensions.py": "the extension build, run as `python -m harness.launch.extensions`",
    "harness/run/repro.py": "`make repro`'s controller process, putting back what its imports set",
}
WRITERS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                         timeout=60, check=True).stdout.decode()
    return [REPO_ROOT / p for p in out.split("\0") if p]


def port_literals(paths, root: Path = REPO_ROOT) -> list[str]:
    """``file:line: what`` for each fixed port in the given files (named relative to root)."""
    found = []
    for path in paths:
        if not (path.suffix in SCANNED_SUFFIXES or path.name in SCANNED_NAMES) or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PRAGMA.search(line):
                continue
            for what, pattern in PORT_PATTERNS.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(root)}:{n}: {what}: {line.strip()}")
    return found


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os") or (
        isinstance(node, ast.Name) and node.id == "environ")


def environment_writes(source: str) -> list[int]:
    """Line numbers where ``source`` writes the process environment."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, ast.AugAssign) else [])
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in WRITERS and _is_environ(f.value)) or (
                    f.attr in ("putenv", "unsetenv") and isinstance(f.value, ast.Name)
                    and f.value.id == "os"):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_fixed_or_inherited_port_anywhere_in_the_tree():
    found = port_literals(_tracked())
    assert not found, ("fixed ports (take one from harness.launch.nodes.rendezvous_port or bind "
                       "port 0; a port spelled only as text says '# isolation: why'):\n"
                       + "\n".join(found))


def test_the_port_scan_sees_each_form(tmp_path):
    leak = tmp_path / "leak.py"
    leak.write_text('os.environ.setdefault("MASTER_PORT", "29517")\n'  # isolation: the scan's own sample
                    'cmd = ["torchrun", "--master-port", "29500"]\n'  # isolation: the scan's own sample
                    'ep = "localhost:29400"\n'  # isolation: the scan's own sample
                    'dist.TCPStore(host, port=29511)\n'  # isolation: the scan's own sample
                    'fine = "localhost:0"  # the kernel picks\n'
                    'job = {"rdzv_endpoint": "head:29400"}\n'  # isolation: the scan's own sample
                    'where = "custom.py:180-186"  # a source line, not a port\n'
                    'text = "--rdzv-endpoint head:29500"  # isolation: a command line as text\n')
    found = port_literals([leak], tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "6"], found


def test_no_pytest_process_writes_the_environment():
    files = sorted({p for pattern in PYTEST_PROCESS_FILES for p in REPO_ROOT.glob(pattern)})
    assert len(files) > 50  # the globs still find the suite
    found = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in files
             for n in environment_writes(p.read_text())]
    assert not found, ("os.environ written inside pytest (use monkeypatch, or env= for a "
                       "child): " + ", ".join(found))


def test_harness_writes_the_environment_only_in_processes_of_its_own():
    found = []
    for path in sorted((REPO_ROOT / "harness").rglob("*.py")) + sorted(
            (REPO_ROOT / "moe_ckpt_fix").rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if any(rel.startswith(own) for own in OWN_PROCESS_MODULES):
            continue
        found += [f"{rel}:{n}" for n in environment_writes(path.read_text())]
    assert not found, "os.environ written by a library module a test may call: " + ", ".join(found)


@pytest.mark.parametrize("source, writes", [
    ('import os\nos.environ["A"] = "1"\n', [2]),
    ('import os\nos.environ.setdefault("A", "1")\n', [2]),
    ('import os\ndel os.environ["A"]\n', [2]),
    ('from os import environ\nenviron.update(A="1")\n', [2]),
    ('import os\nos.putenv("A", "1")\n', [2]),
    ('import os\nx = os.environ.get("A")\nenv = {**os.environ, "A": "1"}\n', []),
    ('text = "os.environ[\'A\'] = 1"\n', []),
])
def test_the_environment_scan_sees_each_write(source, writes):
    assert environment_writes(source) == writes


def _workers(tx: list[str], gpus: str) -> list[str]:
    from conftest import give_workers_their_gpus

    config = SimpleNamespace(option=SimpleNamespace(tx=list(tx)), harness_gpus=gpus,
                             getoption=lambda name, default=None: tx if name == "tx" else default)
    give_workers_their_gpus(config)
    return config.option.tx


def _spec(devices: str) -> str:
    return f"popen//python=env CUDA_VISIBLE_DEVICES={devices} {shlex.quote(sys.executable)}"


def test_each_worker_starts_with_its_own_gpus():
    assert _workers(["popen"] * 2, "0,1,2,3") == [_spec("0,1"), _spec("2,3")]
    assert _workers(["popen"] * 3, "") == [_spec("")] * 3  # cpu: none
    # fewer GPUs than workers: they share them (gpu-shared cells)
    assert _workers(["popen"] * 5, "0") == [_spec("0")] * 5
    assert _workers(["ssh=host"], "0,1") == ["ssh=host"]  # a spec someone wrote is theirs
    # set when the interpreter starts, not by a remote_exec after it (execnet's env: keys)
    assert all("env:" not in spec for spec in _workers(["popen"] * 2, "0,1"))


def test_a_worker_sees_only_its_gpus_when_its_tests_run():
    """The spec reaches the worker's interpreter from its start, in xdist's own execution model
    (main_thread_only, where a second remote_exec too soon after a first is refused)."""
    import execnet

    group = execnet.Group(execmodel="main_thread_only")
    gateway = group.makegateway(_workers(["popen"] * 2, "4,5")[1])
    try:
        seen = gateway.remote_exec(
            "import os; channel.send(os.environ.get('CUDA_VISIBLE_DEVICES'))").receive(timeout=60)
    finally:
        group.terminate(timeout=30)
    assert seen == "5"
