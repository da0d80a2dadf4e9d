"""Only what pyproject.toml cannot say: moe_ckpt_fix.pth at the top of the wheel, so that it
lands in site-packages itself, where ``site`` runs it at every interpreter start."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "moe_ckpt_fix.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
