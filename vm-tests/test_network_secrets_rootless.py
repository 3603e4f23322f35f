"""A secret used by an unprivileged user's capsule, through the rootless helper (issue 38).

A user made for the test keeps a secret in its own state dir (``ccw secret set --stdin``, as
a person would) and runs its own ``ccw-mcp`` on stdio (its embedded helper rootless, its
ready file its own: ``mcp_process.agent_server_env``).  Its capsule's command sends a plain-HTTP
request carrying the placeholder to a server of the test's on the host's loopback: the
server gets the user's value, the capsule never holds it (not in its environment, its
processes, its files, its output), and neither do the user's workspace and state dir
beyond the store itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.users import run_script_as

HERE = Path(__file__).resolve().parent
VALUE = b"ghp_" + b"R00tle55" * 5  # 44 bytes

SCRIPT = r"""
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop, mcp_process

ws, state, port, value = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), bytes.fromhex(sys.argv[5])
env = mcp_process.agent_server_env(state, ws)
subprocess.run([str(agent_loop.CCW_MCP.parent / "ccw"), "secret", "set", "TOKEN", "--host", f"127.0.0.1:{port}",
                "--stdin"], input=value, env=env, check=True, capture_output=True)
REQUEST = ("import os, urllib.request; os.environ['no_proxy'] = os.environ['NO_PROXY'] = ''; "
           "req = urllib.request.Request('http://127.0.0.1:%d/whoami', headers={'Authorization': 'Bearer ' + "
           "os.environ['TOKEN']}); print(urllib.request.urlopen(req).read().decode())" % port)
# What a capsule can read of the value, searched from inside it (the value in hex: no argv holds it).
SEARCH = (
    "import os, sys; value = bytes.fromhex(sys.argv[1]); found = []\n"
    "def look(path):\n"
    " try:\n"
    "  with open(path, 'rb') as f:\n"
    "   found.extend([path] if value in f.read(1 << 24) else [])\n"
    " except OSError: pass\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    " look(f'/proc/{pid}/environ'); look(f'/proc/{pid}/cmdline')\n"
    "for top in ('/tmp', '.'):\n"
    " for folder, _, names in os.walk(top):\n"
    "  [look(os.path.join(folder, n)) for n in names if os.path.isfile(os.path.join(folder, n))]\n"
    "print(found)\n")

async def main():
    out = {}
    async with agent_loop.mcp_stdio(env) as call:
        cap = (await call("capsule_create", {"workspace": str(ws), "network": [f"127.0.0.1:{port}"],
                                             "secrets": ["TOKEN"]}))["capsule_id"]
        run = lambda cmd: call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 60000})
        out["placeholder"] = await run(["sh", "-c", "echo $TOKEN > token.txt; cat token.txt"])
        out["request"] = await run(["/usr/bin/python3", "-c", REQUEST])
        out["search"] = await run(["/usr/bin/python3", "-c", SEARCH, value.hex()])
        out["listed"] = await call("capsule_list", {})
        await call("capsule_destroy", {"capsule_id": cap})
    print(json.dumps(out))

try:
    trio.run(main)
except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
    raise agent_loop.leaf(group) from None
"""


class _Handler(BaseHTTPRequestHandler):
    """Answers whether the request's Authorization carried the value; keeps each request head."""

    heads: ClassVar[list[bytes]] = []

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.heads.append(f"{self.requestline}\r\n{self.headers}".encode())
        body = b"the value" if self.headers.get("Authorization") == f"Bearer {VALUE.decode()}" else b"no value"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(root_required: None) -> Iterator[ThreadingHTTPServer]:
    _Handler.heads = []
    running = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=running.serve_forever, daemon=True).start()
    yield running
    running.shutdown()
    running.server_close()


def _holding(root: Path, skip: str) -> list[str]:
    """The regular files under ``root`` (bar ``skip``, the store) whose data holds VALUE."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if name != skip and path.is_file() and not path.is_symlink() and VALUE in path.read_bytes():
                found.append(str(path))
    return found


def test_a_users_capsule_uses_its_secret_through_the_rootless_helper(
        user_dir: tuple[int, int, Path], server: ThreadingHTTPServer) -> None:
    uid, gid, home = user_dir
    ws, state = home / "ws", home / "state"
    ws.mkdir()
    state.mkdir(mode=0o700)
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(state)], check=True)
    argv = [sys.executable, "-c", SCRIPT, str(HERE.parent), str(ws), str(state), str(server.server_address[1]),
            VALUE.hex()]
    out = run_script_as(uid, gid, argv, home)
    placeholder = out["placeholder"]["stdout"].strip()
    assert placeholder.startswith("ccwph_") and len(placeholder) == len(VALUE), out["placeholder"]
    # The user's value went to the server in place of the placeholder, which the server never saw.
    assert out["request"]["stdout"] == "the value\n", out["request"]
    assert [r["allowed"] for r in out["request"]["touched"]["network"]] == [True]
    assert len(_Handler.heads) == 1 and placeholder.encode() not in _Handler.heads[0]
    # Nowhere in the capsule (its processes, /tmp, its tree) nor the user's files but the store.
    assert out["search"]["stdout"] == "[]\n", out["search"]
    assert VALUE.decode() not in repr(out)
    assert _holding(ws, "") == [] and _holding(state, "secrets.json") == []
    assert (state / "secrets.json").stat().st_uid == uid and (state / "secrets.json").stat().st_mode & 0o077 == 0
