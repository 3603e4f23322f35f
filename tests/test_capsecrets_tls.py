"""capsules/capsecrets.py's TLS side: a CA per capsule, name-constrained to its secrets' hosts,
its key 0600 and never in the bundle the capsule trusts, the bundle's variables, the same CA
after a restart, and its files removed with the last capsule that uses it (a fork shares it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from mcp_server.capsules import capsecrets
from mcp_server.core.netrules import parse_network
from mcp_server.core.secretbind import make_binding
from mcp_server.core.tlsca import Authority
from mcp_server.egress.credentials import Credentials
from mcp_server.fs.castore import BUNDLE_ENV
from mcp_server.fs.secretstore import SecretStore

VALUE = b"v4lue-" + b"x" * 34
ALLOWED = parse_network(["git.example", "api.example"])  # a host of each secret


class Holder:
    def __init__(self) -> None:
        self.given: dict[str, Credentials] = {}

    def credentials(self, capsule_id: str) -> Credentials | None:
        return self.given.get(capsule_id)

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None:
        self.given[capsule_id] = credentials


@pytest.fixture
def root(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = SecretStore(state)
    store.put(make_binding("TOKEN", ["git.example", "10.1.2.3:8443"]), "stdin", VALUE)
    store.put(make_binding("OTHER", ["api.example"]), "stdin", VALUE)
    return state


def test_a_capsule_gets_its_own_constrained_ca_and_a_bundle_it_can_only_read(root: Path) -> None:
    given = trio.run(capsecrets.for_create, root, ("TOKEN",), ALLOWED)
    assert given is not None and given.bundle is not None and given.contexts is not None
    bundle = Path(given.bundle)
    [key_file] = (root / capsecrets.TLS_DIR).glob("*.pem")
    authority = Authority.from_pem(key_file.read_bytes())
    assert authority.hosts == frozenset({"git.example", "10.1.2.3"})  # not OTHER's api.example
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and stat.S_IMODE(bundle.stat().st_mode) == 0o644
    assert bundle.read_bytes().endswith(authority.cert_pem()) and b"PRIVATE KEY" not in bundle.read_bytes()
    assert key_file.parent == bundle.parent.parent  # the key lies beside the directory the capsule is shown
    assert capsecrets.shown(("/opt/tool",), given) == tuple(sorted(("/opt/tool", str(bundle.parent))))
    assert set(capsecrets.whitelist(("PATH",), ("TOKEN",))) == {"PATH", "TOKEN", *BUNDLE_ENV}
    assert capsecrets.whitelist(("PATH",), ()) == ("PATH",)
    given.contexts.get("git.example")  # a leaf for a bound name
    other = trio.run(capsecrets.for_create, root, ("OTHER",), ALLOWED)
    assert other is not None and other.bundle != given.bundle  # another capsule, another CA


def test_the_same_ca_after_a_restart_and_removed_with_its_last_capsule(root: Path) -> None:
    given = trio.run(capsecrets.for_create, root, ("TOKEN",), ALLOWED)
    assert given is not None and given.bundle is not None
    capsecrets.remember(root, "cap_1", ["TOKEN"], given)
    first = Path(given.bundle).read_bytes()
    env = trio.run(capsecrets.env, root, Holder(), "cap_1")  # a front end started since
    assert {name: env[name] for name in BUNDLE_ENV} == dict.fromkeys(BUNDLE_ENV, given.bundle)
    assert Path(given.bundle).read_bytes() == first  # the same CA, so running clients still trust it
    capsecrets.inherit(root, "cap_1", "cap_2")  # a fork: the same secrets, the same CA
    capsecrets.forget(root, "cap_1")
    assert Path(given.bundle).exists()
    capsecrets.forget(root, "cap_2")
    assert not Path(given.bundle).parent.exists() and list((root / capsecrets.TLS_DIR).iterdir()) == []
    assert not os.path.exists(root / capsecrets.DIR_NAME / "cap_2")
