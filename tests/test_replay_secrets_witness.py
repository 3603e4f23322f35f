"""capsules/replay_secrets.py: a witness of a capsule with secrets names them and their hosts, never a
value; replayed in another state dir it binds that state dir's secret of the same name when it is
bound to the same hosts, and is refused naming the secret otherwise (NOT_FOUND with the
``ccw secret set`` that makes it, CONFLICT naming the hosts that differ, PERMISSION_DENIED for a
witness that state dir does not trust)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules import capsecrets, replay_secrets
from mcp_server.core.secretbind import make_binding
from mcp_server.egress.credentials import Credentials
from mcp_server.fs.castore import BUNDLE_ENV
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError

VALUE = b"ghp_the-real-token-" + b"x" * 21
OTHER_VALUE = b"ghp_another-state-dirs-token-" + b"y" * 11


class Holder(dict[str, Credentials]):
    def credentials(self, capsule_id: str) -> Credentials | None:
        return self.get(capsule_id)

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None:
        self[capsule_id] = credentials


def state_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def witnessed(root: Path) -> dict[str, Any]:
    """The manifest part a witness of a capsule made with ``secrets: [GIT_TOKEN]`` carries."""
    SecretStore(root).put(make_binding("GIT_TOKEN", ["git.test:443", "git.test:8443"]), "stdin", VALUE)
    capsecrets.remember(root, "cap_1", ["GIT_TOKEN"])
    manifest: dict[str, Any] = {"capsule": {"env_whitelist": ["GIT_TOKEN"], "limits": {}}}
    replay_secrets.mark_witness(manifest, root, "cap_1")
    return manifest


def test_a_witness_names_the_secrets_and_their_hosts_never_a_value(tmp_path: Path) -> None:
    manifest = witnessed(state_dir(tmp_path / "a"))
    assert manifest["capsule"]["secrets"] == [{"name": "GIT_TOKEN", "hosts": ["git.test:443", "git.test:8443"]}]
    assert VALUE.decode() not in json.dumps(manifest)
    plain: dict[str, Any] = {"capsule": {"env_whitelist": [], "limits": {}}}
    replay_secrets.mark_witness(plain, tmp_path / "a", "cap_without_secrets")
    assert plain == {"capsule": {"env_whitelist": [], "limits": {}}}  # as before: no key at all


def test_another_state_dir_without_the_secret_refuses_naming_it_and_how_to_set_it(tmp_path: Path) -> None:
    manifest = witnessed(state_dir(tmp_path / "a"))
    other = state_dir(tmp_path / "b")
    with pytest.raises(CcwError) as refused:
        trio.run(replay_secrets.given, other, manifest, True)
    assert refused.value.code == "NOT_FOUND"
    assert "GIT_TOKEN" in refused.value.message
    assert "`ccw secret set GIT_TOKEN --host git.test:443 --host git.test:8443`" in refused.value.message
    assert refused.value.details == {"secret": "GIT_TOKEN", "hosts": ["git.test:443", "git.test:8443"]}


def test_a_witness_this_state_dir_does_not_trust_gets_none_of_its_secrets(tmp_path: Path) -> None:
    manifest = witnessed(state_dir(tmp_path / "a"))
    other = state_dir(tmp_path / "b")
    SecretStore(other).put(make_binding("GIT_TOKEN", ["git.test:443", "git.test:8443"]), "stdin", OTHER_VALUE)
    with pytest.raises(CcwError) as refused:
        trio.run(replay_secrets.given, other, manifest, False)  # replayed with allow_untrusted
    assert refused.value.code == "PERMISSION_DENIED" and refused.value.details == {"secrets": ["GIT_TOKEN"]}
    assert "GIT_TOKEN" in refused.value.message and "ccw witness trust" in refused.value.message
    assert not (other / capsecrets.TLS_DIR).exists()  # nothing made for it


def test_a_secret_bound_to_other_hosts_refuses_naming_the_host(tmp_path: Path) -> None:
    manifest = witnessed(state_dir(tmp_path / "a"))
    other = state_dir(tmp_path / "b")
    SecretStore(other).put(make_binding("GIT_TOKEN", ["git.test:443", "evil.test:443"]), "stdin", OTHER_VALUE)
    with pytest.raises(CcwError) as refused:
        replay_secrets.check(other, manifest)
    assert refused.value.code == "CONFLICT"
    assert "GIT_TOKEN" in refused.value.message and "evil.test:443" in refused.value.message
    assert refused.value.details is not None
    assert refused.value.details["differing"] == ["evil.test:443", "git.test:8443"]
    assert OTHER_VALUE.decode() not in refused.value.message + json.dumps(refused.value.details)


def test_the_same_hosts_bind_this_state_dirs_secret_with_fresh_placeholders(tmp_path: Path) -> None:
    first = state_dir(tmp_path / "a")
    manifest = witnessed(first)
    other = state_dir(tmp_path / "b")
    SecretStore(other).put(make_binding("GIT_TOKEN", ["git.test:8443", "git.test:443"]), "stdin", OTHER_VALUE)
    made = trio.run(replay_secrets.given, other, manifest, True)
    assert made is not None and made.bundle is not None and made.bundle.startswith(str(other))
    variables = replay_secrets.env(made)
    assert set(variables) == {"GIT_TOKEN", *BUNDLE_ENV}
    placeholder = variables["GIT_TOKEN"]
    assert OTHER_VALUE.decode() not in placeholder and VALUE.decode() not in placeholder
    # What the replay's proxy swaps in, at a bound host: this state dir's value.
    judged = made.judge(f"GET / HTTP/1.1\r\nHost: git.test\r\nAuthorization: Bearer {placeholder}\r\n\r\n"
                        .encode(), "git.test", 443)
    assert judged.head is not None and b"Bearer " + OTHER_VALUE in judged.head
    holder, bundle = Holder(), made.bundle

    async def replayed() -> None:
        async with replay_secrets.held(other, holder, "cap_replay", made):
            assert holder.credentials("cap_replay") is made and await trio.Path(bundle).exists()
        assert not await trio.Path(bundle).exists()  # its CA's files go with the replay

    trio.run(replayed)
    assert replay_secrets.env(None) == {} and trio.run(replay_secrets.given, other, {"capsule": {}}, False) is None


def test_a_malformed_secrets_entry_is_refused(tmp_path: Path) -> None:
    for bad in ("GIT_TOKEN", [{"name": "GIT_TOKEN"}], [{"name": 1, "hosts": []}], [{"name": "A", "hosts": [2]}]):
        with pytest.raises(CcwError) as refused:
            replay_secrets.check(state_dir(tmp_path / str(abs(hash(str(bad))))), {"capsule": {"secrets": bad}})
        assert refused.value.code == "INVALID_ARGUMENT" and "capsule.secrets" in refused.value.message
