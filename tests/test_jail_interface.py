"""The launcher's binary interface has one source, sandbox/jail_interface.py, and a change on one side fails.

The C (sandbox/jail/) names the table's numbers and never spells them: the build writes
them into a generated header.  Each way the two sides could drift is tried on a copy:
the C defining a number of its own is found, the C naming what the table lacks does not
compile, and a launcher built from another table (or a helper encoding with one)
refuses the plan by its magic.
"""

from __future__ import annotations

import glob
import os
import re
import runpy
import shutil
import subprocess

import pytest

from sandbox import contain, jail_interface, jail_launcher, mounts, namespaces
from tests.support import jail_parser

JAIL_DIR = os.path.join(jail_parser.ROOT, "sandbox", "jail")
needs_cc = pytest.mark.skipif(jail_parser.compiler() is None, reason="no C compiler (./dev setup installs gcc)")


def _generated_names() -> set[str]:
    header = jail_interface.header()
    return (set(re.findall(r"#define (\w+)", header)) - {"CCW_JAIL_INTERFACE_H"}
            | set(re.findall(r"^\s+(\w+) =", header, re.M)))


def spelled(sources: dict[str, str]) -> list[str]:
    """Where C sources define a name the generated header defines (``#define X``, ``X =`` in an enum)."""
    found = []
    for name in sorted(_generated_names()):
        pattern = re.compile(rf"#\s*define\s+{name}\b|^\s*{name}\s*=|[{{,]\s*{name}\s*=", re.M)
        found += [f"{path}: {name}" for path, text in sources.items() if pattern.search(text)]
    return found


def _read(path: str) -> str:
    with open(path) as source:
        return source.read()


def _sources(directory: str) -> dict[str, str]:
    paths = glob.glob(os.path.join(directory, "*.c")) + glob.glob(os.path.join(directory, "*.h"))
    return {os.path.basename(path): _read(path) for path in paths}


def _edited_table(tmp_path, old: str, new: str) -> str:  # type: ignore[no-untyped-def]
    text = _read(jail_parser.INTERFACE)
    assert old in text
    path = str(tmp_path / "jail_interface.py")
    with open(path, "w") as copy:
        copy.write(text.replace(old, new, 1))
    return path


def _plan() -> bytes:
    plan = contain.Plan(ns=namespaces.NamespacePlan(hostname="box"), mount_steps=[mounts.MountStep("private", "/")],
                        argv=["true"], env={}, cwd="/", uid=1, gid=1, set_uid=True, set_gid=True,
                        clear_groups=True, last_cap=40, keep_caps=0, seccomp_filter=None)
    return jail_launcher.encode(plan, jail_launcher.ROOT, 0)


def test_the_c_spells_none_of_the_tables_numbers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert spelled(_sources(JAIL_DIR)) == []
    # The check can fail: a copy of jail.h that writes a descriptor and a step code itself.
    copy = _sources(JAIL_DIR)
    copy["jail.h"] += "\n#define FD_NET 5\nenum again { STEP_BIND = 3 };\n"
    assert spelled(copy) == ["jail.h: FD_NET", "jail.h: STEP_BIND"]


@pytest.mark.parametrize("old,new", [
    ('"NET": 5,', '"NET": 9,'), ('"SET_UID": 8,', '"SET_UID": 256,'), ('"bind": 3,', '"bind": 30,'),
    ('"NOFOLLOW": 2,', '"NOFOLLOW": 8,'), ('"MAX_CGROUPS": 16,', '"MAX_CGROUPS": 17,')])
def test_every_number_of_the_table_is_in_the_magic(tmp_path, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    edited = runpy.run_path(_edited_table(tmp_path, old, new))
    assert edited["MAGIC"][:4] == jail_interface.MAGIC[:4] and edited["MAGIC"] != jail_interface.MAGIC


@needs_cc
def test_a_launcher_and_a_helper_of_different_tables_refuse_each_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "real").mkdir()
    (tmp_path / "other").mkdir()
    other_table = _edited_table(tmp_path / "other", '"SET_UID": 8,', '"SET_UID": 256,')
    real, other = jail_parser.build(str(tmp_path / "real")), jail_parser.build(str(tmp_path / "other"), other_table)
    plan, other_magic = _plan(), runpy.run_path(other_table)["MAGIC"]
    assert jail_parser.run(real, [plan])[1][0].startswith("ok options=")  # the two sides agree
    for launcher, raw in ((other, plan), (real, other_magic + plan[8:])):  # the C changed alone; the Python alone
        status, lines, _ = jail_parser.run(launcher, [raw])
        assert status == 0 and lines == ["refused the plan's magic is not this launcher's: it was built from another "
                                         "sandbox/jail_interface.py (rebuild it: ./dev setup, "
                                         "or python setup.py launcher)"]


@needs_cc
def test_the_c_does_not_build_when_the_table_lacks_a_name_it_uses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _edited_table(tmp_path, '"bind_over": 12, ', "")
    with open(tmp_path / "jail_interface.h", "w") as header:
        header.write(runpy.run_path(table)["header"]())
    compile_steps = [os.environ.get("CC", "gcc"), "-std=gnu11", "-fsyntax-only", "-I", str(tmp_path), "-I", JAIL_DIR,
                     os.path.join(JAIL_DIR, "steps.c")]
    done = subprocess.run(compile_steps, capture_output=True, text=True)
    assert done.returncode != 0 and "STEP_BIND_OVER" in done.stderr
    shutil.copy(jail_parser.INTERFACE, tmp_path / "jail_interface.py")  # the real table: it builds
    with open(tmp_path / "jail_interface.h", "w") as header:
        header.write(jail_interface.header())
    assert subprocess.run(compile_steps, capture_output=True, text=True).returncode == 0


def test_the_helper_uses_the_tables_numbers() -> None:
    assert jail_launcher.MAGIC == jail_interface.MAGIC and jail_launcher.ACTIONS is jail_interface.ACTIONS
    assert (jail_interface.DESCRIPTORS["PLAN"], jail_interface.DESCRIPTORS["CGROUPS"]) == (
        jail_launcher.FD_PLAN, jail_launcher.FD_CGROUPS)
    assert jail_interface.DESCRIPTORS["REPORT"] == contain._FD_REPORT
    assert {step.action for step in mounts.root_steps()} <= set(jail_interface.ACTIONS)
