"""The lock files tools/bootstrap-venv.sh installs: every version exact and
every file hashed, each lock no older than its inputs, and the bootstrap reading only locks.

Cheap: reads files, imports nothing of the stack. `make lock` (tools/lock.sh) regenerates the
locks; a failure here after editing requirements/cpu.in or test.txt means: run it, commit both."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"
BOOTSTRAP = ROOT / "tools" / "bootstrap-venv.sh"
# lock -> its inputs, in the order tools/lock.sh checksums them
LOCKS = {
    "cpu.lock": ["cpu.in", "test.txt"],
    "megatron-core.lock": ["megatron-core.txt"],
    "installer.lock": ["installer.txt"],
    "lint.lock": ["lint.txt"],
}


def entries(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (the line's requirement, its hashes) of a uv pip compile output."""
    out: dict[str, tuple[str, list[str]]] = {}
    name = None
    for raw in lock.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            assert name, f"{lock.name}: a hash before any requirement"
            out[name][1].append(line.removeprefix("--hash=").rstrip(" \\"))
            continue
        spec = line.rstrip(" \\").strip()
        name = canonicalize_name(Requirement(spec).name)
        assert name not in out, f"{lock.name}: {name} twice"
        out[name] = (spec, [])
    return out


def inputs(path: Path) -> list[Requirement]:
    """The requirements of an input file, following -r as pip and uv do."""
    reqs = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            reqs += inputs(path.parent / line[3:].strip())
            continue
        reqs.append(Requirement(line))
    return reqs


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_line_of_a_lock_is_exact_and_hashed(lock):
    found = entries(REQ / lock)
    assert found, lock
    for name, (spec, hashes) in found.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", spec), f"{lock}: {spec} is not name==version"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{lock}: {name}"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_a_lock_is_no_older_than_its_inputs(lock):
    """tools/lock.sh writes the sha256 of the inputs' bytes under uv's header."""
    want = hashlib.sha256(b"".join((REQ / f).read_bytes() for f in LOCKS[lock])).hexdigest()
    header = [l for l in (REQ / lock).read_text().splitlines()[:5] if l.startswith("#    inputs: ")]
    assert header, f"{lock}: no inputs line; run `make lock`"
    assert header[0] == f"#    inputs: {' '.join('requirements/' + f for f in LOCKS[lock])} sha256={want}", (
        f"requirements/{lock} is older than {', '.join(LOCKS[lock])}: run `make lock` and commit it")


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_input_is_in_its_lock_at_a_version_it_allows(lock):
    found = entries(REQ / lock)
    for req in (r for f in LOCKS[lock] for r in inputs(REQ / f)):
        name = canonicalize_name(req.name)
        assert name in found, f"{lock}: {req} of the inputs is missing"
        version = found[name][0].split("==", 1)[1]
        # (torch==2.13.0 allows the local CPU build 2.13.0+cpu: PEP 440 ignores the local label)
        assert req.specifier.contains(Version(version), prereleases=True), (
            f"{lock}: {name}=={version} does not satisfy the input {req}")


def test_the_cpu_lock_holds_the_cpu_torch_and_no_cuda_stack():
    found = entries(REQ / "cpu.lock")
    assert found["torch"][0] == "torch==2.13.0+cpu" and len(found["torch"][1]) == 1
    assert "transformer-engine" not in found and "megatron-core" not in found
    cuda = sorted(n for n in found if n.startswith("nvidia-") and n not in {"nvidia-modelopt", "nvidia-ml-py"})
    assert not cuda, f"CUDA libraries in the cpu lock: {cuda}"
    # triton stays: megatron-core 0.19.2 imports it unconditionally (requirements/cpu.in)
    assert found["triton"][0] == "triton==3.7.1"


def test_the_bootstrap_installs_only_lock_files_with_hashes():
    text = BOOTSTRAP.read_text()
    code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    installed = re.findall(r"requirements/[\w.-]+", code)
    assert sorted(set(installed)) == sorted(f"requirements/{l}" for l in LOCKS if l != "lint.lock"), installed
    assert "uv\" pip install --quiet --require-hashes" in code
    assert code.count("--require-hashes") == 3
    assert "--no-deps --ignore-requires-python --require-hashes -r requirements/megatron-core.lock" in code
    assert ">=" not in "".join((REQ / l).read_text() for l in LOCKS)


def test_the_lint_tools_share_the_cpu_locks_versions_and_install_from_their_lock():
    """tools/lint-install.sh puts requirements/lint.lock into the bootstrap's .venv: a package both
    locks hold must have one version, or each install would undo the other's."""
    cpu, lint = entries(REQ / "cpu.lock"), entries(REQ / "lint.lock")
    shared = sorted(set(cpu) & set(lint))
    assert shared  # requests, certifi, click, ...
    assert [cpu[n][0] for n in shared] == [lint[n][0] for n in shared]
    code = (ROOT / "tools" / "lint-install.sh").read_text()
    assert "install --no-deps --require-hashes" in code and "-r requirements/lint.lock" in code
