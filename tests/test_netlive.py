"""Live rules (issue 37): changing an allowlist, the store of changes, a session that cuts
what a removed rule allowed, and the command line's form.  The real capsule's cut and
service are vm-tests/test_netlive_e2e.py's."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest
import trio

from mcp_server.capsules import netlive
from mcp_server.cli.network import tool_args
from mcp_server.core import netrules
from mcp_server.core.netspace import HostSpace
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord, helper_network
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec
from tests.support.egress_harness import (  # noqa: F401  (relay_engine: a fixture)
    NoDns,
    egress,
    network,
    read_all,
    read_head,
    relay_engine,
    upstream,
)


def test_changed_adds_removes_and_sets_caps() -> None:
    spec = network("pypi.org", "files.pythonhosted.org:443")
    after = netrules.changed(spec, allow=["GitHub.com:443"], remove=["pypi.org"], caps={"max_connections": 9})
    assert [rule.text for rule in after.allow] == ["files.pythonhosted.org:443", "github.com:443"]
    assert after.max_connections == 9 and after.max_bytes == spec.max_bytes
    assert netrules.changed(spec, allow=["pypi.org"]) == spec  # already in force: nothing changes
    assert netrules.rules_id(after) != netrules.rules_id(spec)
    assert netrules.rules_id(network("b.example", "a.example")) == netrules.rules_id(network("a.example", "b.example"))
    assert netrules.rules_id(spec).startswith("n-") and len(netrules.rules_id(spec)) == 18


@pytest.mark.parametrize(("allow", "remove", "caps", "says"), [
    ([], ["example.com"], None, "not in force"),
    (["a.example"], ["a.example"], None, "both allowed and removed"),
    ([], ["pypi.org"], None, "empty allowlist"),
    ([], [], {"max_bytes": 0}, "positive integer"),
    ([], [], {"speed": 1}, "unknown fields"),
    (["127.1"], [], None, "resolver would read it"),
])
def test_changed_refuses_with_what_to_do(allow: list[str], remove: list[str], caps: dict[str, int] | None,
                                         says: str) -> None:
    with pytest.raises(CcwError) as caught:
        netrules.changed(network("pypi.org"), allow=allow, remove=remove, caps=caps)
    assert caught.value.code == "INVALID_ARGUMENT" and says in caught.value.message


def _journal(tmp_path: Path, spec: netrules.NetworkSpec | None) -> Journal:
    journal = Journal(State(tmp_path / "state"))
    journal.add_capsule(CapsuleRecord(
        capsule_id="cap_a", spec=CapsuleSpec(workspace=str(tmp_path), network=helper_network(spec)),
        parent=None, created_at="t", clock="t", isolation={}, mount="/m", base_fingerprint=None,
        destroyed_at=None, network_spec=spec))
    return journal


def test_a_change_is_journaled_with_who_and_an_event(tmp_path: Path) -> None:
    first = network("pypi.org")
    journal = _journal(tmp_path, first)
    start = netlive.now()
    made = netlive.record_change(journal.state, "cap_a", lambda old: netrules.changed(old, allow=["github.com"]),
                                 "token operator", {"allow": ["github.com"]})
    assert made is not None and made.who == "token operator" and made.seq == 1
    record = journal.capsule("cap_a")
    assert record is not None and [rule.text for rule in record.network_spec.allow] == ["github.com", "pypi.org"]
    assert netlive.spec(journal.state, made.previous) == first and netlive.spec(journal.state, made.rules) == made.spec
    (event,) = [e for e in EventLog(journal.state).since(0, "cap_a") if e.kind == "net.rules"]
    assert event.data["who"] == "token operator" and event.data["rules"] == made.rules
    assert event.data["network"]["allow"] == ["github.com", "pypi.org"]
    # Asking for what is in force already changes nothing and records nothing.
    same = netlive.record_change(journal.state, "cap_a", lambda old: netrules.changed(old, allow=["pypi.org"]),
                                 "uid 0 (ccw)", {"allow": ["pypi.org"]})
    assert same is None and len(netlive.changes(journal.state, "cap_a")) == 1
    history = netlive.changes(journal.state, "cap_a")
    assert netlive.in_force(history, made.spec, start) == netrules.rules_id(first)
    assert netlive.in_force(history, made.spec, netlive.now()) == made.rules
    assert netlive.in_force([], first, start) == netrules.rules_id(first)


def test_a_capsule_without_network_gets_no_rules_live(tmp_path: Path) -> None:
    journal = _journal(tmp_path, None)
    with pytest.raises(CcwError) as caught:
        netlive.record_change(journal.state, "cap_a", lambda old: old, "uid 0 (ccw)", {"allow": ["pypi.org"]})
    assert caught.value.code == "UNSUPPORTED" and "capsule_create with network" in caught.value.message
    assert caught.value.details["reason"] == "no_egress_side"
    row = journal.state.execute("SELECT network FROM capsules WHERE capsule_id = 'cap_a'")[0]
    assert row["network"] == "none"


async def _drip(stream: trio.SocketStream, state: object) -> None:
    """A download that never ends by itself: a KiB every few milliseconds, until the proxy closes."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while True:
            await stream.send_all(b"x" * 1024)
            await trio.sleep(0.005)


def _space() -> HostSpace:
    return HostSpace()


@pytest.mark.usefixtures("relay_engine")
def test_removing_the_rule_cuts_the_open_tunnel_and_adding_one_lets_the_next_in() -> None:
    async def main() -> None:
        async with upstream(_drip) as up, upstream(_drip) as other, \
                egress(network(f"127.0.0.1:{up.port}"), space=_space) as proxy:
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            assert await client.receive_some()  # the download runs
            before = proxy.session.rules
            after = netrules.changed(proxy.session.spec, allow=[f"127.0.0.1:{other.port}"],
                                     remove=[f"127.0.0.1:{up.port}"])
            cut = proxy.session.set_rules(after, "token operator")
            assert [attempt.port for attempt in cut] == [up.port]
            with trio.fail_after(10):  # the tunnel ends: the client reads to EOF
                while await client.receive_some(1 << 16):
                    pass
            await client.aclose()
            # The next request is judged by the new rules: the new host in, the old one out.
            again = await proxy.http()
            await again.send_all(f"CONNECT 127.0.0.1:{other.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(again)).startswith(b"HTTP/1.1 200 ")
            await again.aclose()
            old = await proxy.http()
            await old.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            denied = await read_all(old)
            assert denied.startswith(b"HTTP/1.1 403 ") and b"no rule allows" in denied
            await trio.sleep(0.05)
            records = {(r["port"], r["allowed"]): r for r in proxy.session.end_exec()}
        first = records[up.port, True]
        assert first["rules"] == before and first["bytes_in"] > 0
        assert first["cut"].startswith(f"rules changed to {proxy.session.rules} by token operator: no rule allows")
        assert records[other.port, True]["rules"] == proxy.session.rules
        assert records[up.port, False]["rules"] == proxy.session.rules

    trio.run(main)


def test_a_rule_still_in_force_keeps_its_connection() -> None:
    async def main() -> None:
        async with upstream(_drip) as up, egress(network(f"127.0.0.1:{up.port}", "pypi.org"), space=_space) as proxy:
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            assert proxy.session.set_rules(netrules.changed(proxy.session.spec, remove=["pypi.org"])) == []
            with trio.move_on_after(0.2):
                while await client.receive_some():
                    pass
                raise AssertionError("the tunnel ended")
            await client.aclose()

    trio.run(main)


def _net_args(*words: str, **caps: int) -> argparse.Namespace:
    return argparse.Namespace(capsule_id="cap_a", words=list(words), max_bytes=caps.get("max_bytes"),
                              max_connections=caps.get("max_connections"))


def test_the_command_lines_form() -> None:
    assert tool_args(_net_args()) == {"capsule_id": "cap_a"}
    assert tool_args(_net_args("allow", "a.example", "b.example:22", "remove", "c.example", max_bytes=5)) == {
        "capsule_id": "cap_a", "allow": ["a.example", "b.example:22"], "remove": ["c.example"],
        "caps": {"max_bytes": 5}}
    for words in (("a.example",), ("allow",), ("remove", "x.example", "allow")):
        with pytest.raises(SystemExit):
            tool_args(_net_args(*words))
    assert json.dumps(tool_args(_net_args("remove", "x.example")))  # plain JSON for the front end


def _manifest(execs: list[dict[str, object]], sets: dict[str, object]) -> dict[str, object]:
    return {"capsule": {"network_rules": sets}, "execs": execs}


def test_a_witness_names_each_execs_rules_and_a_replay_keeps_within_its_grant(tmp_path: Path) -> None:
    first = network("a.example")
    journal = _journal(tmp_path, first)
    record = journal.capsule("cap_a")
    started = netlive.now()
    made = netlive.record_change(journal.state, "cap_a", lambda old: netrules.changed(old, allow=["b.example"],
                                 remove=["a.example"]), "token operator", {})
    assert made is not None and record is not None
    later = netlive.now()
    rows = [{"seq": 1, "started_at": started}, {"seq": 2, "started_at": later}]
    manifest: dict[str, object] = {"capsule": {}, "execs": [
        {"seq": 1, "touched": {"network": [{"rules": made.rules}]}},  # a change came while it ran
        {"seq": 2, "touched": {"network": None}}]}
    netlive.mark_witness(manifest, journal.state, record, rows)
    execs = manifest["execs"]
    assert execs[0]["rules"] == sorted([made.previous, made.rules]) and execs[1]["rules"] == [made.rules]  # type: ignore[index]
    assert manifest["capsule"]["network_rules"] == {made.previous: first.to_json(), made.rules: made.spec.to_json()}  # type: ignore[index]
    # Each exec runs under its own rules, within the grant; the grant's caps bound them.
    grant = network("a.example", "b.example", "c.example", max_bytes=10)
    used, rules = netlive.replay_rules(manifest, grant, own=False)
    assert used == grant and [r.text for r in rules[2].allow] == ["b.example"] and rules[2].max_bytes == 10
    assert [r.text for r in rules[1].allow] == ["a.example", "b.example"]
    with pytest.raises(CcwError) as caught:
        netlive.replay_rules(manifest, network("b.example"), own=False)
    assert caught.value.code == "PERMISSION_DENIED" and caught.value.details["lacking"] == ["a.example"]
    assert caught.value.details["exec"] == 1 and made.previous in caught.value.message
    assert netlive.replay_rules(manifest, None, own=False) == (None, {})  # network none, as before
    own, _ = netlive.replay_rules(manifest, None, own=True)
    assert own is not None and [r.text for r in own.allow] == ["a.example", "b.example"]


def test_a_replay_refuses_a_witness_whose_rule_ids_do_not_match_its_rules() -> None:
    spec = network("a.example")
    forged = _manifest([{"seq": 1, "rules": [netrules.rules_id(spec)]}],
                       {netrules.rules_id(spec): {"allow": ["0.0.0.0/0"], "max_bytes": 1, "max_connections": 1}})
    with pytest.raises(CcwError) as caught:
        netlive.replay_rules(forged, spec, own=False)
    assert caught.value.code == "INVALID_ARGUMENT" and "altered" in caught.value.message
    missing = _manifest([{"seq": 1, "rules": ["n-0000000000000000"]}], {})
    with pytest.raises(CcwError) as caught:
        netlive.replay_rules(missing, spec, own=False)
    assert caught.value.code == "INVALID_ARGUMENT" and "does not carry" in caught.value.message


def test_a_rule_added_live_opens_neither_the_host_nor_private_space() -> None:
    """core/netspace.py holds for live rules as for create-time ones: a wildcard or a CIDR
    added while the capsule lives reaches no loopback or private address; only a rule naming
    the exact address does."""
    resolver = NoDns({"inside.example": ["10.1.2.3"], "me.example": ["127.0.0.1"]})

    async def main() -> list[bytes]:
        async with egress(network("pypi.org"), resolver=resolver, space=_space) as proxy:
            proxy.session.set_rules(netrules.changed(proxy.session.spec, allow=["*.example", "10.0.0.0/8:80"]))
            answers = []
            for target in ("inside.example:443", "me.example:443", "10.1.2.3:80"):
                client = await proxy.http()
                await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                answers.append(await read_all(client))
            return answers

    inside, me, cidr = trio.run(main)
    assert inside.startswith(b"HTTP/1.1 403 ") and b"private" in inside, inside
    assert me.startswith(b"HTTP/1.1 403 ") and b"loopback" in me, me
    assert cidr.startswith(b"HTTP/1.1 403 ") and b"private" in cidr, cidr


def test_change_rules_journals_and_keeps_the_rules_for_the_next_session(tmp_path: Path) -> None:
    from mcp_server.capsules.networks import Networks

    journal = _journal(tmp_path, network("pypi.org"))
    networks = Networks()

    async def main() -> tuple[netlive.Change | None, list[dict[str, object]], netlive.Change | None]:
        made, cut = await netlive.change_rules(networks, journal.state, "cap_a", "uid 0 (ccw)", allow=["github.com"])
        again, _ = await netlive.change_rules(networks, journal.state, "cap_a", "uid 0 (ccw)", allow=["github.com"])
        return made, cut, again

    made, cut, again = trio.run(main)
    assert made is not None and cut == [] and again is None  # no session here; nothing changed the second time
    assert made.who == "uid 0 (ccw)" and made.allow == ["github.com"] and made.remove == []
    assert networks._changed["cap_a"] == made.spec  # what a session opened later in this process gets
