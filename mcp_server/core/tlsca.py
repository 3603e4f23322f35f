"""The CA the egress proxy signs with when it terminates a capsule's TLS, and the leaves it issues.

Pure logic (no I/O; fs/castore.py keeps the CA in the state dir and makes the capsule's
bundle).  The proxy terminates TLS only for hosts where a rule needs to see the request
(a secret bound there, or a method/path rule: issue 38); every other host stays an
end-to-end tunnel.  Some facts about X.509 that decide what this CA is:

- **Name constraints hold at the client.**  A CA certificate with a critical
  NameConstraints extension makes every verifier that implements RFC 5280 (OpenSSL, so
  Python, curl and git; Go; NSS; BoringSSL in Node) refuse a leaf below it naming
  anything outside the permitted subtrees.  So the CA's key, if it leaked from the state
  dir, could not mint a certificate a capsule (or anyone else trusting it by mistake)
  would accept for any other name: the limit is in the certificate, not in our code.
- **A dNSName subtree is a domain**, not a name: ``git.example`` permits
  ``git.example`` and every name under it (``a.git.example``).  RFC 5280 has no "exactly
  this name".  ccw itself signs only exact bound names (``Authority.leaf``); what the
  constraint bounds is a leaked key, and names under a bound host are that host's
  owner's.
- **Constraints are per name type.**  Subtrees of dNSName say nothing of iPAddress, so
  a CA permitting only names could still sign for any IP address.  So every family with
  no bound host is excluded whole (``0.0.0.0/0``, ``::/0``), and with no bound name the
  DNS subtree permitted is ``ccw.invalid`` (RFC 6761: never resolves).
- **The constraint is signed into the CA**, so the CA is made again when the set of
  hosts that need it changes (fs/castore.py compares them).  Capsules already running
  keep the CA object they were made with (the proxy holds it in memory, and their
  bundle names it), so a remake never breaks their connections; a new capsule gets the
  new CA.  The alternative, one CA per host, would put a CA per secret into every
  bundle for no gain: the set is what a person bound, and is small.
- **ECDSA P-256**, made with ``cryptography``: a key in well under a millisecond, a
  signature in about one (the costs are in bench/parts/tlsca.py), and every TLS client
  in use accepts it.  ``path_length=0``: the CA signs leaves only, never another CA.
  Its EKU is serverAuth, which OpenSSL holds the chain to: it cannot sign a client
  certificate or code.
- **Leaves are short-lived** (``LEAF_LIFETIME``, one day) and held only in memory
  (``LeafCache``), issued again when they near their end; the CA lives ``CA_LIFETIME``
  and is remade ``CA_RENEW`` before it ends.  Both start ``SKEW`` in the past, for a
  jail whose clock is a little behind.
- **A leaf never outlives its CA.**  A verifier refuses a chain whose CA has ended,
  whatever the leaf says, so a leaf is cut at its CA's end (``sign_leaf``), and a CA
  that has ended signs nothing (``Authority.leaf``: UNAVAILABLE, saying what renews it).
- **A front end that runs for months renews the CA itself.**  The state dir's file is
  read at create and at a restart; a front end running past ``CA_RENEW`` before the
  CA's end would otherwise go on signing with it until clients refuse every leaf.
  ``LeafCache`` is given a ``renew`` (fs/castore.py's caller remakes the CA's file and
  the capsule's bundle): the first leaf asked for inside that window calls it, and the
  leaves of the old CA are dropped.  What a capsule sees: its bundle file is rewritten
  with the new CA in one rename; a client that reads it per process or per connection
  (curl, git, pip, a new Python) trusts the new leaves at once, one that loaded it
  before the renewal refuses them until it loads it again (so the renewal comes a week
  before the end, not at it, and at most once in ``CA_LIFETIME``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sandbox.errors import CcwError

CA_LIFETIME = dt.timedelta(days=90)
CA_RENEW = dt.timedelta(days=7)
LEAF_LIFETIME = dt.timedelta(days=1)
LEAF_RENEW = dt.timedelta(hours=1)
SKEW = dt.timedelta(minutes=5)
ALPN = ["http/1.1"]  # what a terminated connection speaks, to the jail and upstream (egress/tlsterm.py)
NO_NAME = "ccw.invalid"  # the DNS subtree permitted when no name is bound
EVERY_IP = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def constraints(hosts: Iterable[str]) -> x509.NameConstraints:
    """Permitted subtrees for exactly ``hosts`` (names and IP addresses), every other IP family excluded."""
    names = sorted({h for h in hosts if _ip(h) is None})
    addresses = sorted({a for a in map(_ip, hosts) if a is not None}, key=lambda a: (a.version, int(a)))
    permitted: list[x509.GeneralName] = [x509.DNSName(n) for n in names or [NO_NAME]]
    permitted += [x509.IPAddress(ipaddress.ip_network(a)) for a in addresses]
    families = {a.version for a in addresses}
    excluded: list[x509.GeneralName] = [x509.IPAddress(n) for n in EVERY_IP if n.version not in families]
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded or None)


def host_set_id(hosts: Iterable[str]) -> str:
    """A short id of a host set, in the CA's name so a person can tell two CAs apart."""
    return hashlib.sha256("\n".join(sorted(set(hosts))).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Leaf:
    """A server certificate for one host, and its key, in PEM."""

    host: str
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    not_after: dt.datetime


def _general_name(host: str) -> x509.GeneralName:
    address = _ip(host)
    return x509.DNSName(host) if address is None else x509.IPAddress(address)


def sign_leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, host: str, now: dt.datetime,
              lifetime: dt.timedelta = LEAF_LIFETIME) -> Leaf:
    """A leaf for ``host`` signed by the CA, with no check of the CA's constraints (``Authority.leaf`` checks)."""
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)  # never past its CA's end
    # No CN for an address: OpenSSL checks a CN against the DNS subtrees when the leaf has no
    # DNS name, and an address is in none; the subject is then empty, so the SAN is critical.
    address = _ip(host) is not None
    subject = [] if address else [x509.NameAttribute(NameOID.COMMON_NAME, host)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_general_name(host)]), critical=address)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return Leaf(host, cert.public_bytes(serialization.Encoding.PEM), key_pem, not_after)


class Authority:
    """A name-constrained CA: its key and certificate, and the exact hosts it was made for."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.key, self.cert = key, cert
        self.hosts = _permitted(cert)

    @property
    def not_after(self) -> dt.datetime:
        """When the CA's certificate ends."""
        return self.cert.not_valid_after_utc

    def cert_pem(self) -> bytes:
        """The CA's certificate, for a capsule's bundle."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def to_pem(self) -> bytes:
        """Key and certificate, as fs/castore.py keeps them (mode 0600)."""
        key = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())
        return key + self.cert_pem()

    @classmethod
    def from_pem(cls, data: bytes) -> Authority:
        """Read back what ``to_pem`` wrote; ValueError if it is not a key and a constrained CA of ours."""
        key = serialization.load_pem_private_key(data, password=None)
        cert = x509.load_pem_x509_certificate(data[data.index(b"-----BEGIN CERTIFICATE-----"):])
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError("the key is not the certificate's")
        return cls(key, cert)

    def permits(self, host: str) -> bool:
        """True if ``host`` is exactly one of the hosts this CA was made for."""
        return host in self.hosts

    def fits(self, hosts: Iterable[str], now: dt.datetime) -> bool:
        """True if this CA was made for exactly ``hosts`` and is not near its end."""
        return self.hosts == frozenset(hosts) and not self.due(now)

    def leaf(self, host: str, now: dt.datetime) -> Leaf:
        """A leaf for ``host``; CONFLICT if the CA was not made for it, UNAVAILABLE once the CA has ended."""
        if not self.permits(host):
            raise CcwError("CONFLICT", f"the TLS CA was made for {', '.join(sorted(self.hosts))}, not {host}: "
                           "it is made again when the hosts that need it change; a capsule made before that "
                           "change does not reach the new host through termination", {"host": host})
        if now >= self.not_after:
            raise CcwError("UNAVAILABLE", f"the TLS CA for {host} ended at {self.not_after.isoformat()}: a front "
                           "end renews it before its end; restart the front end (ccw-mcp) to make it again",
                           {"host": host, "not_after": self.not_after.isoformat()})
        return sign_leaf(self.key, self.cert, host, now)

    def due(self, now: dt.datetime) -> bool:
        """True once the CA is within ``CA_RENEW`` of its end: time to make it again (``LeafCache``)."""
        return now + CA_RENEW >= self.not_after


def _permitted(cert: x509.Certificate) -> frozenset[str]:
    subtrees = cert.extensions.get_extension_for_class(x509.NameConstraints).value.permitted_subtrees or []
    hosts = set()
    for subtree in subtrees:
        if isinstance(subtree, x509.DNSName) and subtree.value != NO_NAME:
            hosts.add(subtree.value)
        elif isinstance(subtree, x509.IPAddress) and isinstance(subtree.value, IPNetwork):
            hosts.add(str(subtree.value.network_address))
    return frozenset(hosts)


def make_authority(hosts: Iterable[str], now: dt.datetime) -> Authority:
    """A fresh CA constrained to exactly ``hosts`` (names and IP addresses, no ports)."""
    chosen = sorted(set(hosts))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ccw"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"ccw capsule CA {host_set_id(chosen)}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(constraints(chosen), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


class LeafCache:
    """Leaves of one CA by host, in memory only, issued again when less than ``LEAF_RENEW`` is left;
    the CA itself made again through ``renew`` once it is due (the module's notes)."""

    def __init__(self, authority: Authority, renew: Callable[[dt.datetime], Authority] | None = None) -> None:
        self.authority = authority
        self.renew = renew
        self._leaves: dict[str, Leaf] = {}

    def get(self, host: str, now: dt.datetime) -> Leaf:
        """The cached leaf for ``host``, or a new one (of a renewed CA, when it was due)."""
        if self.renew is not None and self.authority.due(now):
            renewed = self.renew(now)
            if renewed.cert != self.authority.cert:
                self.authority, self._leaves = renewed, {}
        leaf = self._leaves.get(host)
        if leaf is None or now + LEAF_RENEW >= leaf.not_after:
            leaf = self._leaves[host] = self.authority.leaf(host, now)
        return leaf
