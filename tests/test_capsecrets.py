"""capsules/capsecrets.py: a capsule's secrets by name, checked at create, and placeholders made
anew from the kept names (a restarted front end); never a value in what the capsule gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mcp_server.capsules import capsecrets
from mcp_server.core.netrules import parse_network
from mcp_server.core.secretbind import make_binding
from mcp_server.egress.credentials import Credentials
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError

VALUE = b"v4lue-" + b"x" * 34
ALLOWED = parse_network(["index.example:80"])  # the host TOKEN is bound to


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
    SecretStore(state).put(make_binding("TOKEN", ["index.example:80"]), "stdin", VALUE)
    return state


def test_create_needs_an_allowlist_and_known_names(root: Path) -> None:
    assert trio.run(capsecrets.for_create, root, (), None) is None
    with pytest.raises(CcwError) as none:
        trio.run(capsecrets.for_create, root, ("TOKEN",), None)
    assert none.value.code == "INVALID_ARGUMENT" and "allowlist" in none.value.message
    with pytest.raises(CcwError) as unknown:
        trio.run(capsecrets.for_create, root, ("TOKEN", "NOPE"), ALLOWED)
    assert unknown.value.code == "NOT_FOUND" and "ccw secret list" in unknown.value.message
    assert unknown.value.details == {"missing": ["NOPE"]}


def test_a_secret_no_rule_lets_reach_its_hosts_is_refused_at_create(root: Path, tmp_path: Path) -> None:
    """Its placeholder could never be swapped: refused before any value is read or CA made,
    naming the secret, its hosts and the rule to add; a rule for one of its hosts, or a
    capsule that asks a person on a miss, takes it."""
    ran = tmp_path / "ran"
    SecretStore(root).put(make_binding("API", ["https://api.example:8443", "[fd00::1]:8080"]), "command",
                          command=f"touch {ran}; printf %s {VALUE.decode()}")
    ran.unlink()  # put ran it once, to check it
    with pytest.raises(CcwError) as refused:
        trio.run(capsecrets.for_create, root, ("API", "TOKEN"), parse_network(["pypi.org", "index.example:443"]))
    error = refused.value
    assert error.code == "INVALID_ARGUMENT"
    assert "secret API is bound to https://api.example:8443, [fd00::1]:8080; secret TOKEN is bound to " \
           "index.example:80, and no rule" in error.message
    assert 'network: [..., "api.example:8443"], or ccw capsule create --network api.example:8443' in error.message
    assert error.details == {"secrets": {"API": ["https://api.example:8443", "[fd00::1]:8080"],
                                         "TOKEN": ["index.example:80"]}, "allowed": "index.example:443, pypi.org"}
    assert not ran.exists() and not (root / capsecrets.TLS_DIR).exists()  # no value read, no CA made
    for rules in (["*.example:8443", "index.example:80"], ["[fd00::1]:8080", "index.example"],
                  {"allow": ["pypi.org"], "on_miss": "ask"}):
        given = trio.run(capsecrets.for_create, root, ("API", "TOKEN"), parse_network(rules))
        assert given is not None and sorted(given.capsule.env()) == ["API", "TOKEN"]


def test_placeholders_hold_no_value_and_are_made_anew_after_a_restart(root: Path) -> None:
    given = trio.run(capsecrets.for_create, root, ("TOKEN",), ALLOWED)
    assert given is not None
    env = given.capsule.env()
    assert list(env) == ["TOKEN"] and env["TOKEN"].startswith("ccwph_") and len(env["TOKEN"]) == len(VALUE)
    assert VALUE.decode() not in env["TOKEN"]
    capsecrets.remember(root, "cap_1", ["TOKEN"])
    assert VALUE not in (root / capsecrets.DIR_NAME / "cap_1").read_bytes()
    holder = Holder()  # a front end started since: none in memory
    again = trio.run(capsecrets.env, root, holder, "cap_1")
    assert list(again) == ["TOKEN"] and again["TOKEN"] != env["TOKEN"]
    assert trio.run(capsecrets.env, root, holder, "cap_1") == again  # kept for the process's life
    assert trio.run(capsecrets.env, root, Holder(), "cap_2") == {}
    capsecrets.forget(root, "cap_1")
    assert capsecrets.recall(root, "cap_1") == []
    capsecrets.forget(root, "cap_1")  # twice: nothing to do


def test_a_secret_removed_since_refuses_the_next_exec(root: Path) -> None:
    capsecrets.remember(root, "cap_1", ["TOKEN"])
    SecretStore(root).remove("TOKEN")
    with pytest.raises(CcwError) as gone:
        trio.run(capsecrets.env, root, Holder(), "cap_1")
    assert gone.value.code == "NOT_FOUND" and "TOKEN" in gone.value.message


def test_the_fetch_reads_the_store_each_time(root: Path) -> None:
    given = trio.run(capsecrets.for_create, root, ("TOKEN",), ALLOWED)
    assert given is not None
    placeholder = given.capsule.env()["TOKEN"]
    head = f"GET / HTTP/1.1\r\nHost: index.example\r\nAuthorization: Bearer {placeholder}\r\n\r\n".encode()
    judged = given.judge(head, "index.example", 80)
    assert judged.head is not None and b"Bearer " + VALUE in judged.head
    SecretStore(root).put(make_binding("TOKEN", ["index.example:80"]), "stdin", b"n" * 40)
    assert b"Bearer " + b"n" * 40 in (given.judge(head, "index.example", 80).head or b"")


def test_placed_overrides_the_callers_value_of_that_name(root: Path) -> None:
    from sandbox.ops import ExecRequest

    capsecrets.remember(root, "cap_1", ["TOKEN"])
    holder = Holder()
    asked = ExecRequest("cap_1", ("true",), env={"TOKEN": VALUE.decode(), "OTHER": "1"})
    placed = trio.run(capsecrets.placed, root, holder, True, asked)
    assert placed.env is not None and placed.env["OTHER"] == "1"
    assert placed.env["TOKEN"] == holder.given["cap_1"].capsule.env()["TOKEN"] != VALUE.decode()
    assert trio.run(capsecrets.placed, root, holder, False, asked) is asked  # no allowlist: no secrets
