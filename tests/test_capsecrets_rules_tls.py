"""capsules/capsecrets.py and egress/tlsterm.py for https method/path rules (issue 38): a capsule
whose only rule is ``READ https://HOST/**`` gets a CA for HOST (no secret needed) and the
bundle's variables; a rule added live for another host gets a second CA, appended to the
bundle, while the first stays as it was; the proxy terminates the rules' hosts; a capsule
made without any CA refuses a live https rule, saying to make it again."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import trio

from mcp_server.capsules import capsecrets
from mcp_server.core import httprules
from mcp_server.core.netrules import NetworkSpec, changed, parse_network
from mcp_server.core.tlsca import Authority
from mcp_server.egress import tlsterm
from mcp_server.egress.credentials import Credentials
from mcp_server.egress.relay import Attempt, Gate
from mcp_server.fs.castore import BUNDLE_ENV
from sandbox.errors import CcwError


class Holder(dict[str, Credentials]):
    def credentials(self, capsule_id: str) -> Credentials | None:
        return self.get(capsule_id)

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None:
        self[capsule_id] = credentials


class RuledCarrier:
    """The two sides of a session terminated_hosts asks: its credentials and its rules in force."""

    def __init__(self, credentials: Credentials, spec: NetworkSpec) -> None:
        self.credentials, self.spec = credentials, spec

    @property
    def requests(self) -> httprules.RequestRules:
        return httprules.of(self.spec)

    def refuse(self, attempt: Attempt, reason: str) -> None:
        raise AssertionError(reason)


def spec(*rules: str) -> NetworkSpec:
    made = parse_network(list(rules))
    assert made is not None
    return made


@pytest.fixture
def root(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return state


def made(root: Path, network: NetworkSpec, capsule_id: str = "cap_1") -> tuple[Credentials, Holder]:
    """A capsule made with ``network`` and no secret, as capsules/service.py's create does it."""
    https = capsecrets.tls_hosts(network)
    given = trio.run(capsecrets.for_create, root, (), network, https)
    assert given is not None
    capsecrets.remember(root, capsule_id, (), given, https)
    holder = Holder()
    holder.give_credentials(capsule_id, given)
    return given, holder


def test_an_https_rule_alone_gets_a_ca_for_its_host_and_the_bundle_variables(root: Path) -> None:
    network = spec("READ https://pypi.example/**", "GET http://plain.example/x", "api.example")
    assert capsecrets.tls_hosts(network) == {"pypi.example"}  # not the http rule's host, nor a host rule's
    given, _holder = made(root, network)
    assert given.bundle is not None and given.contexts is not None and given.capsule.env() == {}
    [key_file] = (root / capsecrets.TLS_DIR).glob("*.pem")
    authority = Authority.from_pem(key_file.read_bytes())
    assert authority.hosts == frozenset({"pypi.example"})
    assert Path(given.bundle).read_bytes().endswith(authority.cert_pem())
    given.contexts.get("pypi.example")
    with pytest.raises(CcwError) as caught:
        given.contexts.get("api.example")  # allowed, but tunnelled: no leaf for it
    assert caught.value.code == "CONFLICT"
    assert set(capsecrets.whitelist(("PATH",), (), True)) == {"PATH", *BUNDLE_ENV}
    env = trio.run(capsecrets.env, root, Holder(), "cap_1")  # a front end started since
    assert env == dict.fromkeys(BUNDLE_ENV, given.bundle)
    plain = spec("api.example")
    assert trio.run(capsecrets.for_create, root, (), plain, capsecrets.tls_hosts(plain)) is None


def test_the_proxy_terminates_the_rules_hosts_in_force(root: Path) -> None:
    network = spec("READ https://pypi.example/**", "GET http://plain.example/x")
    given, _holder = made(root, network)
    session = RuledCarrier(given, network)
    contexts, pairs = tlsterm.terminated_hosts(cast(Gate, session))
    assert contexts is given.contexts and pairs == {("pypi.example", 443)}
    session.spec = changed(network, ["GET https://other.example:8443/**"])
    assert tlsterm.terminated_hosts(cast(Gate, session))[1] == {("pypi.example", 443), ("other.example", 8443)}


def test_a_live_rule_for_a_new_host_gets_its_own_ca_appended(root: Path) -> None:
    network = spec("READ https://pypi.example/**")
    given, holder = made(root, network)
    assert given.bundle is not None
    before = Path(given.bundle).read_bytes()
    first = given.contexts
    trio.run(capsecrets.extend, root, holder, "cap_1", changed(network, ["GET https://other.example/**"]))
    after = Path(given.bundle).read_bytes()
    assert after.startswith(before) and len(after) > len(before)  # appended: the first CA is still trusted
    authorities = {frozenset(a.hosts) for a in map(
        Authority.from_pem, (p.read_bytes() for p in (root / capsecrets.TLS_DIR).glob("*.pem")))}
    assert authorities == {frozenset({"pypi.example"}), frozenset({"other.example"})}  # each for its own hosts
    assert given.contexts is not first and given.contexts is not None
    given.contexts.get("other.example")
    given.contexts.get("pypi.example")
    trio.run(capsecrets.extend, root, holder, "cap_1", changed(network, ["GET https://other.example/**"]))
    assert Path(given.bundle).read_bytes() == after  # nothing new: no third CA
    env = trio.run(capsecrets.env, root, Holder(), "cap_1")  # a front end started since: both CAs again
    assert env["SSL_CERT_FILE"] == given.bundle and Path(given.bundle).read_bytes() == after
    capsecrets.forget(root, "cap_1")
    assert list((root / capsecrets.TLS_DIR).iterdir()) == []


def test_a_live_https_rule_on_a_capsule_made_without_a_ca_is_refused(root: Path) -> None:
    plain = spec("api.example")
    check = capsecrets.terminable(root, "cap_plain")
    assert check(plain, changed(plain, ["GET http://plain.example/x"])) is not None  # plain http: no TLS needed
    with pytest.raises(CcwError) as caught:
        check(plain, changed(plain, ["READ https://pypi.example/**"]))
    assert caught.value.code == "INVALID_ARGUMENT" and "make it again" in caught.value.message
    network = spec("READ https://pypi.example/**")
    made(root, network, "cap_ca")
    assert capsecrets.terminable(root, "cap_ca")(network, changed(network, ["READ https://other.example/**"]))


def test_a_fork_and_its_parent_each_adding_a_host_live_keep_both_cas_in_their_shared_bundle(root: Path) -> None:
    network = spec("READ https://pypi.example/**")
    given, holder = made(root, network)
    assert given.bundle is not None
    capsecrets.inherit(root, "cap_1", "cap_2")  # the fork is shown its parent's bundle (the same directory)
    trio.run(capsecrets.env, root, holder, "cap_2")
    fork = holder.credentials("cap_2")
    assert fork is not None and fork.bundle == given.bundle
    trio.run(capsecrets.extend, root, holder, "cap_1", changed(network, ["GET https://a.example/**"]))
    trio.run(capsecrets.extend, root, holder, "cap_2", changed(network, ["GET https://b.example/**"]))
    keys = {frozenset(a.hosts): a for a in (Authority.from_pem(p.read_bytes())
                                            for p in (root / capsecrets.TLS_DIR).glob("*.pem"))}
    assert set(keys) == {frozenset({"pypi.example"}), frozenset({"a.example"}), frozenset({"b.example"})}
    shared = Path(given.bundle).read_bytes()
    assert all(authority.cert_pem() in shared for authority in keys.values())  # neither dropped the other's
    assert given.contexts is not None and fork.contexts is not None
    given.contexts.get("a.example")
    with pytest.raises(CcwError):
        given.contexts.get("b.example")  # each proxy signs only for its own capsule's hosts
    fork.contexts.get("b.example")
