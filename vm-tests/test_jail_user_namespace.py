"""A rootless helper's command runs as the user's own uid and gid, not as root of the helper's namespace.

A user made for the test runs ``ccw`` (its helper rootless: a user namespace mapping the user
to 0), and an exec in a capsule probes who it is: ``id``, a test that skips for root, its
capabilities, ``unshare -r`` and ``mount(2)``, files it makes in the workspace, /tmp and
$HOME.  Before the jail gave the command a user namespace of its own (steps.c
``enter_user``), ``id -u`` said 0 and the root-only skip skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.users import run_script_as

ROOT = Path(__file__).resolve().parent.parent

RUN = r"""
set -e
export PATH="$2:/usr/bin:/bin" HOME="$1" CCW_STATE_DIR="$1/state" LANG=C.UTF-8
cd "$1/ws"
CAP=$(ccw capsule create .)
ccw capsule exec --json "$CAP" -- sh probe.sh >"$1/exec.json"
ccw capsule promote --json "$CAP" >"$1/promote.json"
ccw capsule destroy "$CAP" >/dev/null
ccw helper stop >/dev/null
echo '{}'
"""

PROBE = r"""
id -u; id -g
python3 -m unittest test_root_only 2>&1 | tail -n 1
grep CapEff /proc/self/status
unshare -r true 2>/dev/null && echo unshare-allowed || echo unshare-refused
python3 -c "import ctypes; print(ctypes.CDLL(None, use_errno=True).mount(b'none', b'/mnt', b'tmpfs', 0, None))"
echo made >made.txt
touch /tmp/t "$HOME/h"
stat -c '%u %g' made.txt /tmp/t "$HOME/h"
"""

ROOT_ONLY = """import os
import unittest


class RootOnly(unittest.TestCase):
    @unittest.skipIf(os.getuid() == 0, "does not hold for root")
    def test_runs_for_a_user(self):
        self.assertNotEqual(os.geteuid(), 0)
"""


def test_a_rootless_capsules_command_is_the_user(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws = home / "ws"
    ws.mkdir()
    (ws / "probe.sh").write_text(PROBE)
    (ws / "test_root_only.py").write_text(ROOT_ONLY)
    (home / "run.sh").write_text(RUN)
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(home)], check=True)
    run_script_as(uid, gid, ["bash", str(home / "run.sh"), str(home), str(ROOT / ".venv" / "bin")], home)
    ran = json.loads((home / "exec.json").read_text())
    assert ran["exit_code"] == 0, ran
    lines = ran["stdout"].splitlines()
    assert lines[:2] == [str(uid), str(gid)], ran
    assert lines[2] == "OK", ran  # the test ran: not "OK (skipped=1)", as it was for uid 0
    assert lines[3] == "CapEff:\t0000000000000000"
    assert lines[4:6] == ["unshare-refused", "-1"], ran  # no new user namespace, no mount
    # What the command made is the user's, inside and on the host: the workspace (promoted), /tmp, $HOME.
    assert lines[6:] == [f"{uid} {gid}"] * 3, ran
    promoted = json.loads((home / "promote.json").read_text())
    assert promoted["promoted"] is True, promoted
    made = os.stat(ws / "made.txt")
    assert (made.st_uid, made.st_gid) == (uid, gid) and (ws / "made.txt").read_text() == "made\n"
