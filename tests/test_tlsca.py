"""core/tlsca with fs/castore, against ordinary clients: a leaf for a bound name is accepted by
Python's ssl, curl and openssl s_client trusting the CA; a leaf the same CA signs for any
other name or address is refused by each of them (the name constraint holds at the client)."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from mcp_server.core.tlsca import LEAF_RENEW, Authority, Leaf, LeafCache, make_authority, sign_leaf
from mcp_server.fs.castore import (
    ALPN,
    BUNDLE_ENV,
    ServerContexts,
    bundle,
    bundle_env,
    server_context,
    system_bundle,
)
from sandbox.errors import CcwError

NOW = dt.datetime.now(dt.UTC)
BOUND = ["git.test", "pypi.test", "127.0.0.1"]
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@contextlib.contextmanager
def _tls_server(leaf: Leaf) -> Iterator[int]:
    """A loopback TLS server presenting ``leaf`` to every connection until the block ends; yields its port."""
    context = server_context(leaf)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                try:
                    with context.wrap_socket(conn, server_side=True) as tls:
                        tls.recv(4096)
                        tls.sendall(RESPONSE)
                except (ssl.SSLError, OSError):
                    pass  # a client that refused our certificate hangs up mid-handshake

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.fixture(scope="module")
def authority() -> Authority:
    return make_authority(BOUND, NOW)


@pytest.fixture(scope="module")
def ca_bundle(authority: Authority, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "ca.pem"
    path.write_bytes(authority.cert_pem())  # this CA alone: a public CA cannot be what accepted
    return path


def _python_get(port: int, name: str, cafile: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(cafile))
    context.set_alpn_protocols(["h2", "http/1.1"])  # as an HTTP/2-capable client offers
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: " + name.encode() + b"\r\n\r\n")
        assert tls.selected_alpn_protocol() == "http/1.1" and ALPN == ["http/1.1"]  # HTTP/1.1 is spoken to the jail
        return tls.recv(4096)


def _curl(port: int, name: str, cafile: Path) -> subprocess.CompletedProcess[str]:
    # --connect-to: whatever the URL names, the connection goes to loopback (curl still checks the name)
    return subprocess.run(["curl", "-sS", "--max-time", "20", "--noproxy", "*", "--cacert", str(cafile),
                           "--connect-to", f"::127.0.0.1:{port}",
                           f"https://{name}:{port}/"], capture_output=True, text=True, check=False, env={})


def _s_client(port: int, name: str, cafile: Path) -> subprocess.CompletedProcess[str]:
    check = ["-verify_ip", name] if name[0].isdigit() else ["-servername", name, "-verify_hostname", name]
    return subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *check, "-CAfile", str(cafile),
                           "-verify_return_error", "-brief"], input="", capture_output=True, text=True,
                          check=False, timeout=30)


needs_clients = pytest.mark.skipif(not (shutil.which("curl") and shutil.which("openssl")),
                                   reason="curl and openssl are what an ordinary client is here")


@needs_clients
@pytest.mark.parametrize("name", ["git.test", "127.0.0.1"])
def test_a_leaf_for_a_bound_host_is_accepted_by_ordinary_clients(authority: Authority, ca_bundle: Path,
                                                                  name: str) -> None:
    with _tls_server(authority.leaf(name, NOW)) as port:
        assert _python_get(port, name, ca_bundle).endswith(b"ok")
        curl = _curl(port, name, ca_bundle)
        assert curl.returncode == 0 and curl.stdout == "ok", curl.stderr
        s_client = _s_client(port, name, ca_bundle)
        assert s_client.returncode == 0, s_client.stderr


@needs_clients
@pytest.mark.parametrize("name", ["evil.test", "git.test.evil.test", "10.0.0.1", "127.0.0.2"])
def test_a_leaf_outside_the_constraint_is_refused_by_ordinary_clients(authority: Authority, ca_bundle: Path,
                                                                      name: str) -> None:
    with pytest.raises(CcwError):
        authority.leaf(name, NOW)  # ccw never signs it; the key could (a leak): the clients still refuse
    rogue = sign_leaf(authority.key, authority.cert, name, NOW)
    with _tls_server(rogue) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match=r"subtree|name constraint|permitted"):
            _python_get(port, name, ca_bundle)
        curl = _curl(port, name, ca_bundle)
        assert curl.returncode == 60 and curl.stdout == "", curl.stderr  # 60: peer certificate not verified
        s_client = _s_client(port, name, ca_bundle)
        assert s_client.returncode != 0 and "subtree" in s_client.stderr + s_client.stdout


def test_a_name_under_a_bound_host_is_within_the_subtree(authority: Authority, ca_bundle: Path) -> None:
    # RFC 5280 has no exact-name constraint: a.git.test is under git.test.  ccw does not sign it.
    with pytest.raises(CcwError, match=r"not a\.git\.test"):
        authority.leaf("a.git.test", NOW)
    with _tls_server(sign_leaf(authority.key, authority.cert, "a.git.test", NOW)) as port:
        assert _python_get(port, "a.git.test", ca_bundle).endswith(b"ok")


def test_a_ca_for_names_only_signs_for_no_address_and_one_for_addresses_for_no_name(tmp_path: Path) -> None:
    names_only, addresses_only = make_authority(["git.test"], NOW), make_authority(["127.0.0.1"], NOW)
    assert names_only.hosts == {"git.test"} and addresses_only.hosts == {"127.0.0.1"}
    for ca, outside in ((names_only, "127.0.0.1"), (addresses_only, "git.test")):
        (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
        with _tls_server(sign_leaf(ca.key, ca.cert, outside, NOW)) as port, \
                pytest.raises(ssl.SSLCertVerificationError):
            _python_get(port, outside, tmp_path / "ca.pem")


def test_the_ca_certificate_says_what_it_may_sign(authority: Authority) -> None:
    cert = authority.cert
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    constraint = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraint.critical
    assert {str(n.value) for n in constraint.value.permitted_subtrees or []} == {"git.test", "pypi.test",
                                                                                 "127.0.0.1/32"}
    assert {str(n.value) for n in constraint.value.excluded_subtrees or []} == {"::/0"}
    assert Authority.from_pem(authority.to_pem()).hosts == frozenset(BOUND)


def test_leaves_are_short_lived_and_cached_until_near_their_end(authority: Authority) -> None:
    cache = LeafCache(authority)
    first = cache.get("git.test", NOW)
    assert cache.get("git.test", NOW + dt.timedelta(hours=2)) is first
    later = cache.get("git.test", first.not_after - LEAF_RENEW)
    assert later is not first and later.not_after > first.not_after
    assert first.not_after - NOW == dt.timedelta(days=1)
    assert b"PRIVATE" in first.key_pem and "PRIVATE" not in repr(first)
    contexts = ServerContexts(authority)
    context = contexts.get("git.test", NOW)
    assert contexts.get("git.test", NOW + dt.timedelta(hours=2)) is context
    assert contexts.get("git.test", NOW + dt.timedelta(days=1)) is not context
    with pytest.raises(CcwError):
        contexts.get("evil.test", NOW)


def test_the_bundle_is_the_system_one_then_the_ca_and_every_variable_names_it(authority: Authority) -> None:
    made = bundle(authority, b"SYSTEM")
    assert made == b"SYSTEM\n" + authority.cert_pem()
    assert bundle(authority).startswith(system_bundle())
    env = bundle_env("/etc/ccw/ca-bundle.pem")
    assert set(env) == set(BUNDLE_ENV) == {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                                           "GIT_SSL_CAINFO", "PIP_CERT", "CURL_CA_BUNDLE"}
    assert set(env.values()) == {"/etc/ccw/ca-bundle.pem"}
