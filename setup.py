"""ccw's C parts: the jail launcher (sandbox/jail/, an executable), the port forwarder
(mcp_server/egress/forwarder/, an executable) and hashline tags (mcp_server/core/_fnvtags.c).

Everything else is in pyproject.toml.

- ``ccw-jail`` (sandbox/jail_launcher.py says why it is C) is built by every install: a wheel
  carries it as sandbox/ccw-jail, and an editable install (``pip install -e .``, what
  ``./dev setup`` does) builds it in place, next to the package's modules, where the
  helper looks for it.  It is linked statically when the C library allows (no dynamic
  loader at each jail's start), else dynamically.  A failed build fails the install:
  the helper cannot run a jail without it.
- ``ccw-forward`` (its essay in mcp_server/egress/forwarder/ccw_forward.c says why it is C)
  is built the same way, into mcp_server/egress/, where the front end looks for it; a
  forwarded port cannot open without it.
- The ``_fnvtags`` extension is optional: when it cannot be built (no compiler or Python
  headers), the install goes on and linetags.py computes the tags in Python, about 60
  times slower.
"""

import os
import runpy
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join("sandbox", "ccw-jail")
LAUNCHER_SOURCES = [os.path.join("sandbox", "jail", name) for name in ("ccw_jail.c", "plan.c", "steps.c")]
FORWARDER = os.path.join("mcp_server", "egress", "ccw-forward")
FORWARDER_SOURCES = [os.path.join("mcp_server", "egress", "forwarder", name)
                     for name in ("ccw_forward.c", "owner.c", "capsule.c", "relay.c", "control.c")]
PROGRAMS = {LAUNCHER: LAUNCHER_SOURCES, FORWARDER: FORWARDER_SOURCES}
CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror"]
# The launcher's interface table (descriptors, option bits, step codes, bounds), shared
# with the helper: loaded by path, as ccw is not installed yet, and written out as the
# header sandbox/jail/jail.h includes (sandbox/jail_interface.py says why).
INTERFACE = os.path.join(HERE, "sandbox", "jail_interface.py")


def write_interface_header(directory: str) -> None:
    """``jail_interface.h`` into ``directory``, from the table in sandbox/jail_interface.py."""
    with open(os.path.join(directory, "jail_interface.h"), "w") as header:
        header.write(runpy.run_path(INTERFACE)["header"]())


def build_program(target: str, sources: list[str]) -> None:
    """Compile ``sources`` into the executable ``target`` (static if the C library allows, else dynamic)."""
    compiler = os.environ.get("CC", "gcc").split()
    sources = [os.path.join(HERE, source) for source in sources]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory() as generated:
        write_interface_header(generated)
        flags = [*CFLAGS, "-I", generated]
        # Into a new file, renamed over the old: a helper spawning the program meanwhile
        # gets the old one or the new one, never a half-written file.
        built = os.path.join(generated, os.path.basename(target))
        static = subprocess.run([*compiler, *flags, "-static", "-o", built, *sources], capture_output=True, text=True)
        if static.returncode != 0:
            subprocess.run([*compiler, *flags, "-o", built, *sources], check=True)
        os.chmod(built, 0o755)
        shutil.copy2(built, target + ".new")
        os.replace(target + ".new", target)


class BuildWithLauncher(build_ext):
    """build_ext, then ccw-jail and ccw-forward into the build (a wheel) and, editable or
    --inplace, into the source tree."""

    def run(self) -> None:
        super().run()
        for program, sources in PROGRAMS.items():
            built = os.path.join(self.build_lib, program)
            build_program(built, sources)
            if self.inplace or getattr(self, "editable_mode", False):
                shutil.copy2(built, os.path.join(HERE, program) + ".new")  # renamed over, as build_program does
                os.replace(os.path.join(HERE, program) + ".new", os.path.join(HERE, program))

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), *(os.path.join(self.build_lib, program) for program in PROGRAMS)]


if __name__ == "__main__" and sys.argv[1:] == ["launcher"]:
    # `python setup.py launcher`: only the C programs, in place (a checkout or worktree
    # whose venv is installed from elsewhere); no setuptools command runs.
    for program, sources in PROGRAMS.items():
        build_program(os.path.join(HERE, program), sources)
    sys.exit(0)

setup(
    ext_modules=[Extension("mcp_server.core._fnvtags", ["mcp_server/core/_fnvtags.c"], optional=True)],
    cmdclass={"build_ext": BuildWithLauncher},
)
