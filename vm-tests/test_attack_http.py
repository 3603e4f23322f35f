"""Attack class 7 of issue 24: HTTP on loopback is not authentication.

A ccw-mcp running as root serves Streamable HTTP on 127.0.0.1 with no ``CCW_TOKENS_FILE``.
Any local user can reach that port, so before the fix one could read a root-only file
with ``read_text_file``, create root-owned files with ``file_create`` and capsules whose
jails run as uid 0.  Here another user (``nobody``, a child process that drops to its
uid; the system python, since the venv may not be readable by it) tries each of those,
plus ``initialize``, ``tools/list``, a direct method, and GET and DELETE on the MCP path,
with no token, a wrong one, an empty ``Bearer``, the real token in another case, cut
short, lengthened, split by a space, followed by junk, under another scheme or none.
Every attempt must be 401 with ``WWW-Authenticate: Bearer``, create nothing, and never
carry the secret file's text or the token.  The token file the server generated is
mode 0600, owned by root, and unreadable by that user although its directory is open
to all; and a symlink, a FIFO or someone else's file planted where it would go stops
the server instead of being followed or trusted.

A token that leaked is rotated away: nobody holds a session of the generated token open,
with its GET event stream, when its owner runs ``ccw http token rotate`` in another
process.  The running server must notice by itself, end that stream and the session, and
answer 401 to everything the old token tries after; the new token works, and the old
session is not handed to it either.  Before ``ccw http token rotate`` there was no such
command, and a server read its token file once, at start.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.mcp_process import ROOT, ServerProcess, server_env

NOBODY = 65534
SECRET = "root-only-" + secrets.token_hex(8)

# Runs as nobody with the system python, stdlib only: reads what it is told to try, sends
# each request on a fresh connection exactly as given (headers included), prints JSON.
ATTACKER = textwrap.dedent("""
    import errno, http.client, json, sys
    plan = json.load(sys.stdin)
    out = {"uid": __import__("os").getuid(), "files": {}, "answers": []}
    for path in plan["files"]:
        try:
            with open(path, "rb") as handle:
                out["files"][path] = handle.read().decode("latin-1")
        except OSError as exc:
            out["files"][path] = errno.errorcode.get(exc.errno, str(exc.errno))
    for request in plan["requests"]:
        conn = http.client.HTTPConnection(plan["host"], plan["port"], timeout=30)
        body = None if request["body"] is None else request["body"].encode()
        conn.request(request["method"], plan["path"], body=body, headers=request["headers"])
        answer = conn.getresponse()
        out["answers"].append({"status": answer.status, "body": answer.read().decode("utf-8", "replace"),
                               "headers": {k.lower(): v for k, v in answer.getheaders()}})
        conn.close()
    print(json.dumps(out))
""")


def _rpc(method: str, params: dict[str, Any] | None = None, request_id: int | None = 1) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if request_id is not None:
        message["id"] = request_id
    return json.dumps(message)


def _call(tool: str, args: dict[str, Any]) -> str:
    return _rpc("tools/call", {"name": tool, "arguments": args})


INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "attacker", "version": "0"}}


def authorizations(token: str) -> list[str | None]:
    """Every Authorization header the attacker tries: none, wrong, and near misses of the real one."""
    return [
        None, "Bearer wrong-token", "Bearer ", "Bearer", "Bearer " + token.swapcase(), "Bearer " + token.upper(),
        "Bearer " + token[:-1], "Bearer " + token + "A", "Bearer " + token[:20] + " " + token[20:],
        "Bearer " + token + " x", "Bearer\t" + token, token,
        "Basic " + base64.b64encode(f"local:{token}".encode()).decode(),
        "Bearer local",
    ]


class Arena:
    """A world-traversable directory: a root-only secret, a workspace, a state dir, a running server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.secret = root / "secret.txt"
        self.secret.write_text(SECRET + "\n")
        self.secret.chmod(0o600)
        self.ws = root / "ws"
        self.ws.mkdir(mode=0o755)
        (self.ws / "hello.txt").write_text("hello\n")
        # Open to everyone, so only the token file's own mode keeps the token from them.
        self.state = root / "state"
        self.state.mkdir(mode=0o755)
        self.state.chmod(0o755)
        self.token_file = self.state / "http-tokens.json"
        self.tried = 0

    def attack(self, url: str, requests: list[dict[str, Any]], files: list[Path]) -> dict[str, Any]:
        """Run ``requests`` and the file reads as nobody; the attacker's report."""
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        plan = {"host": host, "port": int(port), "path": "/mcp", "requests": requests,
                "files": [str(path) for path in files]}
        self.tried += len(requests) + len(files)
        done = subprocess.run(["/usr/bin/python3", "-I", "-c", ATTACKER], input=json.dumps(plan), capture_output=True,
                              text=True, timeout=300, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                              env={"PATH": "/usr/bin:/bin"}, check=False)
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        assert report["uid"] == NOBODY
        return report


@pytest.fixture
def arena(root_required: None, require: Callable[[bool, str], None]) -> Iterator[Arena]:
    require(os.path.exists("/usr/bin/python3"), "needs /usr/bin/python3 for the unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="ccw-attack-http-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        yield Arena(root)
    finally:
        shutil.rmtree(root)


def _requests(bodies: list[tuple[str, str | None]], token: str) -> list[dict[str, Any]]:
    out = []
    for authorization in authorizations(token):
        for method, body in bodies:
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
            if method == "GET":
                headers["accept"] = "text/event-stream"
            if method == "DELETE":
                headers["mcp-session-id"] = secrets.token_hex(16)
            if authorization is not None:
                headers["authorization"] = authorization
            out.append({"method": method, "body": body, "headers": headers})
    return out


def _all_refused(report: dict[str, Any], token: str, requests: list[dict[str, Any]]) -> None:
    for request, answer in zip(requests, report["answers"], strict=True):
        shown = (request["method"], request["body"], request["headers"].get("authorization"))
        assert answer["status"] == 401, (shown, answer)
        assert answer["headers"].get("www-authenticate", "").startswith("Bearer"), (shown, answer)
        assert SECRET not in answer["body"] and token not in answer["body"], shown
        assert token not in json.dumps(answer["headers"]), shown


def _cleanup(url: str, token: str) -> None:
    """Destroy any capsule an attempt made (none should exist), with the real token."""
    with httpx2.Client(timeout=60, headers={"authorization": f"Bearer {token}"}) as http:
        listed = http.post(url, content=_rpc("capsule_list", {}), headers={"content-type": "application/json"})
        for capsule in listed.json().get("result", {}).get("capsules", []):
            http.post(url, content=_rpc("capsule_destroy", {"capsule_id": capsule["capsule_id"]}),
                      headers={"content-type": "application/json"})


def test_another_local_user_gets_401_for_everything(arena: Arena, record_property: Any) -> None:
    server = ServerProcess(server_env(arena.root, MCP_ENDPOINT="http", CCW_STATE_DIR=str(arena.state),
                                      CCW_TOOLSETS="capsule,text,file,server", CCW_WORKSPACE=str(arena.root)))
    url = server.wait_ready()
    # Near misses are built from the real token.  Before the fix there was none: the
    # attempts then went out with made-up tokens, and succeeded.
    token = "x" * 43
    if arena.token_file.exists():
        token = json.loads(arena.token_file.read_text())["tokens"][0]["token"]
    try:
        reads = [("POST", _rpc("initialize", INIT, 0)), ("POST", _rpc("tools/list")),
                 ("POST", _call("read_text_file", {"path": "secret.txt"})),
                 ("POST", _rpc("read_text_file", {"path": "secret.txt"})), ("POST", _rpc("ccw_info", {})),
                 ("GET", None), ("DELETE", None)]
        requests = _requests(reads, token)
        report = arena.attack(url, requests, [arena.token_file, arena.secret])
        _all_refused(report, token, requests)
        assert report["files"] == {str(arena.token_file): "EACCES", str(arena.secret): "EACCES"}

        writes = [("POST", _rpc("file_create", {"path": "ws/pwned.txt", "content": "pwned"})),
                  ("POST", _call("file_create", {"path": "ws/pwned2.txt", "content": "pwned"})),
                  ("POST", _rpc("capsule_create", {"workspace": str(arena.ws)})),
                  ("POST", _call("capsule_create", {"workspace": str(arena.ws)}))]
        requests = _requests(writes, token)
        report = arena.attack(url, requests, [])
        _all_refused(report, token, requests)
        assert sorted(p.name for p in arena.ws.iterdir()) == ["hello.txt"]
        assert (not (arena.state / "helper" / "capsules").exists()
                or not any((arena.state / "helper" / "capsules").iterdir()))

        # The token file: the server's own, private, and what the refusals were about.
        info = os.lstat(arena.token_file)
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
        assert token not in server.log and SECRET not in server.log
        # The same calls with the token work: the refusals were about the token alone.
        with httpx2.Client(timeout=120, headers={"authorization": f"Bearer {token}"}) as http:
            for body in (reads[3][1], writes[0][1], writes[2][1]):
                legit = http.post(url, content=body, headers={"content-type": "application/json"})
                assert legit.status_code == 200 and "result" in legit.json(), legit.text
                if "secret.txt" in str(body):
                    assert SECRET in legit.text
        assert (arena.ws / "pwned.txt").read_text() == "pwned"
    finally:
        record_property("escapes_tried", arena.tried)
        _cleanup(url, token)
        assert server.stop() == 0


def _plant(arena: Arena, how: str, attacker_token: str) -> Path:
    """Put something where the token file would go; returns what a followed link would write."""
    chosen = json.dumps({"tokens": [{"name": "local", "token": attacker_token, "scopes": ["admin"]}]})
    target = arena.root / f"through-{how.replace(' ', '-')}"
    if how == "dangling symlink":
        arena.token_file.symlink_to(target)
    elif how in ("symlink to nobody's file", "nobody's file"):
        mine = target if how.startswith("symlink") else arena.token_file
        mine.write_text(chosen)
        os.chown(mine, NOBODY, NOBODY)
        mine.chmod(0o600)
        if how.startswith("symlink"):
            arena.token_file.symlink_to(target)
    elif how == "readable by others":
        arena.token_file.write_text(chosen)
        arena.token_file.chmod(0o644)
    else:  # a FIFO: opening it for reading must not hang the start
        os.mkfifo(arena.token_file, 0o666)
    return target


@pytest.mark.parametrize("how", ["dangling symlink", "symlink to nobody's file", "nobody's file",
                                 "readable by others", "fifo"])
def test_a_planted_token_file_is_never_followed_or_trusted(arena: Arena, how: str, record_property: Any) -> None:
    attacker_token = "attacker-" + secrets.token_hex(16)
    target = _plant(arena, how, attacker_token)
    before = os.lstat(arena.token_file)
    server = ServerProcess(server_env(arena.root, MCP_ENDPOINT="http", CCW_STATE_DIR=str(arena.state)))
    try:
        record_property("escapes_tried", 1)
        outcome = server.wait_for_line(r"^mcp:(ready|error)", timeout=60)
        assert outcome.startswith("mcp:error"), f"the server started over a planted token file ({how}):\n{server.log}"
        assert server.wait(60) == 2, server.log
    finally:
        server.stop()
    assert "http-tokens.json" in server.log and "remove" in server.log, server.log
    assert not (arena.root / "mcp.ready").exists()
    after = os.lstat(arena.token_file)
    assert (after.st_ino, after.st_mode, after.st_uid) == (before.st_ino, before.st_mode, before.st_uid)
    if how == "dangling symlink":
        assert not target.exists()  # never created through the link
    assert attacker_token not in server.log


# Runs as nobody with the system python: the holder of a leaked token.  It opens a session
# with it, lists the tools, holds the session's GET event stream open and says so (line 1);
# once the stream ends (the token was rotated), it tries the session, a direct call and a new
# session with the same token, and reports (line 2).
LEAKED_TOKEN_HOLDER = textwrap.dedent("""
    import http.client, json, sys, time
    plan = json.load(sys.stdin)
    base = {"authorization": "Bearer " + plan["token"], "content-type": "application/json",
            "accept": "application/json, text/event-stream"}
    def send(method, body, headers, timeout=30):
        conn = http.client.HTTPConnection(plan["host"], plan["port"], timeout=timeout)
        conn.request(method, plan["path"], body=None if body is None else json.dumps(body), headers=headers)
        return conn, conn.getresponse()
    def status(method, body, headers):
        conn, answer = send(method, body, headers)
        answer.read()
        conn.close()
        return answer.status, answer.getheader("www-authenticate")
    conn, opened = send("POST", plan["initialize"], base)
    opened.read()
    conn.close()
    session = {**base, "mcp-session-id": opened.getheader("mcp-session-id"), "mcp-protocol-version": "2025-11-25"}
    listed = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    before = {"opened": opened.status, "session": session["mcp-session-id"],
              "initialized": status("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0],
              "listed": status("POST", listed, session)[0]}
    conn, stream = send("GET", None, {**session, "accept": "text/event-stream"}, timeout=60)
    before["stream"] = stream.status
    print(json.dumps(before), flush=True)
    try:
        while stream.read1(65536):
            pass
        end = "ended"
    except (http.client.HTTPException, OSError) as exc:
        end = "cut: " + type(exc).__name__
    after = {"stream_end": end, "stream_end_at": time.time(), "listed": status("POST", listed, session),
             "direct": status("POST", {"jsonrpc": "2.0", "id": 2, "method": "ccw_info"}, base),
             "opened": status("POST", plan["initialize"], base)}
    print(json.dumps(after), flush=True)
""")


def _rpc_dict(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> dict[str, Any]:
    return json.loads(_rpc(method, params, request_id))


def test_a_rotated_token_ends_the_sessions_of_whoever_held_it(arena: Arena, record_property: Any) -> None:
    server = ServerProcess(server_env(arena.root, MCP_ENDPOINT="http", CCW_STATE_DIR=str(arena.state)))
    url = server.wait_ready()
    leaked = json.loads(arena.token_file.read_text())["tokens"][0]["token"]
    before_rotation = os.lstat(arena.token_file)
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    plan = {"host": host, "port": int(port), "path": "/mcp", "token": leaked,
            "initialize": _rpc_dict("initialize", INIT, 0)}
    holder = subprocess.Popen(["/usr/bin/python3", "-I", "-c", LEAKED_TOKEN_HOLDER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY,
                              extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"})
    try:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.write(json.dumps(plan))
        holder.stdin.close()
        opened = json.loads(holder.stdout.readline() or "{}")
        assert opened.get("opened") == 200 and opened["initialized"] == 202 and opened["listed"] == 200, opened
        assert opened["stream"] == 200  # the leaked token's session is live, its event stream open

        # The owner rotates: a separate process that only rewrites the file.
        rotated = subprocess.run([str(ROOT / ".venv" / "bin" / "ccw"), "http", "token", "rotate"], env=server.env,
                                 capture_output=True, text=True, timeout=60, check=False)
        rotated_at = time.time()
        assert rotated.returncode == 0, rotated.stderr
        assert "ccw client-config CLIENT --http HOST:PORT" in rotated.stdout and leaked not in rotated.stdout
        try:  # it exits once its stream has ended and it has tried the token again
            holder.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the leaked token's session kept its event stream open 20 s after the rotation")
        assert holder.returncode == 0, holder.stderr.read() if holder.stderr else ""
        after = json.loads(holder.stdout.read().splitlines()[-1])
        record_property("escapes_tried", 4)

        # The stream ended without any request of the owner's, within the server's next look.
        assert after["stream_end"] in ("ended", "cut: IncompleteRead"), after
        assert after["stream_end_at"] - rotated_at < 5, after
        for what in ("listed", "direct", "opened"):
            assert after[what][0] == 401 and after[what][1].startswith("Bearer"), (what, after)
        server.wait_for_line(f"ended session {opened['session'][:8]}… of token 'local'", timeout=10)

        info = os.lstat(arena.token_file)
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
        assert info.st_ino != before_rotation.st_ino
        fresh = json.loads(arena.token_file.read_text())["tokens"][0]["token"]
        assert fresh != leaked and fresh not in server.log and leaked not in server.log
        with httpx2.Client(timeout=60, headers={"authorization": f"Bearer {fresh}"}) as http:
            plain = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
            session = plain | {"mcp-session-id": opened["session"], "mcp-protocol-version": "2025-11-25"}
            gone = http.post(url, content=_rpc("tools/list"), headers=session)
            assert gone.status_code == 404  # the ended session is no one's, the new token's neither
            assert http.post(url, content=_rpc("ccw_info", {}), headers=plain).status_code == 200
            renewed = http.post(url, content=_rpc("initialize", INIT, 0), headers=plain)
            assert renewed.status_code == 200 and renewed.headers["mcp-session-id"] != opened["session"]
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        for pipe in (holder.stdout, holder.stderr):
            if pipe is not None:
                pipe.close()
        assert server.stop() == 0
