"""Running Python as another user, for the tests that need one (another uid, a rootless helper).

The interpreter may live under a directory other users cannot traverse (here
/root/.pyenv behind /root, mode 0700), so ``as_user`` runs the command in a private
mount namespace where each such directory is covered by a tmpfs showing only the
entries needed, bound from the original; the host is not changed.  Then ``setpriv``
drops to the uid/gid.  The repository is made reachable too, so a script run this way
imports this tree's ``sandbox``, ``mcp_server`` and ``tests.support`` when it puts the
repository on its path.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 47_311  # no account needed: setpriv takes numbers


def _blocked_ancestors(paths: list[str]) -> dict[str, set[str]]:
    """Directories other users cannot search, mapped to the children the paths need."""
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for depth in range(1, len(parts) - 1):
            directory = os.path.join(*parts[:depth])
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                blocked.setdefault(directory, set()).add(parts[depth])
                break
    return blocked


def as_user(uid: int, gid: int, argv: list[str], keep_dirs: list[str]) -> list[str]:
    """A command running ``argv`` as uid/gid, with the interpreter reachable."""
    needed = [os.path.realpath(sys.executable), sys.base_prefix, sys.prefix, str(ROOT)]
    lines = ["set -e"]
    for directory, children in sorted(_blocked_ancestors(needed).items()):
        keep = tempfile.mkdtemp(prefix="ccw-ipc-keep-")
        keep_dirs.append(keep)
        lines.append(f"mount --bind {shlex.quote(directory)} {shlex.quote(keep)}")
        lines.append(f"mount -t tmpfs -o mode=0755 ccw-test {shlex.quote(directory)}")
        for child in sorted(children):
            src, dst = os.path.join(keep, child), os.path.join(directory, child)
            make = "mkdir" if os.path.isdir(os.path.join(directory, child)) else "touch"
            lines.append(f"{make} {shlex.quote(dst)} && mount --bind {shlex.quote(src)} {shlex.quote(dst)}")
    lines.append(
        f"exec setpriv --reuid={uid} --regid={gid} --clear-groups -- {shlex.join(argv)}"
    )
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", "\n".join(lines)]


def run_script_as(uid: int, gid: int, argv: list[str], cwd: Path, timeout: float = 280) -> dict[str, Any]:
    """Run ``argv`` (a script that prints one JSON object last) as uid/gid and return that
    object; a failure shows the tail of its stderr."""
    keep: list[str] = []
    try:
        done = subprocess.run(as_user(uid, gid, argv, keep), cwd=str(cwd), capture_output=True, timeout=timeout,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    finally:
        for directory in keep:
            os.rmdir(directory)
    assert done.returncode == 0, done.stderr.decode()[-6000:]
    out: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return out
