"""A token-protected package index over HTTPS on a port other than 443, bound ``https://HOST:PORT``.

A real ``pip install`` in a capsule reaches the test's own index (TLS on 127.0.0.1, a port
the kernel picks, a leaf of a test CA the front end trusts through ``SSL_CERT_FILE``) with
``--index-url https://__token__:$PIP_TOKEN@...``: the proxy terminates the capsule's TLS,
swaps the placeholder in the Basic auth and sends it on over verified TLS.  Written
``https://``, the binding keeps the value inside TLS on that port too: the placeholder in a
plain ``http://`` request to the same host and port is refused and recorded as an
exfiltration attempt.  A reverse route to the index keeps the client's own ``__token__``
user.  The token's bytes are nowhere the capsule, the workspace or the journal can read.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.secretbind import make_binding
from mcp_server.core.tlsca import make_authority
from mcp_server.egress import tlsterm
from mcp_server.fs.castore import server_context
from mcp_server.fs.secretstore import SecretStore
from tests.support.secretsearch import IN_CAPSULE, STORE_FILE, events_holding, files_holding
from tests.support.tlsserver import QuietHandler, TlsServer

PYTHON = "/usr/bin/python3"
TOKEN = b"pypi-" + b"Hx7tQ" * 8  # 45 bytes
NOW = dt.datetime.now(dt.UTC)
PUBLIC = make_authority(["127.0.0.1"], NOW)  # the test's CA, which the front end trusts
PACKAGE = "ccwtrialpkg"
WHEEL = f"{PACKAGE}-1.0-py3-none-any.whl"
DIRECT = f"NO_PROXY= no_proxy= {PYTHON}"  # 127.0.0.1 through the proxy: the host's, not the jail's own
PLAIN = """
import base64, os, sys, urllib.error, urllib.request
auth = base64.b64encode(b'__token__:' + os.environ['PIP_TOKEN'].encode()).decode()
for url in sys.argv[1:]:
    try:
        print(urllib.request.urlopen(urllib.request.Request(url, headers={'Authorization': 'Basic ' + auth})).status)
    except urllib.error.HTTPError as e:
        print(e.code)
"""


def _wheel(folder: Path) -> bytes:
    files = {f"{PACKAGE}/__init__.py": b"HELLO = 'installed through ccw'\n",
             f"{PACKAGE}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode(),
             f"{PACKAGE}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                                               b"Tag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()]
    files[f"{PACKAGE}-1.0.dist-info/RECORD"] = "\n".join([*record, f"{PACKAGE}-1.0.dist-info/RECORD,,", ""]).encode()
    with zipfile.ZipFile(folder / WHEEL, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return (folder / WHEEL).read_bytes()


class IndexServer(TlsServer):
    """A PEP 503 index of one wheel over TLS, Basic ``__token__:TOKEN``; ``heads`` keeps each request head."""

    def __init__(self, wheel: bytes) -> None:
        super().__init__("127.0.0.1", IndexHandler, server_context(PUBLIC.leaf("127.0.0.1", NOW)))
        self.wheel = wheel
        self.heads: list[bytes] = []


class IndexHandler(QuietHandler):
    server: IndexServer

    def do_GET(self) -> None:
        self.server.heads.append(f"{self.requestline}\r\n{self.headers}".encode())
        digest = hashlib.sha256(self.server.wheel).hexdigest()
        pages = {f"/simple/{PACKAGE}/": f"<a href='/files/{WHEEL}#sha256={digest}'>{WHEEL}</a>".encode(),
                 f"/files/{WHEEL}": self.server.wheel}
        if (self.headers.get("Authorization") or "").encode() != b"Basic " + base64.b64encode(b"__token__:" + TOKEN):
            status, body = 401, b""
        else:
            status, body = (200, pages[self.path]) if self.path in pages else (404, b"")
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if self.path.endswith(".whl") else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def index(tmp_path: Path, root_required: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[IndexServer]:
    (tmp_path / "public.pem").write_bytes(PUBLIC.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))  # the front end trusts the test's CA
    tlsterm.upstream_context.cache_clear()
    server = IndexServer(_wheel(tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()
    tlsterm.upstream_context.cache_clear()


def test_pip_installs_from_an_https_index_on_another_port_and_cleartext_is_refused(
        tools: Any, tmp_path: Path, index: IndexServer) -> None:
    port = index.server_address[1]
    state = tools.runtime.state.root
    os.chmod(state, 0o700)
    SecretStore(state).put(make_binding("PIP_TOKEN", [f"https://127.0.0.1:{port}"], None, "basic-password"),
                           "stdin", TOKEN)
    workspace = tmp_path / "project"
    workspace.mkdir()
    pip = (f"{DIRECT} -m pip install -q --no-cache-dir --disable-pip-version-check --target /tmp/site "
           f"--index-url https://__token__:$PIP_TOKEN@127.0.0.1:{port}/simple/ {PACKAGE} && "
           f"PYTHONPATH=/tmp/site {PYTHON} -c 'import {PACKAGE}; print({PACKAGE}.HELLO)'")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [f"127.0.0.1:{port}"],
                                               "secrets": ["PIP_TOKEN"]}))["capsule_id"]

        async def run(cmd: list[str]) -> dict[str, Any]:
            return await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 60000})

        out = {"pip": await run(["sh", "-c", pip])}
        out["plain"] = await run(["sh", "-c", f'{DIRECT} -c "$0" "$1"', PLAIN, f"http://127.0.0.1:{port}/simple/"])
        out["route"] = await run(["sh", "-c", f'{PYTHON} -c "$0" "$1"', PLAIN,
                                  f"http://10.99.0.1:3128/route/PIP_TOKEN/simple/{PACKAGE}/"])
        out["search"] = await run([PYTHON, "-c", IN_CAPSULE, TOKEN.hex()])
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["pip"]["exit_code"] == 0 and out["pip"]["stdout"] == "installed through ccw\n", out["pip"]["stderr"]
    records = [r for r in out["pip"]["touched"]["network"] if r["protocol"] != "udp"]
    assert records and all(r.get("tls") == "terminated" and r["allowed"] for r in records), json.dumps(records)
    # Cleartext to the same host and port: refused before any connection, as an exfiltration attempt.
    assert out["plain"]["stdout"] == "403\n", out["plain"]
    [refused] = out["plain"]["touched"]["network"]
    assert not refused["allowed"] and refused["reason"].startswith("exfiltration attempt? the value of secret "
                                                                   "PIP_TOKEN would go to 127.0.0.1:"), refused
    # The route goes over TLS (the binding says https://) with the client's own __token__ user.
    assert out["route"]["stdout"] == "200\n", out["route"]
    good = b"Basic " + base64.b64encode(b"__token__:" + TOKEN)
    assert len(index.heads) >= 3 and all(good in head for head in index.heads), index.heads
    assert out["search"]["stdout"] == "[]\n", out["search"]
    assert TOKEN not in json.dumps(out).encode()
    assert files_holding(state, TOKEN, {STORE_FILE}) == [] and files_holding(workspace, TOKEN, set()) == []
    assert events_holding(tools.runtime.state.db_path, TOKEN) == []
