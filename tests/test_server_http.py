"""ccw-mcp over Streamable HTTP: SDK clients in both eras, sessions, Origin, bearer tokens
and scopes (the generated local token included), the 1 MiB body guard, direct methods,
the loopback-only rule without a tokens file, and revocation: a rotated token or an entry
removed from the tokens file is refused and what it held ends, a broken file is 503."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_server.auth import rotate_generated
from tests.support.mcp_process import ROOT, ServerProcess, server_env

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {
    "jsonrpc": "2.0", "id": 0, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
TOKENS = {"tokens": [
    {"name": "reader", "token": "read-token-0123456789", "scopes": ["read"]},
    {"name": "runner", "token": "exec-token-0123456789", "scopes": ["exec"]},
    {"name": "boss", "token": "admin-token-0123456789", "scopes": ["admin"]},
]}


def bearer(name: str) -> dict[str, str]:
    token = next(t["token"] for t in TOKENS["tokens"] if t["name"] == name)
    return {"authorization": f"Bearer {token}"}


def decode(response: httpx2.Response) -> dict | None:
    """The JSON-RPC message in a JSON or SSE response body."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                return json.loads(line[5:])
        return None
    return response.json() if response.content else None


@pytest.fixture
def http_server(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http"))
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def token_server(tmp_path: Path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOKENS_FILE=str(tokens)))
    server.wait_ready()
    yield server
    server.stop()


# The SDK's HTTP client (httpx2) leaves SSE async generators for trio to finalise when a
# session ends; trio reports each as a ResourceWarning.  That is client-side cleanup,
# not server behaviour, so only that warning is ignored, only in the SDK-client tests.
SDK_CLIENT_GC = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning"
)


@SDK_CLIENT_GC
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_sdk_client_over_http(http_server: ServerProcess, mode: str):
    async def session():
        async with http_server.client(mode) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == ["ccw_info"]
            seen: list[float] = []

            async def on_progress(value, total, message):
                seen.append(value)

            result = await client.call_tool("ccw_info", {"delay_ms": 200}, progress_callback=on_progress)
            assert result.structured_content["endpoint"] == "http"
            assert seen and seen[-1] == 200

    trio.run(session)


@SDK_CLIENT_GC
def test_sdk_client_with_bearer_token(token_server: ServerProcess):
    async def session():
        async with (
            httpx2.AsyncClient(headers=bearer("reader")) as http,
            Client(streamable_http_client(token_server.path, http_client=http), mode="legacy") as client,
        ):
            result = await client.call_tool("ccw_info", {"echo": "authorised"})
            assert result.structured_content["echo"] == "authorised"

    trio.run(session)


def test_sessions_unknown_id_404_and_delete(http_server: ServerProcess):
    url = http_server.path
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as http:
        opened = http.post(url, json=INIT, headers=ACCEPT)
        assert opened.status_code == 200
        session_id = opened.headers["mcp-session-id"]
        assert decode(opened)["result"]["protocolVersion"] == "2025-11-25"
        headers = {**ACCEPT, "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        assert http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers=headers).status_code == 202
        listed = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
        assert decode(listed)["result"]["tools"][0]["name"] == "ccw_info"
        unknown = http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                            headers={**headers, "mcp-session-id": "0" * 32})
        assert unknown.status_code == 404
        assert http.delete(url, headers=headers).status_code in (200, 204)
        ended = http.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=headers)
        assert ended.status_code == 404


def test_origin_is_validated(http_server: ServerProcess):
    url = http_server.path
    port = url.split(":")[2].split("/")[0]
    direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as http:
        evil = http.post(url, json=direct, headers={"origin": "http://evil.example"})
        assert evil.status_code == 403 and "Origin" in evil.json()["error"]
        local = http.post(url, json=direct, headers={"origin": f"http://localhost:{port}"})
        assert local.status_code == 200 and local.json()["result"]["name"] == "ccw"


def test_direct_method_and_body_guard_keep_connection(http_server: ServerProcess):
    url = http_server.path
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as http:
        ok = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ccw_info", "params": {"echo": "d"}})
        assert ok.status_code == 200 and ok.json() == {"jsonrpc": "2.0", "id": 1, "result": ok.json()["result"]}
        assert ok.json()["result"]["echo"] == "d"
        big = b'{"jsonrpc":"2.0","id":7,"method":"ccw_info","params":{"echo":"' + b"x" * (1 << 20) + b'"}}'
        refused = http.post(url, content=big, headers={"content-type": "application/json"})
        assert refused.status_code == 413
        body = refused.json()
        assert body["id"] == 7 and body["error"]["data"] == {
            "ok": False, "reason": "validation_failed", "errors": [{"path": "", "msg": "payload_too_large"}]}
        again = http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ccw_info"})
        assert again.status_code == 200 and again.json()["id"] == 2
        bad = http.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "ccw_info", "params": {"x": 1}})
        assert bad.json()["error"]["code"] == -32602


def test_tools_call_params_of_the_wrong_shape_say_what_is_wrong(http_server: ServerProcess):
    # Found in a trial: arguments sent as JSON text (as some models do) got the SDK's
    # "Invalid request parameters" with empty data, which tells a model nothing to fix.
    url = http_server.path
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as http:
        headers = _open_session(http, url, {})
        text = {"name": "ccw_info", "arguments": '{"echo": "x"}'}
        answer = http.post(url, json={"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": text},
                           headers=headers).json()
        assert answer["id"] == 4 and answer["error"]["code"] == -32602, answer
        assert answer["error"]["message"].startswith("tools/call params.arguments must be a JSON object, not JSON "
                                                     "text (a string)"), answer
        named = http.post(url, json={"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": 5}},
                          headers=headers).json()
        assert "params.name must be the tool's name" in named["error"]["message"], named
        fine = http.post(url, json={"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                    "params": {"name": "ccw_info", "arguments": {"echo": "x"}}}, headers=headers)
        assert '"echo":"x"' in fine.text.replace(" ", ""), fine.text


def test_tokens_401_and_403_naming_the_scope(token_server: ServerProcess):
    url = token_server.path
    direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
    with httpx2.Client(timeout=30) as http:
        missing = http.post(url, json=direct)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        wrong = http.post(url, json=direct, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        lacking = http.post(url, json=direct, headers=bearer("runner"))
        assert lacking.status_code == 403 and "'read'" in lacking.json()["error"]["message"]
        assert http.post(url, json=direct, headers=bearer("reader")).status_code == 200
        assert http.post(url, json=direct, headers=bearer("boss")).status_code == 200

        # Over an MCP session: initialize needs only a valid token, tools/call the tool's scope.
        opened = http.post(url, json=INIT, headers={**ACCEPT, **bearer("runner")})
        assert opened.status_code == 200
        headers = {**ACCEPT, **bearer("runner"), "mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-11-25"}
        http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ccw_info", "arguments": {}}}
        denied = http.post(url, json=call, headers=headers)
        assert denied.status_code == 403
        assert "'read'" in denied.json()["error"]["message"] and "ccw_info" in denied.json()["error"]["message"]
        # A session belongs to the token that opened it.
        stolen = http.post(url, json=call, headers={**headers, **bearer("reader")})
        assert stolen.status_code == 404


def test_non_loopback_without_tokens_is_refused(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_HTTP_ADDR="0.0.0.0:0"))
    assert server.wait() == 2
    assert "CCW_TOKENS_FILE" in server.log
    assert not (tmp_path / "mcp.ready").exists()
    assert not (tmp_path / "state" / "http-tokens.json").exists()  # refused before anything is written


@SDK_CLIENT_GC
def test_sigterm_finishes_in_flight_http_request(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http"))
    server.wait_ready()

    async def session():
        async with server.client() as client:
            await client.list_tools()
            signalled: list[float] = []

            async def on_progress(value, total, message):
                if not signalled:
                    server.signal()
                    signalled.append(value)

            return await client.call_tool("ccw_info", {"delay_ms": 1500}, progress_callback=on_progress)

    try:
        result = trio.run(session)
        assert result.structured_content["delayed_ms"] == 1500
        assert server.wait() == 0
    finally:
        server.stop()
    assert "mcp:draining mode=http signal=SIGTERM" in server.log
    assert "mcp:shutdown mode=http" in server.log
    assert not (tmp_path / "mcp.ready").exists()


def test_tokens_refuse_a_body_json_loads_cannot_parse(token_server: ServerProcess):
    # Python's json.loads refuses integers over 4,300 digits; the SDK's parser (pydantic)
    # reads them.  A body with one used to skip the scope check and reach the SDK: a
    # token without 'read' could call a 'read' tool.  It is refused before anything runs.
    url = token_server.path
    with httpx2.Client(timeout=30) as http:
        opened = http.post(url, json=INIT, headers={**ACCEPT, **bearer("runner")})
        headers = {**ACCEPT, **bearer("runner"), "mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-11-25"}
        http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        huge = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ccw_info","arguments":{},' \
               b'"_meta":{"n":' + b"1" * 5000 + b'}}}'
        smuggled = http.post(url, content=huge, headers=headers)
        assert smuggled.status_code == 400, smuggled.text
        assert smuggled.json()["error"]["code"] == -32700 and "scope" in smuggled.json()["error"]["message"]
        for body in (b"not json", b"[1, 2]", b'{"jsonrpc": "2.0", "id": 3, "method": 7}'):
            refused = http.post(url, content=body, headers=headers)
            assert refused.status_code == 400, (body, refused.text)
        # A well-formed call still gets its 403, and the connection and session still work.
        call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "ccw_info", "arguments": {}}}
        assert http.post(url, json=call, headers=headers).status_code == 403
        boss = http.post(url, json={"jsonrpc": "2.0", "id": 5, "method": "ccw_info"}, headers=bearer("boss"))
        assert boss.status_code == 200


def test_dns_rebinding_host_is_refused_on_loopback(http_server: ServerProcess):
    # The SDK's own check (host_guard): a page rebound to 127.0.0.1 still sends its own
    # name as Host; refused before any method runs, direct methods included.
    url = http_server.path
    port = url.split(":")[2].split("/")[0]
    direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as http:
        rebound = http.post(url, json=direct, headers={"host": f"evil.example:{port}"})
        assert rebound.status_code == 421 and "Host 'evil.example:" in rebound.json()["error"]
        wrong_port = http.post(url, json=direct, headers={"host": "127.0.0.1:1"})
        assert wrong_port.status_code == 421
        rebound_get = http.get(url, headers={"host": f"evil.example:{port}", "accept": "text/event-stream"})
        assert rebound_get.status_code == 421
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert http.post(url, json=direct, headers={"host": host}).status_code == 200


def test_beyond_loopback_tokens_guard_and_origin_is_still_checked(tmp_path: Path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_HTTP_ADDR="0.0.0.0:0",
                                      CCW_TOKENS_FILE=str(tokens)))
    try:
        url = server.wait_ready().replace("0.0.0.0", "127.0.0.1")
        direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
        with httpx2.Client(timeout=30) as http:
            # Any name may reach the machine: Host is not ccw's to judge here; the token is.
            named = http.post(url, json=direct, headers={**bearer("reader"), "host": "build-box.lan:80"})
            assert named.status_code == 200
            assert http.post(url, json=direct, headers={"host": "build-box.lan:80"}).status_code == 401
            evil = http.post(url, json=direct, headers={**bearer("reader"), "origin": "http://evil.example"})
            assert evil.status_code == 403 and "Origin" in evil.json()["error"]
    finally:
        server.stop()


def test_loopback_needs_the_generated_token(http_server: ServerProcess, tmp_path: Path):
    # No CCW_TOKENS_FILE: the server made one token in its state dir and asks for it on
    # loopback too; the unix socket is the tokenless local path, not HTTP.
    made = tmp_path / "state" / "http-tokens.json"
    info = os.lstat(made)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    entry = json.loads(made.read_text())["tokens"][0]
    assert entry["name"] == "local" and entry["scopes"] == ["admin"] and len(entry["token"]) >= 43
    assert entry["token"] not in http_server.log
    assert f"auth=bearer tokens={made} (generated" in http_server.log
    url = http_server.path
    direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
    with httpx2.Client(timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer " + entry["token"].swapcase()}, {"authorization": "Bearer"},
                        {"authorization": entry["token"]}):
            refused = http.post(url, json=direct, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
            assert entry["token"] not in refused.text
        assert http.post(url, json=INIT, headers=ACCEPT).status_code == 401
        assert http.get(url, headers={"accept": "text/event-stream"}).status_code == 401
        assert http.post(url, json=direct, headers={"authorization": f"bearer  {entry['token']}"}).status_code == 200


def test_a_refused_request_keeps_its_connection_once_its_body_is_read(http_server: ServerProcess):
    # The body comes after the head, as a loaded client's often does: the 401 waits for it,
    # so the server can take the next request on the same connection rather than close it
    # under a client that has already sent that request (the "Server disconnected" flake).
    host, port = http_server.path.split("/")[2].rsplit(":", 1)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}).encode()
    head = (f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn, conn.makefile("rb") as answers:
        for _ in range(3):
            conn.sendall(head)
            time.sleep(0.1)  # not a measure: lets the server see the head alone, as under load
            conn.sendall(body)
            status = answers.readline()
            assert status.startswith(b"HTTP/1.1 401"), status
            fields = dict(line.rstrip(b"\r\n").lower().split(b": ", 1) for line in iter(answers.readline, b"\r\n"))
            assert b"connection" not in fields
            answers.read(int(fields[b"content-length"]))
    # A body too big to read first is refused with the connection closed, as the answer says.
    big = httpx2.post(http_server.path, content=b"x" * (256 * 1024), timeout=30)
    assert big.status_code == 401 and big.headers["connection"] == "close"


def test_a_refused_body_trickled_forever_is_cut(http_server: ServerProcess):
    # No token, a body promised and sent a byte at a time: the 401 comes once the server
    # stops waiting for it, and the connection ends, so a thousand such senders (any local
    # user) cannot hold the server's descriptors and leave it none to accept with.
    host, port = http_server.path.split("/")[2].rsplit(":", 1)
    head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: 60000\r\n\r\n{{".encode()
    with socket.create_connection((host, int(port)), timeout=1) as conn:
        conn.sendall(head)
        answer, deadline = b"", time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn.sendall(b" ")
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower(), answer[:300]
    assert time.monotonic() < deadline


def test_the_generated_token_is_kept_across_restarts(tmp_path: Path):
    first = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http"))
    first.wait_ready()
    token = first.bearer()
    assert first.stop() == 0
    again = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http"))
    try:
        url = again.wait_ready()
        assert again.bearer() == token  # a client's config stays valid
        assert httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}, headers=token,
                           timeout=30).status_code == 200
    finally:
        again.stop()


@pytest.mark.parametrize("plant", ["dangling symlink", "symlink to a tokens file", "group-readable", "fifo"])
def test_an_unsafe_generated_file_stops_the_server(tmp_path: Path, plant: str):
    state = tmp_path / "state"
    state.mkdir()
    spot = state / "http-tokens.json"
    chosen = tmp_path / "chosen.json"
    if plant == "dangling symlink":
        spot.symlink_to(tmp_path / "written-through-the-link")
    elif plant == "symlink to a tokens file":
        chosen.write_text(json.dumps({"tokens": [{"name": "x", "token": "attacker-chose-this", "scopes": ["admin"]}]}))
        chosen.chmod(0o600)
        spot.symlink_to(chosen)
    elif plant == "group-readable":
        spot.write_text(json.dumps({"tokens": [{"name": "local", "token": "seen-by-others", "scopes": ["admin"]}]}))
        spot.chmod(0o640)
    else:
        os.mkfifo(spot, 0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http"))
    assert server.wait() == 2, server.log
    assert "http-tokens.json" in server.log and "remove" in server.log, server.log
    assert not (tmp_path / "written-through-the-link").exists()
    assert not (tmp_path / "mcp.ready").exists()


def _open_session(http: httpx2.Client, url: str, auth: dict[str, str]) -> dict[str, str]:
    """An initialized 2025-11-25 session of ``auth``'s token: the headers that use it."""
    opened = http.post(url, json=INIT, headers={**ACCEPT, **auth})
    assert opened.status_code == 200, opened.text
    headers = {**ACCEPT, **auth, "mcp-session-id": opened.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-11-25"}
    assert http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                     headers=headers).status_code == 202
    return headers


def _listen(url: str, headers: dict[str, str]) -> tuple[threading.Thread, list[Any]]:
    """A GET event stream of a session, read in a thread: [status, how it ended]."""
    seen: list[Any] = []

    def read() -> None:
        try:
            with httpx2.stream("GET", url, headers={**headers, "accept": "text/event-stream"}, timeout=60) as stream:
                seen.append(stream.status_code)
                for _ in stream.iter_lines():
                    pass
            seen.append("ended")
        except httpx2.HTTPError as exc:
            seen.append(f"cut: {type(exc).__name__}")

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, seen


def _tools_list(http: httpx2.Client, url: str, headers: dict[str, str]) -> httpx2.Response:
    return http.post(url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers=headers)


def test_a_rotated_token_is_refused_and_its_sessions_end_without_another_request(http_server: ServerProcess,
                                                                                  tmp_path: Path):
    url, old = http_server.path, http_server.bearer()
    with httpx2.Client(timeout=30) as http:
        streaming = _open_session(http, url, old)
        idle = _open_session(http, url, old)
        thread, seen = _listen(url, streaming)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == [200]
        rotated = subprocess.run([str(ROOT / ".venv" / "bin" / "ccw"), "http", "token", "rotate"],
                                 env=http_server.env, capture_output=True, text=True, timeout=60, check=True)
        assert "ccw client-config CLIENT --http HOST:PORT" in rotated.stdout
        # No request comes: the server's own look (every TOKENS_POLL_S) ends both sessions.
        thread.join(10)
        assert not thread.is_alive() and len(seen) == 2, seen
        for headers in (streaming, idle):
            http_server.wait_for_line(f"ended session {headers['mcp-session-id'][:8]}", timeout=10)
        new = http_server.bearer()
        assert new != old
        for headers in (streaming, idle):
            refused = _tools_list(http, url, headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
            assert _tools_list(http, url, {**headers, **new}).status_code == 404  # gone, for the new token too
        direct = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info"}
        assert http.post(url, json=direct, headers=old).status_code == 401
        assert http.post(url, json=direct, headers=new).status_code == 200
        fresh = _open_session(http, url, new)
        assert decode(_tools_list(http, url, fresh))["result"]["tools"][0]["name"] == "ccw_info"


def test_a_call_in_flight_with_a_revoked_token_is_cut_with_401(http_server: ServerProcess, tmp_path: Path):
    url, old = http_server.path, http_server.bearer()
    answers: list[httpx2.Response] = []
    slow = {"jsonrpc": "2.0", "id": 1, "method": "ccw_info", "params": {"delay_ms": 10_000}}
    caller = threading.Thread(target=lambda: answers.append(httpx2.post(url, json=slow, headers=old, timeout=60)))
    caller.start()
    time.sleep(1)  # admitted while the token was good: its 401 below says "revoked", not "unknown"
    started = time.monotonic()
    rotate_generated(str(tmp_path / "state"))
    caller.join(30)
    (answer,) = answers
    assert time.monotonic() - started < 6, answer.text  # cut (the next look is within 1 s), not answered
    assert answer.status_code == 401 and 'error="invalid_token"' in answer.headers["www-authenticate"]
    assert "revoked" in answer.json()["error"]


def test_an_entry_removed_from_the_operators_file_ends_only_what_it_held(token_server: ServerProcess,
                                                                        tmp_path: Path):
    url = token_server.path
    with httpx2.Client(timeout=30) as http:
        runner = _open_session(http, url, bearer("runner"))
        reader = _open_session(http, url, bearer("reader"))
        kept = {"tokens": [entry for entry in TOKENS["tokens"] if entry["name"] != "runner"]}
        (tmp_path / "tokens.json").write_text(json.dumps(kept))  # edited in place, as an operator might
        assert _tools_list(http, url, runner).status_code == 401
        token_server.wait_for_line(f"ended session {runner['mcp-session-id'][:8]}… of token 'runner'", timeout=10)
        assert _tools_list(http, url, {**runner, **bearer("boss")}).status_code == 404
        listed = _tools_list(http, url, reader)  # another token's session goes on
        assert listed.status_code == 200 and decode(listed)["result"]["tools"][0]["name"] == "ccw_info"
        assert f"ended session {reader['mcp-session-id'][:8]}" not in token_server.log


def test_an_unusable_tokens_file_is_503_until_fixed_and_ends_nothing(token_server: ServerProcess, tmp_path: Path):
    url = token_server.path
    tokens = tmp_path / "tokens.json"
    with httpx2.Client(timeout=30) as http:
        reader = _open_session(http, url, bearer("reader"))
        tokens.write_text('{"tokens": [')  # an editor's half-saved file
        refused = _tools_list(http, url, reader)
        assert refused.status_code == 503 and "tokens file" in refused.json()["error"]
        assert "not JSON" in token_server.wait_for_line("every request is refused until the tokens file is fixed")
        tokens.write_text(json.dumps(TOKENS))
        assert _tools_list(http, url, reader).status_code == 200  # the session lived through it
