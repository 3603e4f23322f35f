"""A jail as a rootless helper makes it, without the helper: a child started as root drops
to an unused uid (``USER``, no passwd entry needed), unshares a user and mount namespace
mapping that uid to 0 (what ``unshare -Urm`` does) and calls ``supervise.run`` as the
helper would, in the directories of the ``base`` fixture.

``base`` is vm-tests/conftest.py's: every vm-test can take it by name (it needs the
conftest's ``root_required`` and ``require``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER = 61_234  # an unprivileged uid created for the test (no passwd entry needed)

CHILD = textwrap.dedent("""
    import json, os, sys
    import prctl
    sys.path.insert(0, sys.argv[1])
    from sandbox import contain, namespaces, supervise, syscalls
    base, uid = sys.argv[2], int(sys.argv[3])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl.set_dumpable(True)  # the uid change made /proc/self root-owned; a real user starts dumpable
    syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNS)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {uid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    spec = contain.JailSpec(
        merged_dir=f"{base}/merged", workspace="/srv/project", tmp_dir=f"{base}/tmp",
        home_dir=f"{base}/home", cwd="/srv/project",
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"},
        argv=["/bin/sh", "-c", sys.argv[4]], uid=0, gid=0, timeout_ms=int(sys.argv[5]))
    runs = [supervise.run(spec) for _ in range(int(sys.argv[6]))]  # later runs take the spares made meanwhile
    result = runs[0]
    print(json.dumps({"exit_code": result.exit_code, "signal": result.signal,
                      "stdouts": [run.stdout.decode() for run in runs],
                      "timed_out": result.timed_out, "stdout": result.stdout.decode(),
                      "stderr": result.stderr.decode(),
                      "direct_pidns": namespaces.pid_namespace_restorable(),
                      "user_namespace": contain.mechanisms()["user_namespace"]}))
""")


@pytest.fixture
def base(root_required: None, require: Callable[[bool, str], None]) -> Iterator[Path]:
    """The rootless jail's directories (merged root, tmp, home), owned by ``USER``."""
    with open("/proc/sys/kernel/unprivileged_userns_clone" if os.path.exists(
            "/proc/sys/kernel/unprivileged_userns_clone") else "/proc/sys/user/max_user_namespaces") as handle:
        require(int(handle.read()) > 0, "unprivileged user namespaces are disabled")
    path = Path(tempfile.mkdtemp(prefix="ccw-rootless-", dir="/tmp"))
    for name in ("", "merged", "tmp", "home"):
        (path / name).mkdir(exist_ok=True)
        os.chown(path / name, USER, USER)
    (path / "merged" / "hello.txt").write_text("hi\n")
    yield path
    shutil.rmtree(path)


def run_rootless(base: Path, script: str, timeout_ms: int = 20_000, runs: int = 1) -> dict[str, object]:
    """Run ``script`` (sh) in a jail as ``USER``, rootless, ``runs`` times; the first run's result."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(base), str(USER), script, str(timeout_ms), str(runs)],
        capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, object] = json.loads(proc.stdout)
    return result
