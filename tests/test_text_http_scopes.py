"""MCP-051 for the text and file tools over HTTP: read tools need 'read', mutations need
'write', and a token without the scope gets 403 naming it (and nothing is written)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.support.mcp_process import ServerProcess, http_token_env

TOKENS = {"tokens": [
    {"name": "reader", "token": "read-token-0123456789", "scopes": ["read"]},
    {"name": "editor", "token": "edit-token-0123456789", "scopes": ["read", "write"]},
    {"name": "runner", "token": "exec-token-0123456789", "scopes": ["exec"]},
]}


def bearer(name: str) -> dict[str, str]:
    token = next(t["token"] for t in TOKENS["tokens"] if t["name"] == name)
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def server(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    proc = ServerProcess(http_token_env(tmp_path, TOKENS, CCW_TOOLSETS="text,file", CCW_WORKSPACE=str(ws)))
    proc.wait_ready()
    yield proc, ws
    proc.stop()


def _direct(http: httpx2.Client, url: str, who: str, method: str, params: dict) -> httpx2.Response:
    return http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=bearer(who))


def test_scopes_of_text_and_file_tools(server: tuple[ServerProcess, Path]) -> None:
    proc, ws = server
    url = proc.path
    with httpx2.Client(timeout=30) as http:
        read = _direct(http, url, "reader", "text.read", {"path": "/a.txt"})
        assert read.status_code == 200
        digest = read.json()["result"]["hash"]
        assert _direct(http, url, "reader", "read_text_file", {"path": "a.txt"}).status_code == 200

        for method, params in (
            ("text.append", {"path": "/a.txt", "hash": digest, "content": "two"}),
            ("file.create", {"path": "/b.txt", "content": "b"}),
            ("file.remove", {"path": "/a.txt", "hash": digest}),
            ("edit_text_file", {"path": "a.txt", "file_hash": digest, "ops": ["insert_after 0 'zero'"]}),
        ):
            denied = _direct(http, url, "reader", method, params)
            assert denied.status_code == 403, method
            assert "'write'" in denied.json()["error"]["message"]
        assert (ws / "a.txt").read_text() == "one\n" and not (ws / "b.txt").exists()

        assert _direct(http, url, "runner", "text.read", {"path": "/a.txt"}).status_code == 403
        listing = http.post(
            url, json={"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "list:///"}},
            headers={**bearer("runner"), "accept": "application/json, text/event-stream"},
        )
        assert listing.status_code == 403 and "'read'" in listing.json()["error"]["message"]

        done = _direct(http, url, "editor", "text.append", {"path": "/a.txt", "hash": digest, "content": "two"})
        assert done.status_code == 200 and "result" in done.json(), done.text
        assert (ws / "a.txt").read_text() == "one\ntwo\n"
