"""What vm-tests/test_branch_realproject.py shares with the script it runs as an unprivileged
user: the flaskr edits, the tree snapshot, and the ``ccw capsule branch`` session itself."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tests.support import realprojects
from tests.support.cli_process import ccw

ROUTE_OLD = '    @app.route("/hello")'
ROUTE_NEW = '    @app.route("/ping")\n    def ping():\n        return "pong"\n\n    @app.route("/hello")'
NEW_TEST = 'def test_ping(client):\n    assert client.get("/ping").data == b"pong"\n'
REPLACE = ("import sys; p, old, new = sys.argv[1:]; t = open(p).read(); assert old in t, old; "
           "open(p, 'w').write(t.replace(old, new, 1))")
WRITE = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"


def edits(python: str) -> list[list[str]]:
    """A route added to flaskr/__init__.py, a test of it, then the project's suite."""
    return [[python, "-c", REPLACE, "flaskr/__init__.py", ROUTE_OLD, ROUTE_NEW],
            [python, "-c", WRITE, "tests/test_ping.py", NEW_TEST], list(realprojects.FLASKR.test_cmd)]


def snapshot(ws: Path) -> dict[str, str]:
    """``git status --porcelain``, the index file's bytes (hashed) and a hash of every file of the tree."""
    digest = hashlib.sha256()
    for path in sorted(p for p in ws.rglob("*") if p.relative_to(ws).parts[0] != ".git"):
        digest.update(path.relative_to(ws).as_posix().encode() + b"\0")
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return {"status": realprojects.git(ws, "status", "--porcelain"), "tree": digest.hexdigest(),
            "index": hashlib.sha256((ws / ".git" / "index").read_bytes()).hexdigest()}


def _done(proc: Any) -> dict[str, Any]:
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def cli_session(state: Path, ws: Path) -> dict[str, Any]:
    """``ccw capsule create``, the edits by ``exec``, then ``branch`` twice (the second refused);
    the snapshots around the first, and the helper's mode.

    The user's PATH is the system's: the one this script inherits is root's, and
    capsule_create would expose its /root/.pyenv/bin (a PATH entry), which the user
    cannot search."""
    os.environ["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    try:
        cap = ccw(state, "capsule", "create", str(ws)).stdout.strip()
        for argv in edits(".venv/bin/python"):
            ccw(state, "capsule", "exec", cap, "--", *argv, timeout=300)
        before = snapshot(ws)
        made = ccw(state, "capsule", "branch", cap, "ccw/ping", check=False, timeout=300)
        after = snapshot(ws)
        again = ccw(state, "capsule", "branch", cap, "ccw/ping", check=False, timeout=300)
        mode = json.loads(ccw(state, "helper", "status", "--json").stdout)["mode"]
    finally:  # the detached helper and front end end with the session, whatever happened
        ccw(state, "helper", "stop", check=False)
    return {"made": _done(made), "again": _done(again), "before": before, "after": after, "mode": mode}
