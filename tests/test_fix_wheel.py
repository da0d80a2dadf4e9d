"""The fix as a wheel (docs/fix.md): what ``make fix-wheel`` builds, installed offline into a
throwaway venv, and the start-up hook it carries, each check in a fresh interpreter.

A job's whole change is ``pip install <wheel>`` plus ``MOE_CKPT_FIX=1``, so every check starts the
throwaway venv's python outside the repository: torch, megatron-core and nvidia-modelopt come
from this interpreter's site-packages through PYTHONPATH, ``moe_ckpt_fix`` only from the wheel.
Without Transformer Engine (this machine) ``apply()`` ends in its TE refusal, which it reaches
only after accepting the installed modelopt and megatron-core: that is where the hook is checked
up to; with TE importable the same test asserts modelopt patched.
"""
from __future__ import annotations

import json
import os
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import moe_ckpt_fix
from tests.helpers import bounded

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "tools" / "fix-wheel" / "build.py"
SITE_PACKAGES = sysconfig.get_paths()["purelib"]  # this interpreter's torch/modelopt/megatron
MARK = "__moe_ckpt_fix__"  # what moe_ckpt_fix.modelopt_0_47_0 sets on every function it installs

pytestmark = pytest.mark.cpu

# Run in the throwaway venv: what start-up left behind, then (IMPORT=1) modelopt imported.
PROBE = """
import json, os, sys
print(json.dumps({
    "fix_modules": sorted(m for m in sys.modules if m.split(".")[0] == "moe_ckpt_fix"),
    "fix_file": getattr(sys.modules.get("moe_ckpt_fix"), "__file__", None),
    "torch": "torch" in sys.modules, "modelopt": "modelopt" in sys.modules,
    "hook_armed": any(type(f).__name__ == "_ApplyAfterImport" for f in sys.meta_path)}), flush=True)
if os.environ.get("IMPORT") == "1":
    import modelopt.torch
    import modelopt.torch.quantization.plugins.custom as custom
    import modelopt.torch.quantization.plugins.megatron as mp
    print(json.dumps({"patched": [
        getattr(mp.make_sharded_tensors_for_checkpoint, "__moe_ckpt_fix__", False),
        getattr(custom._ParallelLinear.modelopt_post_restore, "__moe_ckpt_fix__", False)]}))
"""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path  # the throwaway venv's interpreter, the wheel installed into it
    root: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("fix-wheel")
    built = bounded([sys.executable, str(BUILD), str(root / "dist")], 300, cwd=root)
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip())
    venv = bounded([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], 120)
    assert venv.returncode == 0, venv.stderr
    python = root / "venv" / "bin" / "python"
    pip = bounded([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                   "--no-deps", "--no-index", str(wheel)], 300, cwd=root)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return Installed(wheel, python, root)


def _start(inst: Installed, fix: str | None, code: str = PROBE, path: str = SITE_PACKAGES,
           **env):
    """``code`` in the throwaway venv, bounded, outside the repository; ``fix``: MOE_CKPT_FIX
    (None: unset); ``path``: its PYTHONPATH."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MOE_CKPT_FIX") and k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    base.update(PYTHONPATH=path, **env)
    if fix is not None:
        base["MOE_CKPT_FIX"] = fix
    return bounded([str(inst.python), "-W", "ignore", "-c", code], 180, env=base, cwd=inst.root)


def _first_json(stdout: str) -> dict:
    return json.loads(stdout.splitlines()[0])


def test_the_wheel_is_the_fix_package_and_its_start_up_hook(installed):
    assert installed.wheel.name == moe_ckpt_fix.WHEEL
    with zipfile.ZipFile(installed.wheel) as z:
        names = set(z.namelist())
        dist_info = f"moe_ckpt_fix-{moe_ckpt_fix.__version__}.dist-info"
        package = {f"moe_ckpt_fix/{p.name}" for p in (REPO / "moe_ckpt_fix").glob("*.py")}
        assert names == {"moe_ckpt_fix.pth", *package,
                         *(f"{dist_info}/{n}" for n in ("METADATA", "WHEEL", "top_level.txt", "RECORD"))}
        for name in package:  # the repository's one copy, byte for byte
            assert z.read(name) == (REPO / name).read_bytes(), name
        assert z.read("moe_ckpt_fix.pth") == (REPO / "tools/fix-wheel/moe_ckpt_fix.pth").read_bytes()
        meta = z.read(f"{dist_info}/METADATA").decode()
    assert f"Name: {moe_ckpt_fix.DISTRIBUTION}\n" in meta
    assert f"Version: {moe_ckpt_fix.__version__}\n" in meta
    assert "Requires-Dist" not in meta  # it must never pull in or change modelopt/megatron-core
    site = installed.python.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert (site / "moe_ckpt_fix.pth").is_file() and (site / "moe_ckpt_fix" / "autoload.py").is_file()


def test_unset_imports_nothing_and_patches_nothing(installed):
    r = _start(installed, None, IMPORT="1")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    start, after = (json.loads(line) for line in r.stdout.splitlines()[:2])
    assert start == {"fix_modules": [], "fix_file": None, "torch": False, "modelopt": False,
                     "hook_armed": False}
    assert after == {"patched": [False, False]}


@pytest.mark.parametrize("value", ["", " ", "0", "false", " No "])
def test_off_values_arm_nothing(installed, value):
    r = _start(installed, value)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    start = _first_json(r.stdout)
    assert start["hook_armed"] is False and start["torch"] is False and start["modelopt"] is False
    if not value.strip():  # empty: the .pth line does not even import moe_ckpt_fix
        assert start["fix_modules"] == []


def _te_importable() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def test_on_applies_the_fix_when_modelopt_torch_imports(installed):
    """Start-up arms the hook without importing torch; importing modelopt.torch runs
    ``apply()`` from the wheel's copy, with the installed 0.47.0 and megatron-core accepted."""
    assert moe_ckpt_fix._installed_modelopt_version() == moe_ckpt_fix.SUPPORTED_MODELOPT_VERSION
    assert moe_ckpt_fix._installed_mcore_version() in moe_ckpt_fix.SUPPORTED_MCORE_VERSIONS
    r = _start(installed, "1", IMPORT="1", MOE_CKPT_FIX_VERBOSE="1")
    start = _first_json(r.stdout)
    assert start["fix_file"].startswith(str(installed.root / "venv")), start
    assert start["hook_armed"] and not start["torch"] and not start["modelopt"], start
    lines = r.stderr.splitlines()
    if _te_importable():
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[1]) == {"patched": [True, True]}
        assert any(line.startswith("[MOE_CKPT_FIX] nvidia-modelopt 0.47.0 patched") for line in lines)
    else:
        assert r.returncode == 3, (r.returncode, r.stderr)
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("[MOE_CKPT_FIX] TransformerEngineMissing: moe_ckpt_fix:")
        assert "Nothing was patched" in lines[0]
        assert len(r.stdout.splitlines()) == 1  # stopped inside the import, before the last print


@pytest.mark.parametrize("value", ["banana", "on", "2"])
def test_a_bad_value_refuses_in_one_line_before_anything_runs(installed, value):
    r = _start(installed, value, code="print('ran')")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[MOE_CKPT_FIX] refusing") and repr(value) in lines[0]


def _fake_modelopt(root: Path, version: str) -> Path:
    """A site directory whose nvidia-modelopt is ``version``: its metadata and an empty package."""
    site = root / f"fake-modelopt-{version}"
    (site / "modelopt" / "torch").mkdir(parents=True, exist_ok=True)
    (site / "modelopt" / "__init__.py").write_text("")
    (site / "modelopt" / "torch" / "__init__.py").write_text("")
    meta = site / f"nvidia_modelopt-{version}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-modelopt\nVersion: {version}\n")
    return site


def test_another_modelopt_is_refused_in_one_line_and_no_modelopt_breaks_nothing(installed):
    other = _start(installed, "1", code="import modelopt.torch; print('imported')",
                   path=str(_fake_modelopt(installed.root, "0.46.1")))
    assert other.returncode == 3, (other.returncode, other.stderr)
    lines = other.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[MOE_CKPT_FIX] UnsupportedModeloptVersion:")
    assert "0.46.1 is installed" in lines[0] and "Nothing was patched" in lines[0]
    assert "imported" not in other.stdout

    none = _start(installed, "1", code="import json; print('ok')", path="")
    assert none.returncode == 0 and none.stdout == "ok\n" and none.stderr == "", none.stderr
