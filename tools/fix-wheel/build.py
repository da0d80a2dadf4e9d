"""Build the moe-ckpt-fix wheel: ``python tools/fix-wheel/build.py [OUT_DIR]`` (``make fix-wheel``,
OUT_DIR default ``dist``); prints the wheel's path.

The repository root's ``moe_ckpt_fix/`` (the one copy of the fix) and this directory's
pyproject.toml, setup.py and moe_ckpt_fix.pth are copied into a temporary project, which
``pip wheel --no-deps --no-build-isolation --no-index`` builds with the setuptools of the running
interpreter: offline, and leaving no build/ or egg-info in the checkout.

Reproducible: the same source gives the same bytes. The wheel pip wrote is written again with
its entries in a fixed order (the package's files sorted, the .dist-info ones last, RECORD at the
very end), each dated SOURCE_DATE_EPOCH (default 1980-01-01, the first date a zip holds), with
fixed permissions and compression: nothing of the build's clock, temporary folder or umask.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PACKAGE = "moe_ckpt_fix"
PROJECT_FILES = ("pyproject.toml", "setup.py", "moe_ckpt_fix.pth")
TIMEOUT_S = 300
EPOCH_ZIP_MIN = 315532800  # 1980-01-01T00:00:00Z: the earliest date a zip entry can hold


def _entry_order(name: str) -> tuple:
    """The package's files first (sorted), then .dist-info's, its RECORD last (the wheel spec)."""
    meta = ".dist-info/" in name
    return (meta, meta and name.endswith("/RECORD"), name)


def normalized(src: Path, dst: Path, epoch: int) -> None:
    """``src`` written again as ``dst`` with nothing that varies from build to build."""
    stamp = time.gmtime(max(epoch, EPOCH_ZIP_MIN))[:6]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in sorted(zin.namelist(), key=_entry_order):
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the permissions below are read
            info.external_attr = (0o100644) << 16
            zout.writestr(info, zin.read(name), compresslevel=9)


def build(out_dir: Path) -> Path:
    """The wheel, written into ``out_dir`` (a wheel of the same name there is replaced)."""
    sys.path.insert(0, str(REPO))
    from harness import bounded
    from moe_ckpt_fix import WHEEL

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or EPOCH_ZIP_MIN)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="moe-ckpt-fix-") as tmp:
        project = Path(tmp) / "project"
        shutil.copytree(REPO / PACKAGE, project / PACKAGE,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in PROJECT_FILES:
            shutil.copy(HERE / name, project / name)
        built = Path(tmp) / "wheels"
        done = bounded.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "--no-index", "--wheel-dir", str(built),
                            str(project)], TIMEOUT_S, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=tmp,
                           env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
        if done.timed_out or done.returncode != 0:
            why = f"ran past {TIMEOUT_S} s" if done.timed_out else f"exit {done.returncode}"
            raise RuntimeError(f"pip wheel {why}:\n{done.stdout}")
        wheels = sorted(p.name for p in built.glob("*.whl"))
        if wheels != [WHEEL]:
            raise RuntimeError(f"pip wheel wrote {wheels}, expected [{WHEEL}] "
                               "(moe_ckpt_fix.WHEEL and pyproject.toml disagree)")
        normalized(built / WHEEL, Path(tmp) / WHEEL, epoch)
        return Path(shutil.copy(Path(tmp) / WHEEL, out_dir / WHEEL))


if __name__ == "__main__":
    try:
        print(build(Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "dist")))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
