"""A witness made by one user and replayed by another on the same host, through the real ``ccw``.

User A makes a capsule of a project in A's home (a home others may search, as on many
hosts), runs a command, writes a witness with its base, and gives out its public key; user
B trusts that key and replays the witness.  The replay shows the base at the recorded
path, which lies in A's home and which B may read but not write: a capsule with a base
reads nothing there and writes nothing there (sandbox/hostdirs.py), so B's replay runs
(before: PERMISSION_DENIED, "may not write").  B's own capsule over A's project with a
base B made is allowed too, and its promotion is refused there by the kernel, since
promotion writes as B: A's project stays as it was.  Each user's rootless helper is its
own, started by its first command and stopped by its last.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.users import as_user

ROOT = Path(__file__).resolve().parent.parent
CCW = shlex.join([sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"])

MAKE = f"""
set -e
ccw() {{ {CCW} "$@"; }}
cd "$HOME/src/proj"
CAP=$(ccw capsule create .)
ccw capsule exec "$CAP" -- sh -c 'cat calc.txt > out.txt; echo made >> out.txt' >/dev/null
ccw capsule witness --json "$CAP" > "$HOME/witness.json"
ccw witness keys --public > "$HOME/key.pub"
ccw capsule destroy "$CAP" >/dev/null
ccw helper stop >/dev/null
"""

REPLAY = f"""
ccw() {{ {CCW} "$@"; }}
cd "$HOME"
ccw witness trust "$1/key.pub" --name maker >/dev/null || exit 9
ccw capsule replay --json "$1/w.tar.zst" > "$HOME/replay.json" 2> "$HOME/replay.err"
echo $? > "$HOME/replay.rc"
mkdir "$HOME/snapshot" && cp "$2/calc.txt" "$HOME/snapshot/"
CAP=$(ccw capsule create --base "$HOME/snapshot" "$2" 2> "$HOME/create.err")
echo "$CAP" > "$HOME/create.out"
ccw capsule exec "$CAP" -- sh -c 'echo B > b.txt' >/dev/null
ccw capsule promote --json "$CAP" > "$HOME/promote.json" 2> "$HOME/promote.err"
echo $? > "$HOME/promote.rc"
ccw helper stop >/dev/null
"""


@pytest.fixture
def login_users(root_required: None, require: Callable[[bool, str], None]) -> Iterator[list[pwd.struct_passwd]]:
    """Two login users with homes (0755, searchable by the other), deleted with their homes after the test."""
    for tool in ("useradd", "userdel", "setpriv", "unshare"):
        require(shutil.which(tool) is not None, f"needs {tool}")
    names = [f"ccwwu{secrets.token_hex(3)}" for _ in range(2)]
    made: list[str] = []
    try:
        for name in names:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
            made.append(name)
            os.chmod(pwd.getpwnam(name).pw_dir, 0o755)
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in made:
            subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)


def _run(user: pwd.struct_passwd, script: str, *args: str) -> None:
    """``script`` in bash as ``user`` with a login-like environment; it must exit 0."""
    keep: list[str] = []
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT),
           "CCW_STATE_DIR": f"{user.pw_dir}/.ccw-state"}
    try:
        done = subprocess.run(as_user(user.pw_uid, user.pw_gid, ["bash", "-c", script, "script", *args], keep),
                              cwd="/", env=env, capture_output=True, text=True, timeout=300)
    finally:
        for directory in keep:
            os.rmdir(directory)
    assert done.returncode == 0, done.stdout + done.stderr


def test_another_user_replays_a_trusted_witness_of_a_project_in_the_makers_home(
        login_users: list[pwd.struct_passwd]) -> None:
    maker, replayer = login_users
    project = Path(maker.pw_dir) / "src" / "proj"
    project.mkdir(parents=True)
    (project / "calc.txt").write_text("2 + 3\n")
    for path in (project.parent, project, project / "calc.txt"):
        os.chown(path, maker.pw_uid, maker.pw_gid)
    _run(maker, MAKE)
    witness = json.loads((Path(maker.pw_dir) / "witness.json").read_text())
    assert witness["base"]["files"] >= 1, witness  # it carries its base
    given = Path(tempfile.mkdtemp(prefix="ccw-witness-users-"))
    try:
        given.chmod(0o755)
        shutil.copy(witness["path"], given / "w.tar.zst")
        shutil.copy(Path(maker.pw_dir) / "key.pub", given / "key.pub")
        for path in given.iterdir():
            path.chmod(0o644)
        _run(replayer, REPLAY, str(given), str(project))
    finally:
        shutil.rmtree(given)
    home = Path(replayer.pw_dir)
    assert (home / "replay.rc").read_text() == "0\n", (home / "replay.err").read_text()
    replayed = json.loads((home / "replay.json").read_text())
    assert replayed["replay_ok"] is True and replayed["signature"] == "valid", replayed
    # A capsule of B's own with a base, shown at A's project: made, but never promoted there.
    assert (home / "create.out").read_text().startswith("cap_"), (home / "create.err").read_text()
    assert (home / "promote.rc").read_text() != "0\n", (home / "promote.json").read_text()
    refused = (home / "promote.err").read_text()
    assert "PERMISSION_DENIED: promote: write" in refused and "EACCES" in refused, refused
    assert sorted(p.name for p in project.iterdir()) == ["calc.txt"]
