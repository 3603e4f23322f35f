"""Method/path rules on https hosts, inside TLS the proxy terminates (issue 38), with no secret.

Two TLS servers of the test's own on the host's loopback (127.0.0.1 and 127.0.0.2, ports
the kernel picks), with certificates from a test CA that the front end trusts through
``SSL_CERT_FILE``, as a host trusts its system store.  A capsule whose only rule is
``READ https://127.0.0.1:PORT/**`` gets a CA for that host (capsules/capsecrets.py), so
its GET passes and its POST is refused with the rule named, both inside terminated TLS;
a rule for the second server added live (capsule_network) gets a second CA, appended to
the capsule's bundle, and a new connection there is terminated and judged too.  A
capsule made without any CA (no secret, no https rule) refuses such a rule live, saying
to make it again: it cannot be shown a bundle while it lives.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.tlsca import make_authority
from mcp_server.egress import tlsterm
from mcp_server.fs.castore import server_context
from sandbox.errors import CcwError
from tests.support.tlsserver import QuietHandler, TlsServer

PYTHON = "/usr/bin/python3"
NOW = dt.datetime.now(dt.UTC)
PUBLIC = make_authority(["127.0.0.1", "127.0.0.2"], NOW)  # the test's CA, which the host trusts
# Each line: METHOD URL -> the status, or the error's name (urllib honours HTTPS_PROXY and SSL_CERT_FILE;
# NO_PROXY emptied, since it names 127.0.0.1, which in the jail is the jail's own loopback).
FETCH = """
import sys, urllib.request, urllib.error
for method, url in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b'x' if method == 'POST' else None,
                                                           method=method), timeout=30) as answer:
            print(method, url, answer.status, answer.read().decode())
    except urllib.error.HTTPError as exc:
        print(method, url, exc.code, exc.read().decode()[:400].replace('\\n', ' '))
    except Exception as exc:
        print(method, url, 'error', type(exc).__name__, str(exc)[:200].replace('\\n', ' '))
"""


class Server(TlsServer):
    """HTTPS on ``address``, a leaf of the test's CA; ``seen`` keeps each request line."""

    def __init__(self, address: str) -> None:
        super().__init__(address, Handler, server_context(PUBLIC.leaf(address, NOW)))
        self.seen: list[str] = []


class Handler(QuietHandler):
    server: Server

    def do_GET(self) -> None:
        self.server.seen.append(self.requestline)
        body = b"served"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@pytest.fixture
def servers(tmp_path: Path, root_required: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Server]]:
    (tmp_path / "public.pem").write_bytes(PUBLIC.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))  # the front end trusts the test's CA
    tlsterm.upstream_context.cache_clear()
    made = [Server("127.0.0.1"), Server("127.0.0.2")]
    for server in made:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield made
    for server in made:
        server.shutdown()
        server.server_close()
    tlsterm.upstream_context.cache_clear()


def test_https_method_path_rules_inside_terminated_tls(tools: Any, tmp_path: Path, servers: list[Server]) -> None:
    one, two = (f"https://{s.server_address[0]}:{s.server_address[1]}" for s in servers)
    workspace = tmp_path / "project"
    workspace.mkdir()
    rule_one, rule_two = f"READ {one}/**", f"READ {two}/**"

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [rule_one]}))["capsule_id"]

        async def fetch(*pairs: str) -> dict[str, Any]:
            return await t.call("capsule_exec", {"capsule_id": cap,
                                                 "cmd": ["env", "NO_PROXY=", "no_proxy=", PYTHON, "-c", FETCH, *pairs],
                                                 "timeout_ms": 60000})

        out = {"first": await fetch("GET", f"{one}/simple/", "POST", f"{one}/upload", "GET", f"{two}/simple/")}
        out["changed"] = await t.call("capsule_network", {"capsule_id": cap, "allow": [rule_two]})
        out["second"] = await fetch("GET", f"{two}/simple/", "POST", f"{two}/upload", "GET", f"{one}/again")
        out["env"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo $SSL_CERT_FILE"]})
        plain = (await t.call("capsule_create", {"workspace": str(workspace), "network": ["127.0.0.3:9"]}))
        with pytest.raises(CcwError) as refused:  # made with no CA bundle shown: it cannot be shown one now
            await t.call("capsule_network", {"capsule_id": plain["capsule_id"], "allow": [rule_two]})
        out["refused"] = refused.value.message
        out["plain"] = await t.call("capsule_network", {"capsule_id": plain["capsule_id"]})
        return out

    out = tools.run(scenario)
    lines = out["first"]["stdout"].splitlines() + out["second"]["stdout"].splitlines()
    assert len(lines) == 6, out
    get_one, post_one, get_two_early, get_two, post_two, get_one_again = lines
    assert get_one.endswith(" 200 served") and get_one_again.endswith(" 200 served"), lines
    assert " 403 " in post_one and rule_one.replace("READ", "GET,HEAD,OPTIONS") in post_one, lines
    assert " 200 " not in get_two_early, lines  # before the rule: not allowed at all
    assert get_two.endswith(" 200 served") and " 403 " in post_two, lines  # after it, on a new connection
    assert rule_two.replace("READ", "GET,HEAD,OPTIONS") in post_two, lines
    assert servers[0].seen == ["GET /simple/ HTTP/1.1", "GET /again HTTP/1.1"], servers[0].seen
    assert servers[1].seen == ["GET /simple/ HTTP/1.1"], servers[1].seen  # no POST ever reached a server
    records = [r for key in ("first", "second") for r in out[key]["touched"]["network"] if r["protocol"] != "udp"]
    judged = [r for r in records if r.get("request")]
    assert len(judged) == 5 and all(r.get("tls") == "terminated" for r in judged), json.dumps(records)
    refused = [r for r in judged if not r["allowed"]]
    assert sorted(r["request"] for r in refused) == ["POST /upload"] * 2, json.dumps(records)
    assert all("no rule allows https POST /upload" in str(r["reason"]) for r in refused), json.dumps(refused)
    bundle = Path(out["env"]["stdout"].strip())
    assert "make it again with the https rule" in out["refused"], out["refused"]
    shown = json.dumps(out["plain"])
    assert "127.0.0.3" in shown and "127.0.0.2" not in shown, shown  # the refused change was not kept
    assert bundle.read_bytes().count(b"BEGIN CERTIFICATE") >= 2 and len(list(bundle.parent.parent.glob("*.pem"))) == 2
