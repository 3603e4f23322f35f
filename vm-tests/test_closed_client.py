"""A client of the state dir's front end that closes with its exec running: the exec ends.

``ccw capsule exec`` interrupted (Ctrl-C) closes its connection to frontend.sock while
its ``sleep 1000`` runs.  The front end tells that close from a half-close (POLLHUP) and
cancels the call at once, so the jail ends and the capsule's turn passes on, even for a
client that asked for no progress reports (whose call writes nothing until it ends, so a
failing write never came to say the client was gone).  A client that closes with reports
unread resets the connection; that ends its call the same way, and not the front end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_server.frontdoor import owner_of
from tests.support.shell_session import CCW, ROOT, capsule_busy, ccw_env

WAIT_S = 60.0  # the longest the jail may take to end on a loaded machine, never a timing check


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    """A state dir whose detached helper and front end are stopped at the end."""
    state_dir = tmp_path / "state"
    yield state_dir
    subprocess.run([*CCW, "helper", "stop"], capture_output=True, env=ccw_env(state_dir), cwd=ROOT, timeout=60)


def _capsule(state: Path, tmp_path: Path) -> str:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    done = subprocess.run([*CCW, "capsule", "create", str(workspace)], capture_output=True, text=True,
                          env=ccw_env(state), cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _wait(state: Path, capsule_id: str, busy: bool, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while capsule_busy(state, capsule_id) != busy:
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


class _Client:
    """A raw MCP client on frontend.sock that calls capsule_exec and may close at any point."""

    def __init__(self, state: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(state / "frontend.sock"))
        self.lines = self.sock.makefile("rb")
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert b'"result"' in self.lines.readline()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, object]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def exec(self, capsule_id: str, argv: list[str], progress: bool) -> None:
        meta = {"progressToken": 1} if progress else {}
        self.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "capsule_exec", "arguments": {"capsule_id": capsule_id, "cmd": argv, "wait_ms": None},
            "_meta": meta}})

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


def test_an_exec_ends_with_its_client_that_asked_for_no_progress(state: Path, tmp_path: Path) -> None:
    capsule_id = _capsule(state, tmp_path)
    client = _Client(state)
    client.exec(capsule_id, ["sleep", "1000"], progress=False)
    _wait(state, capsule_id, True, "the exec never started")
    client.close()
    _wait(state, capsule_id, False, "the jail outlived its client, which had closed")
    done = subprocess.run([*CCW, "capsule", "exec", capsule_id, "--", "echo", "next"], capture_output=True,
                          text=True, env=ccw_env(state), cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout == "next\n", done.stderr  # the turn passed on


def test_a_client_that_closes_with_reports_unread_ends_its_exec_not_the_front_end(state: Path,
                                                                                  tmp_path: Path) -> None:
    capsule_id = _capsule(state, tmp_path)
    owner = owner_of(str(state))
    assert owner is not None
    client = _Client(state)
    client.exec(capsule_id, ["sleep", "1000"], progress=True)
    assert b"notifications/progress" in client.lines.readline()  # running; the next report is left unread
    client.sock.settimeout(WAIT_S)
    assert client.sock.recv(1, socket.MSG_PEEK)  # a report waits in our socket
    client.close()  # with bytes unread: the front end's read fails with ECONNRESET
    _wait(state, capsule_id, False, "the jail outlived its client, which had closed")
    after = owner_of(str(state))
    assert after is not None and after["pid"] == owner["pid"]  # the same front end serves on
    os.kill(owner["pid"], 0)
