"""/etc/shadow and friends stay hidden when the host replaces them by rename.

useradd, passwd, chpasswd and vipw write a new file and rename it over the old one.  The
kernel then detaches every mount on the old dentry in every other mount namespace, so a
mask bound over /etc/shadow vanished from a running jail and from a root tree built
ahead of time; a root caller's jail read the hashes.  The jail now hides the names (see
sandbox/mounts.py).  These tests replace the host's files with copies of themselves
(conftest's ``replace_secrets_by_rename``: same bytes, mode, owner and times, under the
lock shadow-utils takes) and check that a root jail reads nothing of them, whether its
root tree was built before the rename or it was already running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import contain, mounts, supervise

SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
READ_ALL = "cat " + " ".join(SECRET_FILES) + " && echo all-read"


def host_lines() -> list[str]:
    """Every non-empty line of the host's secret files (the root test's own caller reads them)."""
    return [line for path in SECRET_FILES if os.path.exists(path)
            for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]


def assert_nothing_leaked(output: str) -> None:
    """The jail's cat read the four names, all empty, and no line of the host's files.

    The jail is root's, which keeps CAP_DAC_OVERRIDE (sandbox/rootcaps.py): the mask's
    mode-0000 files are read, and hold nothing.
    """
    lines = host_lines()
    assert lines, "the host has no secrets to hide: the test would prove nothing"
    assert not [line for line in lines if line in output], output
    assert output == "all-read\n", output


@pytest.fixture
def dirs(root_required: None, tmp_path: Path) -> dict[str, str]:
    found = {}
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
        found[name] = str(tmp_path / name)
    return found


def spec(dirs: dict[str, str], script: str) -> contain.JailSpec:
    return contain.JailSpec(merged_dir=dirs["merged"], workspace="/srv/ccw-etc-secrets", tmp_dir=dirs["tmp"],
                         home_dir=dirs["home"], argv=["sh", "-c", script], cwd="/srv/ccw-etc-secrets",
                         env={"PATH": "/usr/bin:/bin"}, uid=0, gid=0, timeout_ms=30_000)


def test_a_root_tree_built_before_the_rename_still_hides_the_secrets(
        dirs: dict[str, str], require: Callable[[bool, str], None], rename_secrets: Callable[[], None]) -> None:
    tree = mounts.spare_root()
    require(tree is not None, "this kernel builds no root tree ahead (< 6.15)")
    assert tree is not None
    os.close(tree)
    supervise._SPARE_ROOTS.refill()  # the next jail takes this tree, built before the rename
    rename_secrets()
    result = supervise.run(spec(dirs, f"{READ_ALL} 2>&1; echo @@; stat -c '%n %a %s' {' '.join(SECRET_FILES)}"))
    read, _, stats = result.stdout.decode(errors="replace").partition("@@\n")
    assert_nothing_leaked(read)
    # Every name is there, empty and mode 0, whether or not the host has it.
    assert stats.splitlines() == [f"{path} 0 0" for path in SECRET_FILES], stats


def test_a_running_jail_still_hides_the_secrets_after_the_rename(dirs: dict[str, str],
                                                                rename_secrets: Callable[[], None]) -> None:
    ready, go = Path(dirs["tmp"]) / "ready", Path(dirs["tmp"]) / "go"
    script = (f"{READ_ALL} 2>&1; echo @@; : > /tmp/ready; "
              f"while [ ! -e /tmp/go ]; do sleep 0.05; done; {READ_ALL} 2>&1")
    errors: list[BaseException] = []

    def host() -> None:
        try:
            deadline = time.monotonic() + 20
            while not ready.exists():
                assert time.monotonic() < deadline, "the jail never got ready"
                time.sleep(0.02)
            rename_secrets()
        except BaseException as exc:  # the test thread reports it
            errors.append(exc)
        finally:
            go.touch()

    thread = threading.Thread(target=host)
    thread.start()
    try:
        result = supervise.run(spec(dirs, script))
    finally:
        thread.join()
    assert not errors, errors
    before, _, after = result.stdout.decode(errors="replace").partition("@@\n")
    assert_nothing_leaked(after)
    assert_nothing_leaked(before)
