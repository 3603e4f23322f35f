"""The jail run by a rootless helper: an unprivileged uid that is root only in its own user namespace.

The test starts a Python child as root, which imports ccw, drops to an unused uid (no
passwd entry needed), unshares a user and mount namespace mapping that uid to 0 (what
``unshare -Urm`` does), and then calls ``supervise.run`` like the helper would.
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

ROOT = Path(__file__).resolve().parent.parent
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
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(base), str(USER), script, str(timeout_ms), str(runs)],
        capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_rootless_jail_runs_isolated(base: Path) -> None:
    result = run_rootless(base, "id -u; cat /proc/sys/kernel/hostname; pwd; cat hello.txt; "
                                "echo w > made.txt; echo t > /tmp/t; echo $PPID; "
                                "ls /proc | grep -cE '^[0-9]+$'; "
                                "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
                                "touch /usr/x 2>/dev/null || echo usr-ro; cat /etc/shadow; echo end")
    assert result["exit_code"] == 0, result["stderr"]
    assert result["user_namespace"] is True
    assert result["direct_pidns"] is False  # cannot setns back to the host's pid namespace
    lines = str(result["stdout"]).splitlines()
    assert lines[:5] == ["0", "ccw", "/srv/project", "hi", "1"]
    assert int(lines[5]) < 10
    assert lines[6:] == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "usr-ro", "end"]
    assert (base / "merged" / "made.txt").read_text() == "w\n"
    assert (base / "tmp" / "t").stat().st_uid == USER  # uid 0 in the namespace is USER outside


def test_rootless_jails_after_the_first_see_the_same_root(base: Path) -> None:
    # The first jail builds its root itself; the next ones take a tree the helper built
    # in its user namespace meanwhile (no network namespace spares: it cannot setns back).
    script = ("cat /proc/self/mountinfo | awk '{print $5, $6, $9}' | sort; ls -la /dev | awk '{print $1, $NF}'; "
              "touch /usr/x /etc/x /dev/x /x 2>&1 | wc -l; stat -c %s /etc/shadow; ls /sys/class/net")
    result = run_rootless(base, script, runs=3)
    stdouts = result["stdouts"]
    assert isinstance(stdouts, list) and stdouts[0] == stdouts[1] == stdouts[2]
    assert "\n4\n0\nlo\n" in stdouts[0]


def test_rootless_timeout_kills_the_jail(base: Path) -> None:
    result = run_rootless(base, "(setsid sleep 50 &); sleep 50", timeout_ms=500)
    assert (result["timed_out"], result["signal"], result["exit_code"]) == (True, "SIGKILL", None)
    leftovers = subprocess.run(["ps", "-o", "pid,ppid,stat,cmd", "-u", str(USER)], capture_output=True, check=False)
    assert leftovers.stdout.count(b"\n") == 1, leftovers.stdout  # the header only


def test_the_rootless_jail_is_built_by_the_launcher(base: Path) -> None:
    """A rootless helper builds the root tree detached too, so ccw-jail forks the init (not a Python fork)."""
    result = run_rootless(base, "tr '\\0' ' ' < /proc/1/cmdline; echo; echo $$", runs=2)
    assert result["direct_pidns"] is False
    for stdout in result["stdouts"]:  # type: ignore[attr-defined]
        init, shell = stdout.split("\n")[:2]
        assert init.strip() == "ccw-jail" and shell == "2", stdout
