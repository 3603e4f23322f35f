"""``ccw capsule shell``: a person's terminal in a capsule, driven through a real pty.

As root (privileged helper) and as an unprivileged user (rootless helper): typed
commands answer, the window size follows the outer terminal, job control works, Ctrl-C
ends the foreground ``sleep`` and not the shell, ``exit 7`` is ccw's exit status, and a
file written in the shell shows in ``ccw capsule diff`` and in the journal's row for the
run (argv, exit, touched).  At the protocol level the helper refuses any descriptor but
a read-write pty slave of the caller's own for an exec on a terminal: a directory (the
classic way out of a mount namespace), a pipe, an O_PATH or read-only slave, another
user's pty, or none; and a descriptor sent with any other request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, ListRequest
from tests.support import SUPPORT_DIR
from tests.support.netfixtures import HttpLoopback
from tests.support.raw_mcp import RawStdio, structured
from tests.support.shell_session import CCW, ROOT, ShellSession, capsule_busy, ccw_env, scenario
from tests.support.users import run_script_as


def ccw(state: Path, *argv: str) -> str:
    done = subprocess.run([*CCW, *argv], capture_output=True, text=True, env=ccw_env(state), cwd=ROOT, timeout=120)
    assert done.returncode == 0, f"ccw {argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    """A state dir whose detached helper is stopped at the end."""
    state_dir = tmp_path / "state"
    yield state_dir
    subprocess.run([*CCW, "helper", "stop"], capture_output=True, env=ccw_env(state_dir), cwd=ROOT, timeout=60)


def _check_session(seen: dict[str, object]) -> None:
    assert seen["answer"] == "42"
    assert seen["tty"] == "/dev/console"
    assert seen["size"] == "24 80" and seen["resized"] == "40 100"
    assert seen["jobs"] == "Running" and seen["no_job_control"] is False
    assert seen["after_ctrl_c"] == "130"  # SIGINT ended the sleep; the shell answered after it
    assert seen["exit_status"] == 7
    assert seen["tiocsti"] == "1"  # EPERM: the session cannot type into its own terminal either


def test_shell_session_as_root(state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "seed.txt").write_text("seed-content\n")
    capsule_id = ccw(state, "capsule", "create", str(workspace)).strip()
    _check_session(scenario(state, capsule_id))
    assert "+from-shell" in ccw(state, "capsule", "diff", capsule_id)
    assert not (workspace / "shell.txt").exists()  # the live tree is untouched
    row = Journal(State(str(state))).execs(capsule_id)[-1]
    assert row["argv"] == ["/bin/bash", "-i"] and row["exit_code"] == 7 and row["signal"] is None
    # Rootless, the read set is null (fanotify needs CAP_SYS_ADMIN in the initial user
    # namespace); the written one comes from the upper dir as well.
    assert "shell.txt" in row["touched"]["written"]
    assert "seed.txt" in row["touched"]["read"]  # traced like any run
    assert row["stdout_bytes"] == 0 and row["stderr_bytes"] == 0  # the output went to the terminal
    assert row["terminal"] is True
    shown = ccw(state, "capsule", "show", capsule_id, str(row["seq"]))
    assert "an interactive session" in shown and "shell.txt" in shown
    # What was typed is not kept: a witness, which a replay must repeat, says so.
    refused = subprocess.run([*CCW, "capsule", "witness", capsule_id], capture_output=True, text=True,
                             env=ccw_env(state), cwd=ROOT, timeout=120)
    assert refused.returncode == 1 and "UNSUPPORTED" in refused.stderr and "terminal" in refused.stderr
    # As the refusal says: a fork starts from the session's files with no session of its own.
    fork = ccw(state, "capsule", "fork", capsule_id).strip()
    assert fork.startswith("cap_") and fork != capsule_id
    assert ccw(state, "capsule", "exec", fork, "--", "cat", "shell.txt").strip() == "from-shell"
    witness_id = ccw(state, "capsule", "witness", fork).split()[0]
    assert witness_id.startswith("wit_")


def test_shell_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    workspace, scratch = home / "ws", home / "scratch"
    for directory in (workspace, scratch):
        directory.mkdir()
        os.chown(directory, uid, gid)
    (workspace / "seed.txt").write_text("seed-content\n")
    out = run_script_as(uid, gid, [sys.executable, str(SUPPORT_DIR / "shell_session.py"), str(scratch / "state"),
                                   str(workspace)], home)
    assert out["mode"] == "rootless"
    _check_session(out)
    assert "+from-shell" in out["diff"]
    row = out["journal"][-1]
    assert row["argv"] == ["/bin/bash", "-i"] and row["exit_code"] == 7
    # Rootless, the read set is null (fanotify needs CAP_SYS_ADMIN in the initial user
    # namespace); the written one comes from the upper dir as well.
    assert "shell.txt" in row["touched"]["written"]


def _refusal(state: Path, capsule_id: str, fd: int | None) -> CcwError:
    """The helper's answer to an exec on the terminal ``fd`` (None: none sent) that would list the fd's target."""
    socket_path = str(state / "helper" / "helper.sock")

    async def ask() -> CcwError:
        client = HelperClient(socket_path)
        try:
            await client.call(ExecRequest(capsule_id, ("sh", "-c", "ls /proc/self/fd/0/ >&2"), cwd=None,
                                          stdio="tty", tty_fd=fd))
        except CcwError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError(f"the helper ran an exec on descriptor {fd}")

    return trio.run(ask)


def test_only_a_pty_slave_of_the_callers_own_is_taken(state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    capsule_id = ccw(state, "capsule", "create", str(workspace)).strip()
    master, slave = os.openpty()
    pipe_r, pipe_w = os.pipe()
    opened = [master, slave, pipe_r, pipe_w]
    try:
        slave_path = os.ttyname(slave)
        opened += [os.open("/", os.O_RDONLY | os.O_DIRECTORY), os.open(slave_path, os.O_PATH),
                   os.open(slave_path, os.O_RDONLY | os.O_NOCTTY)]
        for fd in (opened[4], pipe_r, opened[5], opened[6], master):
            refused = _refusal(state, capsule_id, fd)
            assert refused.code == "INVALID_ARGUMENT", (fd, refused)
        assert _refusal(state, capsule_id, None).code == "INVALID_ARGUMENT"
        os.chown(slave_path, 4242, -1)  # another user's terminal
        assert "belongs to uid 4242" in _refusal(state, capsule_id, slave).message
    finally:
        for fd in opened:
            os.close(fd)

    async def list_with_a_descriptor() -> CcwError:
        client = HelperClient(str(state / "helper" / "helper.sock"))
        try:
            await client._round_trip("list", ListRequest().to_args(), None, [0])
        except CcwError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("list took a descriptor")

    assert trio.run(list_with_a_descriptor).code == "INVALID_ARGUMENT"
    assert json.loads(ccw(state, "capsule", "list", "--json"))["capsules"][0]["execs"] == 0  # nothing ran


def test_a_shell_waits_for_the_running_command(state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    capsule_id = ccw(state, "capsule", "create", str(workspace)).strip()
    running = subprocess.Popen([*CCW, "capsule", "exec", capsule_id, "--", "sleep", "1000"], env=ccw_env(state),
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not capsule_busy(state, capsule_id):
            assert time.monotonic() < deadline and running.poll() is None, "the exec never started"
            time.sleep(0.1)
        shell = ShellSession(state, capsule_id, "--", "/bin/sh", "-c", "echo turn-$((3*4)); exit 3")
        shell.expect(r"running another command; waiting for its turn")
        running.send_signal(signal.SIGINT)  # the other caller gives up: its jail ends, the capsule is free
        shell.expect(r"turn-12")
        assert shell.wait() == 3
        assert shell.shown.count(b"waiting for its turn") == 1  # said once
    finally:
        running.kill()
        running.wait()
    rows = Journal(State(str(state))).execs(capsule_id)
    assert rows[-1]["argv"] == ["/bin/sh", "-c", "echo turn-$((3*4)); exit 3"] and rows[-1]["exit_code"] == 3


def test_a_shell_on_no_capsule_says_so_on_the_terminal(state: Path) -> None:
    """The refusal as a sentence and exit 1, not a traceback (the window-size follower runs
    beside the call, and the error once came out of that nursery wrapped in a group)."""
    shell = ShellSession(state, "cap_nope", "--", "/bin/true")
    shell.expect(r"ccw: NOT_FOUND: capsule cap_nope not found")
    assert shell.wait() == 1
    assert b"Traceback" not in shell.shown and b"ExceptionGroup" not in shell.shown


def test_a_session_ends_with_its_terminal(state: Path, tmp_path: Path) -> None:
    """ccw killed outright: the command ignores the pty's hangup, yet the helper ends the jail
    (its next progress report finds the caller gone) and the capsule is free again."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    capsule_id = ccw(state, "capsule", "create", str(workspace)).strip()
    shell = ShellSession(state, capsule_id, "--", "/bin/sh", "-c", "trap '' HUP; echo ready-$((1+1)); exec sleep 1000")
    shell.expect(r"ready-2")
    assert capsule_busy(state, capsule_id)
    shell.process.kill()
    shell.wait()
    deadline = time.monotonic() + 60
    while capsule_busy(state, capsule_id):
        assert time.monotonic() < deadline, "the jail outlived its caller"
        time.sleep(0.2)


# Through the jail's HTTP proxy (NO_PROXY names 127.0.0.1, so urllib would not use it).
FETCH = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=20) as s:
    s.sendall(f"GET http://127.0.0.1:{sys.argv[1]}/ HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    print("got", s.recv(4096).split(b"\r\n")[0].decode().replace(" ", "-"))
"""


def test_a_shell_takes_its_turn_in_the_agents_front_end(state: Path, tmp_path: Path) -> None:
    """An agent's ccw-mcp owns the state dir: a shell on its "egress" capsule waits in that
    server's queue behind the agent's running command (no front end of its own, no
    CONFLICT), and its connection is recorded once, by that server, in the shell's run."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state.mkdir()
    with HttpLoopback(held=True) as loopback, RawStdio(state, "capsule", tasks=None) as agent:
        made = agent.call("capsule_create", {"workspace": str(workspace), "auto_expose": False,
                                             "network": {"allow": [f"127.0.0.1:{loopback.port}"]}})
        capsule_id = structured(made)["capsule_id"]
        fetch = ["python3", "-c", FETCH, str(loopback.port)]
        answers: list[dict[str, object]] = []
        running = threading.Thread(target=lambda: answers.append(agent.call(
            "capsule_exec", {"capsule_id": capsule_id, "cmd": fetch})))
        running.start()
        deadline = time.monotonic() + 60
        while loopback.accepted < 1:  # the agent's command is running: its fetch is held
            assert time.monotonic() < deadline, "the agent's command never connected"
            time.sleep(0.05)
        shell = ShellSession(state, capsule_id, "--", *fetch)
        shell.expect(r"running another command; waiting for its turn")
        loopback.release.set()
        running.join(60)
        shell.expect(r"got HTTP/1.0-200")
        assert shell.wait() == 0
        assert structured(answers[0])["exit_code"] == 0
        assert loopback.accepted == 2
    log = EventLog(State(str(state)))
    seen = log.since(0, capsule_id)
    connections = [e.data for e in seen if e.kind == "net.connection"]
    assert len([c for c in connections if not c.get("live")]) == 2  # each recorded once in its run
    assert len([c for c in connections if c.get("live")]) == 2  # and told once while it ran
    assert [e.kind for e in seen].count("run.queued") == 1  # the shell's call, in the agent's server's queue
    finished = [e.data for e in seen if e.kind == "run.finished"]
    assert [f["connections"] for f in finished] == [1, 1]
    rows = Journal(State(str(state))).execs(capsule_id)
    assert [row["terminal"] for row in rows] == [False, True]
    (record,) = rows[-1]["touched"]["network"]  # the shell's own connection, in the shell's run
    assert (record["port"], record["allowed"]) == (loopback.port, True)
    assert not (state / "frontend.log").exists()  # no daemon started beside the agent's server
