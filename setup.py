"""ccw's C parts: the jail launcher (sandbox/jail/, an executable) and hashline tags (mcp_server/core/_fnvtags.c).

Everything else is in pyproject.toml.

- ``ccw-jail`` (sandbox/jail_launcher.py says why it is C) is built by every install: a wheel
  carries it as sandbox/ccw-jail, and an editable install (``pip install -e .``, what
  ``./dev setup`` does) builds it in place, next to the package's modules, where the
  helper looks for it.  It is linked statically when the C library allows (no dynamic
  loader at each jail's start), else dynamically.  A failed build fails the install:
  the helper cannot run a jail without it.
- The ``_fnvtags`` extension is optional: when it cannot be built (no compiler or Python
  headers), the install goes on and linetags.py computes the tags in Python, about 60
  times slower.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join("sandbox", "ccw-jail")
LAUNCHER_SOURCES = [os.path.join("sandbox", "jail", name) for name in ("ccw_jail.c", "plan.c", "steps.c")]
CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror"]


def build_launcher(target: str) -> None:
    """Compile ccw-jail into ``target`` (static if the C library allows, else dynamic)."""
    compiler = os.environ.get("CC", "gcc").split()
    sources = [os.path.join(HERE, source) for source in LAUNCHER_SOURCES]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    static = subprocess.run([*compiler, *CFLAGS, "-static", "-o", target, *sources], capture_output=True, text=True)
    if static.returncode != 0:
        subprocess.run([*compiler, *CFLAGS, "-o", target, *sources], check=True)
    os.chmod(target, 0o755)


class BuildWithLauncher(build_ext):
    """build_ext, then ccw-jail into the build (a wheel) and, editable or --inplace, into the source tree."""

    def run(self) -> None:
        super().run()
        built = os.path.join(self.build_lib, LAUNCHER)
        build_launcher(built)
        if self.inplace or getattr(self, "editable_mode", False):
            shutil.copy2(built, os.path.join(HERE, LAUNCHER))

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), os.path.join(self.build_lib, LAUNCHER)]


if __name__ == "__main__" and sys.argv[1:] == ["launcher"]:
    # `python setup.py launcher`: only ccw-jail, in place (a checkout or worktree whose
    # venv is installed from elsewhere); no setuptools command runs.
    build_launcher(os.path.join(HERE, LAUNCHER))
    sys.exit(0)

setup(
    ext_modules=[Extension("mcp_server.core._fnvtags", ["mcp_server/core/_fnvtags.c"], optional=True)],
    cmdclass={"build_ext": BuildWithLauncher},
)
