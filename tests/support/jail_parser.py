"""ccw-jail's plan parser (sandbox/jail/plan.c) built alone, under ASan and UBSan, for tests.

The harness (tests/fuzz/jail_plan_harness.c) reads plans from stdin and prints one line
per plan ("ok ..." or "refused WHY"); it aborts on a sanitizer's finding or on a broken
promise of jail.h.  ``build`` compiles it with the header generated from an interface
table, the real one (sandbox/jail_interface.py) or an edited copy, as setup.py does.
"""

from __future__ import annotations

import os
import runpy
import shutil
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERFACE = os.path.join(ROOT, "sandbox", "jail_interface.py")
HARNESS = os.path.join(ROOT, "tests", "fuzz", "jail_plan_harness.c")
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# Leaks are not findings here: a refused plan ends the launcher, which frees nothing.
ENV = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


def compiler() -> str | None:
    """The C compiler the build uses (CC, else gcc), or None where there is none."""
    return shutil.which(os.environ.get("CC", "gcc").split()[0])


def build(directory: str, interface: str = INTERFACE, jail_dir: str | None = None) -> str:
    """The harness built in ``directory`` from ``interface``'s table and ``jail_dir``'s
    plan.c and jail.h (default: the repository's); its path."""
    jail_dir = jail_dir or os.path.join(ROOT, "sandbox", "jail")
    with open(os.path.join(directory, "jail_interface.h"), "w") as header:
        header.write(runpy.run_path(interface)["header"]())
    binary = os.path.join(directory, "jail-plan-harness")
    subprocess.run([os.environ.get("CC", "gcc"), "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *SANITIZERS,
                    "-I", directory, "-I", jail_dir, "-o", binary, HARNESS, os.path.join(jail_dir, "plan.c")],
                   check=True, capture_output=True, text=True)
    return binary


def run(binary: str, plans: list[bytes]) -> tuple[int, list[str], str]:
    """The harness over ``plans``: its exit status, one line per plan read, its stderr."""
    stdin = b"".join(struct.pack("=I", len(plan)) + plan for plan in plans)
    done = subprocess.run([binary], input=stdin, capture_output=True, env={**os.environ, **ENV}, timeout=120)
    return done.returncode, done.stdout.decode(errors="replace").splitlines(), done.stderr.decode(errors="replace")
