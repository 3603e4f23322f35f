"""The state dir's TLS CA (core/tlsca.py says what it may sign), the capsule's CA bundle, and a leaf's TLS context.

- **Kept** in ``<state dir>/tls-ca.pem`` (key then certificate), mode 0600, read with
  O_NOFOLLOW and trusted only if private, replaced in one rename under an flock of
  ``tls-ca.lock`` (fs/privatefile.py).  ``load_or_make`` returns it if it was made for
  exactly the hosts asked and is not near its end, else makes a new one in its place.
  A file that is not a CA of ours is refused (CONFLICT), never silently replaced: it may
  be what someone put there for a reason.
- **The capsule's bundle** is the host's system bundle (the file OpenSSL's default paths
  name) followed by this CA's certificate: the jail trusts the public CAs as before, for
  the hosts that stay end-to-end tunnels, and this CA for the terminated ones.  Clients
  find it through ``BUNDLE_ENV``: OpenSSL's ``SSL_CERT_FILE`` (Python, Ruby, most C),
  requests' ``REQUESTS_CA_BUNDLE``, Node's ``NODE_EXTRA_CA_CERTS`` (added to its own
  list), git's ``GIT_SSL_CAINFO``, pip's ``PIP_CERT`` and curl's ``CURL_CA_BUNDLE``.
- **A leaf's TLS context** is loaded through a memfd: ``ssl`` loads a certificate
  and key only from a path, and a leaf's key must not touch the disk.  ALPN offers
  ``http/1.1`` only, so a jail speaking HTTP/2 to a terminated host finds out in the
  handshake.  Loading one costs about as much as a handshake (OpenSSL 3's PEM decoders:
  bench/parts/tlsca.py), so ``ServerContexts`` keeps one per host for as long as its leaf.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path

from mcp_server.core.tlsca import ALPN, Authority, Leaf, LeafCache, make_authority
from mcp_server.fs.privatefile import locked, read_private, replace_private, state_dir_fd
from sandbox.errors import CcwError, wrap_oserror

CA_NAME = "tls-ca.pem"
LOCK_NAME = "tls-ca.lock"
MAX_CA_FILE = 64 << 10
MAX_SYSTEM_BUNDLE = 16 << 20
WHAT = "the TLS CA"
BUNDLE_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT",
              "CURL_CA_BUNDLE")


def load_or_make(state_dir: str | Path, hosts: Iterable[str], now: dt.datetime | None = None,
                 name: str = CA_NAME) -> Authority:
    """The CA kept in ``state_dir/name`` for exactly ``hosts`` (names and IPs, no ports), made
    (again) if it holds none that fits (capsules/capsecrets.py keeps one per capsule)."""
    wanted = sorted(set(hosts))
    when = now or dt.datetime.now(dt.UTC)
    path = str(Path(state_dir) / name)
    lock = f"{name}.lock" if name != CA_NAME else LOCK_NAME
    with state_dir_fd(state_dir) as dir_fd, locked(dir_fd, lock, str(Path(state_dir) / lock)):
        data = read_private(dir_fd, name, path, MAX_CA_FILE, WHAT)
        if data is not None:
            try:
                current = Authority.from_pem(data)
            except (ValueError, TypeError):
                raise CcwError("CONFLICT", f"{path} is not a TLS CA ccw made: move it away and ccw makes a new "
                               "one (capsules made after that trust the new one)", {"path": path}) from None
            if current.fits(wanted, when):
                return current
        authority = make_authority(wanted, when)
        replace_private(dir_fd, name, path, authority.to_pem(), WHAT)
        return authority


def system_bundle() -> bytes:
    """The host's CA bundle, as OpenSSL's default paths name it (empty if the host has none)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            with wrap_oserror("read the system CA bundle", candidate, "check its permissions"), \
                    open(candidate, "rb") as handle:
                return handle.read(MAX_SYSTEM_BUNDLE)
    return b""


def bundle(authority: Authority, system: bytes | None = None) -> bytes:
    """A capsule's CA bundle: the system's (``system``, else ``system_bundle()``), then this CA."""
    base = system_bundle() if system is None else system
    if base and not base.endswith(b"\n"):
        base += b"\n"
    return base + authority.cert_pem()


def bundle_env(path: str) -> dict[str, str]:
    """The variables that point a capsule's clients at the bundle at ``path`` (its path inside the jail)."""
    return dict.fromkeys(BUNDLE_ENV, path)


def server_context(leaf: Leaf) -> ssl.SSLContext:
    """A server-side TLS context presenting ``leaf``, loaded without writing its key to disk."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    fd = os.memfd_create(f"ccw-leaf-{leaf.host}", os.MFD_CLOEXEC)
    try:
        os.write(fd, leaf.key_pem + leaf.cert_pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return context


class ServerContexts:
    """A TLS server context per bound host, in memory, made again only when its leaf is (``LeafCache``,
    which calls ``renew`` for a new CA when this one nears its end: core/tlsca.py's notes)."""

    def __init__(self, authority: Authority, renew: Callable[[dt.datetime], Authority] | None = None) -> None:
        self.leaves = LeafCache(authority, renew)
        self._held: dict[str, tuple[Leaf, ssl.SSLContext]] = {}

    def get(self, host: str, now: dt.datetime | None = None) -> ssl.SSLContext:
        """The context presenting ``host``'s current leaf; CONFLICT if the CA was not made for ``host``."""
        leaf = self.leaves.get(host, now or dt.datetime.now(dt.UTC))
        held = self._held.get(host)
        if held is None or held[0] is not leaf:
            held = self._held[host] = (leaf, server_context(leaf))
        return held[1]
