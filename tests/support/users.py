"""Running Python as another user, for the tests that need one (another uid, a rootless helper).

The interpreter may live under a directory other users cannot traverse (here
/root/.pyenv behind /root, mode 0700), so ``as_user`` runs the command in a private
mount namespace where each such directory is covered by a tmpfs showing only the
entries needed, bound from the original; the host is not changed.  Then ``setpriv``
drops to the uid/gid.  The repository is made reachable too, so a script run this way
imports this tree's ``sandbox``, ``mcp_server`` and ``tests.support`` when it puts the
repository on its path.

``run_script_as`` runs a script to its end; ``UserScript`` runs one that stops at each
step until the test, which meanwhile looks at the host, lets it go on.

The fixtures here (``run_as``, ``public_dir``, ``user_dir``) are vm-tests/conftest.py's:
every vm-test can take them by name.  They need its ``root_required`` and ``require``.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import select
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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


class UserScript:
    """A script run as uid/gid (``as_user``) that a test talks to between its steps, for a
    test that must look at the host while a user's session is at a given point.

    The script prints one JSON object a line, to stdout, at each step; where it waits, it
    reads one line from stdin (``tests.support.users.step`` is its side).  Its stderr goes
    to a file, shown when it fails.  Use it as a context manager: at the end it is killed
    if still running."""

    def __init__(self, uid: int, gid: int, argv: list[str], cwd: Path) -> None:
        self._keep: list[str] = []
        self._stderr = Path(tempfile.mkdtemp(prefix="ccw-user-script-")) / "stderr"
        with open(self._stderr, "wb") as stderr:
            self.proc = subprocess.Popen(as_user(uid, gid, argv, self._keep), cwd=str(cwd), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=stderr,
                                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})

    def errors(self) -> str:
        """The tail of what it wrote to stderr so far."""
        return self._stderr.read_bytes().decode(errors="replace")[-6000:]

    def receive(self, timeout: float = 280) -> dict[str, Any]:
        """Its next step's object (AssertionError with its stderr if it ends or says nothing in time)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        assert line, f"the script ended or said nothing within {timeout:g} s:\n{self.errors()}"
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, answer: Any) -> None:
        """Let it go on past the step it waits at, handing it ``answer``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(answer).encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 120) -> None:
        """Wait for its end; it must exit 0."""
        assert self.proc.wait(timeout) == 0, self.errors()

    def __enter__(self) -> UserScript:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        shutil.rmtree(self._stderr.parent)
        for directory in self._keep:
            os.rmdir(directory)


def step(report: dict[str, Any], wait: bool = True) -> Any:
    """A ``UserScript``'s side: print ``report`` as its step and, with ``wait``, block until the
    test answers; the answer."""
    print(json.dumps(report), flush=True)
    return json.loads(sys.stdin.readline()) if wait else None


@pytest.fixture
def run_as(root_required: None, require: Callable[[bool, str], None]) -> Iterator[Callable[..., Any]]:
    """``run(uid, gid, script, *args, cwd="/")``: a Python script run as uid/gid, which must
    print exactly one JSON object; returns it."""
    require(shutil.which("setpriv") is not None and shutil.which("unshare") is not None,
            "needs setpriv and unshare (util-linux)")
    keep_dirs: list[str] = []

    def run(uid: int, gid: int, script: str, *args: str, cwd: str = "/") -> Any:
        argv = [sys.executable, "-c", script, *args]
        done = subprocess.run(as_user(uid, gid, argv, keep_dirs), cwd=cwd, capture_output=True, timeout=120,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
        assert done.returncode == 0, done.stderr.decode()
        lines = done.stdout.decode().splitlines()
        assert len(lines) == 1, done.stdout.decode() + done.stderr.decode()  # nothing else on stdout
        return json.loads(lines[0])

    yield run
    for keep in keep_dirs:
        os.rmdir(keep)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ccw-ipc-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def user_dir(root_required: None, require: Callable[[bool, str], None]) -> Iterator[tuple[int, int, Path]]:
    """A system user made for the test, and a directory it owns that everyone can traverse."""
    require(all(shutil.which(tool) for tool in ("useradd", "setpriv", "unshare")),
            "needs useradd, setpriv and unshare")
    name = f"ccwrp{secrets.token_hex(4)}"
    for attempt in range(10):  # other tests add users too: /etc/passwd's lock may be held a moment
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True, text=True, check=False)
        if made.returncode == 0:
            break
        time.sleep(0.2 * (attempt + 1))
    assert made.returncode == 0, made.stderr
    path = Path(tempfile.mkdtemp(prefix="ccw-realproj-", dir="/var/tmp"))
    try:
        entry = pwd.getpwnam(name)
        path.chmod(0o755)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        yield entry.pw_uid, entry.pw_gid, path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["userdel", name], check=True, capture_output=True)
