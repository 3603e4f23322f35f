"""sandbox/mountinfo.py on the real kernel: ``table()`` is read again exactly when the mount table changed.

Each case runs in a child of its own mount namespace (``unshare --mount``, private
propagation), so its mounts never reach the host's table.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _in_own_namespace(script: str) -> str:
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           textwrap.dedent(script)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_table_is_kept_until_a_mount_or_unmount_and_then_read_again(
        root_required: None, tmp_path: Path) -> None:
    out = _in_own_namespace(f"""
        import subprocess
        from sandbox import mountinfo
        point = {str(tmp_path)!r}
        first = mountinfo.table()
        assert mountinfo.table() is first, "read again with nothing changed"
        assert point not in [m.mount_point for m in first]
        subprocess.run(["mount", "-t", "tmpfs", "ccw-test", point], check=True)
        mounted = mountinfo.table()
        assert mounted is not first and [m.fstype for m in mounted if m.mount_point == point] == ["tmpfs"]
        assert mountinfo.table() is mounted
        subprocess.run(["mount", "-o", "remount,ro", point], check=True)  # a change of one mount's options
        remounted = mountinfo.table()
        assert remounted is not mounted
        subprocess.run(["umount", point], check=True)
        assert point not in [m.mount_point for m in mountinfo.table()]
        assert mountinfo.mounts_under(point) == []
        print("ok")
    """)
    assert out == "ok\n"


def test_a_new_mount_namespace_is_read_from_its_own_table(root_required: None, tmp_path: Path) -> None:
    # The descriptor kept belongs to the namespace it was opened in: after unshare, the
    # old one would show neither the new mounts nor a change.
    out = _in_own_namespace(f"""
        import subprocess
        from sandbox import mountinfo, syscalls
        point = {str(tmp_path)!r}
        before = mountinfo.table()
        syscalls.unshare(syscalls.CLONE_NEWNS)
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "ccw-test", point], check=True)
        assert point in [m.mount_point for m in mountinfo.table()]
        assert point not in [m.mount_point for m in before]
        print("ok")
    """)
    assert out == "ok\n"


@pytest.mark.parametrize("count", [40])
def test_many_changes_between_reads_are_one_read(root_required: None, tmp_path: Path, count: int) -> None:
    out = _in_own_namespace(f"""
        import os, subprocess
        from sandbox import mountinfo
        base = {str(tmp_path)!r}
        first = mountinfo.table()
        for i in range({count}):
            os.mkdir(f"{{base}}/m{{i}}")
            subprocess.run(["mount", "-t", "tmpfs", "ccw-test", f"{{base}}/m{{i}}"], check=True)
        after = mountinfo.table()
        assert len(after) == len(first) + {count}
        assert mountinfo.table() is after
        assert len(mountinfo.mounts_under(base)) == {count}
        print("ok")
    """)
    assert out == "ok\n"
