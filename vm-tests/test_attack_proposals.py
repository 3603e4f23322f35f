"""Attacks on proposals (issue 37): an agent proposes rules and never approves them.

A real ``ccw-mcp`` on Streamable HTTP with a tokens file (the agent's token: read, write,
exec, promote; the operator's: admin), its real helper and egress proxy, and the
servers of ``netfixtures`` in a network namespace of their own (10.98.0.2, private
space):

- the agent's own proposal stays pending whatever the agent calls with its token over
  HTTP (``decide``, ``allow``, the tool as a direct method: 403) or over the state dir's
  unix socket (``decide``: refused, a person answers with ``ccw net``); its connection
  stays denied by the real proxy; the operator's admin token then decides, and the same
  connection passes (so the refusals above are the gate's, not a broken setup);
- an approved proposal naming private space by a CIDR, or the host by its own name, still
  opens neither: core/netspace.py holds whoever approved;
- 2,000 proposals from one agent's token leave at most ``MAX_PROPOSALS_PER_CAPSULE``
  pending, each refusal says why, and the front end's memory stays bounded.

Nothing here sends a packet anywhere but loopback and the namespace the test makes.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from mcp_server.capsules import asks
from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.mcp_process import ServerProcess, server_env

SERVER = nf.SERVER_ADDRESS
HTTP = f"{SERVER}:{nf.HTTP_PORT}"
HTTPS = f"{SERVER}:{nf.HTTPS_PORT}"
AGENT, OPERATOR = "agent-token-0123456789abcdef", "operator-token-0123456789abcdef"
TOKENS = {"tokens": [{"name": "agent", "token": AGENT, "scopes": ["read", "write", "exec", "promote"]},
                     {"name": "operator", "token": OPERATOR, "scopes": ["admin"]}]}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[nf.Servers]:
    root = tmp_path / "srv"
    nf.build_wheel(root / "wheels")
    with nf.server_namespace(root, "http://denied.example/next") as running:
        yield running


@pytest.fixture
def front_end(tmp_path: Path, root_required: None) -> Iterator[ServerProcess]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOKENS_FILE=str(tokens),
                                      CCW_TOOLSETS="capsule", CCW_WORKSPACE=str(tmp_path)))
    server.wait_ready()
    yield server
    server.stop()


def _message(name: str, arguments: dict[str, Any], ident: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


_SESSIONS: dict[tuple[str, str], str] = {}


def _headers(http: httpx2.Client, server: ServerProcess, token: str) -> dict[str, str]:
    """A token's headers, with the MCP session it opened (initialize) on this server."""
    base = {**HEADERS, "authorization": f"Bearer {token}"}
    key = (server.path, token)
    if key not in _SESSIONS:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        opened = http.post(server.path, headers=base, json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                                            "params": init})
        assert opened.status_code == 200, opened.text
        _SESSIONS[key] = opened.headers["mcp-session-id"]
        http.post(server.path, headers={**base, "mcp-session-id": _SESSIONS[key]},
                  json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return {**base, "mcp-session-id": _SESSIONS[key]}


def _post(http: httpx2.Client, server: ServerProcess, token: str, message: dict[str, Any]) -> httpx2.Response:
    return http.post(server.path, json=message, headers=_headers(http, server, token))


def _answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a response, sent as JSON or as server-sent events (the last with an id)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        answer: dict[str, Any] = response.json()
        return answer
    messages = [json.loads(line[len("data:"):]) for line in response.text.splitlines() if line.startswith("data:")]
    return [m for m in messages if "id" in m][-1]


def _call(http: httpx2.Client, server: ServerProcess, token: str, name: str,
          arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool's structured result over HTTP; the call must pass the gate and succeed."""
    answer = _post(http, server, token, _message(name, arguments))
    assert answer.status_code == 200, answer.text
    result = _answer(answer)["result"]
    assert not result.get("isError"), result
    structured: dict[str, Any] = result["structuredContent"]
    return structured


def _over_socket(state: Path, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tools/call on the state dir's unix socket (frontend.sock), as any local client sends it."""
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    frames = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
              {"jsonrpc": "2.0", "method": "notifications/initialized"}, _message(name, arguments, 7)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(state / "frontend.sock"))
        sock.sendall(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
        buffer = b""
        while True:
            chunk = sock.recv(1 << 16)
            assert chunk, "the front end closed the socket"
            buffer += chunk
            for line in buffer.split(b"\n")[:-1]:
                message = json.loads(line)
                if message.get("id") == 7:
                    result: dict[str, Any] = message["result"]
                    return result


def _fetch(http: httpx2.Client, server: ServerProcess, cap: str, url: str) -> dict[str, Any]:
    """curl through the capsule's proxy (never around it: --noproxy ''); the exec's result."""
    cmd = ["curl", "-sS", "--noproxy", "", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}", url]
    return _call(http, server, AGENT, "capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 60_000,
                                                       "wait_ms": 120_000})


def _capsule(http: httpx2.Client, server: ServerProcess, ws: Path) -> str:
    ws.mkdir()
    return str(_call(http, server, AGENT, "capsule_create", {"workspace": str(ws), "network": [HTTPS]})["capsule_id"])


def test_an_agent_cannot_approve_its_own_proposal_over_http_or_the_socket(
        tmp_path: Path, servers: nf.Servers, front_end: ServerProcess) -> None:
    state = tmp_path / "state"
    with httpx2.Client(timeout=180) as http:
        cap = _capsule(http, front_end, tmp_path / "project")
        made = _call(http, front_end, AGENT, "capsule_network", {"capsule_id": cap, "propose": [HTTP],
                                                                 "reason": "the index"})
        ident = made["proposal"]
        for arguments in ({"capsule_id": cap, "proposal": ident, "decide": "approve"},
                          {"capsule_id": cap, "allow": [HTTP]},
                          {"capsule_id": cap, "proposal": ident, "decide": "approve", "propose": [HTTP]}):
            denied = _post(http, front_end, AGENT, _message("capsule_network", arguments))
            assert denied.status_code == 403 and "lacks scope 'admin'" in denied.json()["error"]["message"], \
                denied.text
        direct = _post(http, front_end, AGENT, {"jsonrpc": "2.0", "id": 2, "method": "capsule_network",
                                                "params": {"capsule_id": cap, "proposal": ident, "decide": "approve"}})
        assert direct.status_code == 403, direct.text
        on_socket = _over_socket(state, "capsule_network", {"capsule_id": cap, "proposal": ident, "decide": "approve"})
        assert on_socket.get("isError") and "PERMISSION_DENIED" in json.dumps(on_socket), on_socket
        assert "ccw net approve" in json.dumps(on_socket)
        polled = _call(http, front_end, AGENT, "capsule_network", {"capsule_id": cap, "proposal": ident})
        assert polled["outcome"]["state"] == "pending" and polled["network"]["allow"] == [HTTPS]
        assert [q["id"] for q in json.loads(ccw(state, "net", "pending", "--json").stdout)["pending"]] == [ident]
        still = _fetch(http, front_end, cap, f"{servers.http}/simple/")
        assert still["stdout"] == "403", still
        # The person's token decides; the same connection passes.
        decided = _call(http, front_end, OPERATOR, "capsule_network", {"capsule_id": cap, "proposal": ident,
                                                                       "decide": "approve"})
        assert decided["outcome"]["who"] == "token operator" and decided["outcome"]["applied"] == "change 1"
        passed = _fetch(http, front_end, cap, f"{servers.http}/simple/")
        assert passed["stdout"] == "200", passed


def test_an_approved_proposal_still_opens_no_private_space_nor_the_hosts_own(
        tmp_path: Path, servers: nf.Servers, front_end: ServerProcess) -> None:
    state = tmp_path / "state"
    with nf.loopback_server() as port, httpx2.Client(timeout=180) as http:
        cap = _capsule(http, front_end, tmp_path / "project")
        # The host's own name (not ``localhost``, which core/netspace.py takes as naming loopback
        # exactly): it resolves to the host's loopback or one of its addresses.
        name = socket.gethostname().lower()
        wide = [f"10.98.0.0/16:{nf.HTTP_PORT}", f"{name}:{port}"]
        made = _call(http, front_end, AGENT, "capsule_network", {"capsule_id": cap, "propose": wide,
                                                                 "reason": "the index and a local cache"})["proposal"]
        approved = json.loads(ccw(state, "net", "approve", str(made), "--json").stdout)
        assert approved["state"] == "capsule" and approved["applied"] == "change 1", approved
        private = _fetch(http, front_end, cap, f"{servers.http}/simple/")
        own = _call(http, front_end, AGENT, "capsule_exec", {"capsule_id": cap, "timeout_ms": 60_000, "cmd": [
            "curl", "-sS", "--noproxy", "", "--max-time", "20", f"http://{name}:{port}/"]})
        # The exact address, approved the same way, is what opens it.
        exact = _call(http, front_end, AGENT, "capsule_network", {"capsule_id": cap, "propose": [HTTP],
                                                                  "reason": "the index itself"})["proposal"]
        ccw(state, "net", "approve", str(exact))
        opened = _fetch(http, front_end, cap, f"{servers.http}/simple/")
    assert private["stdout"] == "403", private
    [refused] = [r for r in private["touched"]["network"] if r["port"] == nf.HTTP_PORT]
    assert refused["allowed"] is False and "private" in (refused["reason"] or ""), refused
    assert "host-loopback" not in own["stdout"] + own["stderr"], json.dumps(own)
    [loop] = [r for r in own["touched"]["network"] if r["port"] == port]
    assert loop["allowed"] is False and loop["host"] == name, json.dumps(loop)
    assert any(word in loop["reason"] for word in ("loopback", "host address")), json.dumps(loop)
    assert opened["stdout"] == "200", opened


# Each refused proposal is a whole HTTP call (about 20 ms here): 2,000 of them show the bound as
# 10,000 would, in a fifth of CI's time; tests/test_proposals.py floods the store itself.
FLOOD = 2_000


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_two_thousand_proposals_from_one_agent_leave_a_bounded_pending_list(
        tmp_path: Path, servers: nf.Servers, front_end: ServerProcess) -> None:
    state = tmp_path / "state"
    with httpx2.Client(timeout=180) as http:
        cap = _capsule(http, front_end, tmp_path / "project")
    rss_before = _rss_kb(front_end.proc.pid)
    outcomes: Counter[str] = Counter()

    with httpx2.Client(timeout=60) as http:
        headers = _headers(http, front_end, AGENT)

    async def flood() -> None:
        async with httpx2.AsyncClient(timeout=120, headers=headers) as client:
            async def worker(first: int) -> None:
                for n in range(first, FLOOD, 20):
                    arguments = {"capsule_id": cap, "propose": [f"h{n}.example:443"], "reason": f"flood {n}"}
                    answer = await client.post(front_end.path, json=_message("capsule_network", arguments, n))
                    result = _answer(answer)["result"]
                    if result.get("isError"):
                        text = json.dumps(result)
                        outcomes["refused" if "UNAVAILABLE" in text and "proposals pending" in text else text] += 1
                    else:
                        outcomes[result["structuredContent"]["outcome"]["state"]] += 1

            async with trio.open_nursery() as nursery:
                for first in range(20):
                    nursery.start_soon(worker, first)

    trio.run(flood)
    rss_after = _rss_kb(front_end.proc.pid)
    pending = json.loads(ccw(state, "net", "pending", "--json").stdout)["pending"]
    assert outcomes == {"pending": asks.MAX_PROPOSALS_PER_CAPSULE,
                        "refused": FLOOD - asks.MAX_PROPOSALS_PER_CAPSULE}, outcomes
    assert len(pending) == asks.MAX_PROPOSALS_PER_CAPSULE and {q["kind"] for q in pending} == {"proposal"}
    assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)  # KiB: no per-proposal growth
