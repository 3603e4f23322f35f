"""The TLS CA's and its leaves' lifetime in a front end that runs for months (core/tlsca.py's notes,
issue 38): a leaf never outlives its CA, an ended CA signs nothing, and a capsule's CA is made
again a week before its end by the proxy's first leaf inside that window, its file and the
capsule's bundle rewritten, with the injected clock of ``Authorities.get``."""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from mcp_server.capsules import capsecrets
from mcp_server.core.tlsca import CA_LIFETIME, CA_RENEW, LEAF_LIFETIME, Authority, LeafCache, make_authority
from sandbox.errors import CcwError

HOST = "git.test"


def presented(server: ssl.SSLContext) -> x509.Certificate:
    """The leaf ``server`` presents for HOST, read in a handshake over memory BIOs.  Not checked
    by the client (the renewed CA's leaves start in the future this test's clock is set to)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    pipes = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    near = client.wrap_bio(pipes[0], pipes[1], server_hostname=HOST)
    far = server.wrap_bio(pipes[2], pipes[3], server_side=True)
    for _ in range(10):
        for side in (near, far):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        pipes[2].write(pipes[1].read())
        pipes[0].write(pipes[3].read())
        with contextlib.suppress(ValueError):  # the handshake not done yet
            der = near.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der)
    raise AssertionError("no handshake")


def issued_by(leaf: x509.Certificate, authority: Authority) -> bool:
    try:
        leaf.verify_directly_issued_by(authority.cert)
    except (ValueError, InvalidSignature):
        return False
    return True


def test_a_leaf_never_outlives_its_ca_and_an_ended_ca_signs_nothing() -> None:
    now = dt.datetime.now(dt.UTC)
    authority = make_authority([HOST], now)
    late = authority.not_after - dt.timedelta(hours=3)
    assert authority.leaf(HOST, now).not_after == now + LEAF_LIFETIME
    assert authority.leaf(HOST, late).not_after == authority.not_after  # cut at the CA's end
    with pytest.raises(CcwError) as ended:
        authority.leaf(HOST, authority.not_after)
    assert ended.value.code == "UNAVAILABLE" and "restart the front end" in ended.value.message
    # Without a way to renew, a cache keeps the CA it was given (and its leaves end with it).
    assert LeafCache(authority).get(HOST, late).not_after == authority.not_after


def test_a_cache_renews_its_ca_when_due_and_drops_the_old_leaves() -> None:
    now = dt.datetime.now(dt.UTC)
    old = make_authority([HOST], now)
    asked: list[dt.datetime] = []

    def renew(when: dt.datetime) -> Authority:
        asked.append(when)
        return make_authority([HOST], when)

    cache = LeafCache(old, renew)
    first = cache.get(HOST, now)
    assert cache.get(HOST, now + dt.timedelta(hours=2)) is first and not asked
    due = old.not_after - CA_RENEW
    renewed = cache.get(HOST, due)
    assert asked == [due] and cache.authority is not old
    assert renewed is not first and renewed.not_after == due + LEAF_LIFETIME
    assert cache.get(HOST, due + dt.timedelta(hours=1)) is renewed and asked == [due]  # once, not per leaf


@pytest.fixture
def root(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return state


def test_a_capsules_ca_is_renewed_by_a_front_end_that_runs_past_it(root: Path) -> None:
    given = capsecrets.credentials(root, [], "t1", [[HOST]])
    assert given.bundle is not None and given.contexts is not None
    bundle = Path(given.bundle)
    key_file = root / capsecrets.TLS_DIR / "t1.pem"
    first_key, first_bundle = key_file.read_bytes(), bundle.read_bytes()
    old = Authority.from_pem(first_key)
    now = dt.datetime.now(dt.UTC)
    assert issued_by(presented(given.contexts.get(HOST, now)), old)
    assert key_file.read_bytes() == first_key  # not due: nothing is made again
    due = old.not_after - CA_RENEW + dt.timedelta(minutes=1)
    leaf = presented(given.contexts.get(HOST, due))
    new = Authority.from_pem(key_file.read_bytes())
    assert new.cert != old.cert and new.hosts == old.hosts and new.not_after == due + CA_LIFETIME
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert issued_by(leaf, new) and not issued_by(leaf, old)
    # What the capsule sees: its bundle, rewritten in place, names the new CA instead of the old
    # one (a client that loaded it before refuses the new leaves until it loads it again).
    now_bundle = bundle.read_bytes()
    assert now_bundle.startswith(first_bundle[: first_bundle.index(old.cert_pem())])  # the system's CAs, as before
    assert new.cert_pem() in now_bundle and old.cert_pem() not in now_bundle
    # A front end started later loads the renewed CA as it is.
    again = capsecrets.credentials(root, [], "t1", [[HOST]])
    assert again.contexts is not None and key_file.read_bytes() == new.to_pem()
