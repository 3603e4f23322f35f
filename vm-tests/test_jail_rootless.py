"""The jail run by a rootless helper: an unprivileged uid that is root only in its own user namespace,
whose command gets that uid back in a user namespace of its own.

The test starts a Python child as root, which imports ccw, drops to an unused uid (no
passwd entry needed), unshares a user and mount namespace mapping that uid to 0 (what
``unshare -Urm`` does), and then calls ``supervise.run`` like the helper would.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.rootless_jail import USER, run_rootless


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
    assert lines[:5] == [str(USER), "ccw", "/srv/project", "hi", "1"]  # its own uid, not the namespace's 0
    assert int(lines[5]) < 10
    assert lines[6:] == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "usr-ro", "end"]
    assert (base / "merged" / "made.txt").read_text() == "w\n"
    assert (base / "tmp" / "t").stat().st_uid == USER


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
