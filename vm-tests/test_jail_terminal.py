"""An exec on a terminal can name it: the caller's pty slave is the jail's /dev/console.

Through a real helper (as root, and a rootless one started by an unprivileged user), an
exec with ``stdio: "tty"`` on a pty the test opens runs a probe in the jail: ``tty``
(glibc's ttyname) answers /dev/console, ``test -t 0`` holds, /dev/tty opens the
controlling terminal, and /dev/console is the very inode of the slave, read-only (chmod
by that name is refused; the host's node keeps its mode).  A second pty the test opens
on the host is reachable by no path in the jail: every character device the jail can
see (all of it but /proc and /sys, by lstat, with the host's /usr/bin/python3) is listed
and none is that pty, nor is /dev/console anything but the terminal.  \
Run as a script, this file is the session (it prints one
JSON object).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


from mcp_server.config import Config  # noqa: E402
from mcp_server.launcher import connect_or_spawn  # noqa: E402
from sandbox.ops import ExecRequest  # noqa: E402
from tests.support.users import run_script_as  # noqa: E402

# What the jail runs on the terminal: one "key value" line per finding.
PROBE = r"""
echo "name $(tty)"
if test -t 0; then echo "stdin_tty yes"; fi
if exec 3<>/dev/tty; then echo "dev_tty opened" >&3; fi
echo "chmod $(chmod 0666 /dev/console 2>&1)"
/usr/bin/python3 -c '
import os, stat
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [name for name in dirs if name not in ("proc", "sys")]
    for name in dirs + files:
        path = os.path.join(top, name)
        found = os.lstat(path)  # a bind onto a file shows its source here, never in readdir
        if stat.S_ISCHR(found.st_mode):
            print("node", f"{found.st_dev}:{found.st_ino}", path)
'
echo "done probing"
"""


def session(state: str, workspace: str) -> dict[str, Any]:
    """Run ``PROBE`` on a pty of ours through the state dir's helper; what it showed and the ptys' identities."""
    master, slave = os.openpty()
    mode_before = stat.S_IMODE(os.fstat(slave).st_mode)
    other_master, other_slave = os.openpty()  # another terminal of the host's: no way to it may exist
    shown: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave has closed it
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read_terminal)
    reader.start()

    async def run() -> dict[str, Any]:
        client = await connect_or_spawn(Config(state_dir=state))
        try:
            mode = (await client.hello())["mode"]
            capsule_id = (await client.request("create", {"workspace": workspace}))["capsule_id"]
            reply = await client.call(ExecRequest(capsule_id, ("/bin/sh", "-c", PROBE), stdio="tty", tty_fd=slave))
            await client.request("destroy", {"capsule_id": capsule_id})
        finally:
            await client.aclose()
        return {"mode": mode, "exit_code": reply.exit_code}

    try:
        out = trio.run(run)
        ours, other = os.fstat(slave), os.fstat(other_slave)
    finally:
        os.close(slave)
        reader.join()
        for fd in (master, other_master, other_slave):
            os.close(fd)
    out["terminal"] = f"{ours.st_dev}:{ours.st_ino}"
    out["terminal_modes"] = [mode_before, stat.S_IMODE(ours.st_mode)]
    out["other"] = f"{other.st_dev}:{other.st_ino}"
    out["shown"] = b"".join(shown).decode(errors="replace").replace("\r\n", "\n")
    return out


def _findings(out: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The probe's ``key value`` lines, and its char devices as {path: "dev:ino"}."""
    found, nodes = {}, {}
    for line in out["shown"].splitlines():
        key, _, value = line.partition(" ")
        if key == "node":
            identity, _, path = value.partition(" ")
            nodes[path] = identity
        else:
            found[key] = value
    return found, nodes


def check_terminal_named(out: dict[str, Any]) -> None:
    """What every jail on a terminal must show (see the module docstring)."""
    found, nodes = _findings(out)
    assert out["exit_code"] == 0 and "probing" in found.get("done", ""), out["shown"]
    assert found["name"] == "/dev/console", out["shown"]
    assert found["stdin_tty"] == "yes"
    assert found["dev_tty"] == "opened"
    assert found["chmod"].endswith("Read-only file system"), found["chmod"]
    assert out["terminal_modes"][0] == out["terminal_modes"][1]
    assert nodes["/dev/console"] == out["terminal"]
    assert nodes["/dev/null"] != out["terminal"]  # the listing holds the other devices too
    assert out["other"] not in nodes.values(), nodes
    assert [path for path, identity in nodes.items() if identity == out["terminal"]] == ["/dev/console"]


def _workspace(base: Path, uid: int = 0, gid: int = 0) -> Path:
    workspace = base / "ws"
    workspace.mkdir()
    (workspace / "seed.txt").write_text("seed\n")
    for path in (workspace, workspace / "seed.txt"):
        os.chown(path, uid, gid)
    return workspace


@pytest.fixture
def python3(require: Callable[[bool, str], None]) -> None:
    """The probe lists the jail's devices with the host's system python (its /usr is the jail's)."""
    require(os.path.exists("/usr/bin/python3"), "the probe needs /usr/bin/python3")


def test_the_terminal_is_named_in_a_root_jail(tmp_path: Path, root_required: None, python3: None) -> None:
    done = subprocess.run([sys.executable, __file__, str(tmp_path / "state"), str(_workspace(tmp_path))],
                          capture_output=True, timeout=240, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr.decode()[-6000:]
    out = json.loads(done.stdout.decode().splitlines()[-1])
    assert out["mode"] == "privileged"
    check_terminal_named(out)


def test_the_terminal_is_named_by_a_rootless_helper(user_dir: tuple[int, int, Path], python3: None) -> None:
    uid, gid, home = user_dir
    scratch = home / "scratch"
    scratch.mkdir()
    os.chown(scratch, uid, gid)
    out = run_script_as(uid, gid, [sys.executable, __file__, str(scratch / "state"), str(_workspace(home, uid, gid))],
                        home)
    assert out["mode"] == "rootless"
    check_terminal_named(out)


if __name__ == "__main__":
    print(json.dumps(session(sys.argv[1], sys.argv[2])))
