"""A miss asked of a person (issue 37, ``on_miss: "ask"``): the proxy holds the connection
(egress/session.py ``consider``) while capsules/misses.py asks; over real loopback sockets,
with the question answered as ``ccw net`` or an MCP client's elicitation answers it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import mcp_types as types
import pytest
import trio

from mcp_server.capsules import asks, netlive
from mcp_server.capsules.asker import Asker
from mcp_server.capsules.misses import Asking
from mcp_server.capsules.networks import Networks
from mcp_server.core.netrules import NetworkSpec, parse_network
from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.egress_harness import egress, read_all, read_head, shout, upstream
from tests.support.journal_rows import capsule_record

CAP = "cap_1"


def _asking(tmp_path: Path, spec: NetworkSpec) -> Asking:
    state = State(tmp_path / "state")
    Journal(state).add_capsule(dataclasses.replace(capsule_record(CAP), network_spec=spec))
    return Asking(state, Networks())


def _ask_spec(*rules: str, timeout_ms: int = 10_000) -> NetworkSpec:
    spec = parse_network({"allow": list(rules), "on_miss": "ask", "ask_timeout_ms": timeout_ms})
    assert spec is not None
    return spec


async def _connect(proxy: Any, port: int) -> tuple[trio.SocketStream, bytes]:
    client = await proxy.http()
    await client.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return client, await read_head(client)


async def _refused(proxy: Any, target: str) -> bytes:
    """A CONNECT to ``target`` refused: the whole 403 answer (its head and why)."""
    client = await proxy.http()
    await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = await read_all(client)
    await client.aclose()
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    return answer


async def _answer_when_asked(state: State, verdict: str, reason: str | None = None) -> asks.Question:
    for _ in range(500):  # the connection's question, as ccw net pending would show it
        waiting = asks.pending(state)
        if waiting:
            return asks.answer(state, waiting[0].id, verdict, "uid 1000 (ccw net)", reason)
        await trio.sleep(0.02)
    raise AssertionError("no question was asked")


def test_the_spec_says_ask_and_its_time_and_old_ids_stay() -> None:
    plain = parse_network({"allow": ["pypi.org"]})
    asking = _ask_spec("pypi.org", timeout_ms=5000)
    assert plain is not None and "on_miss" not in plain.to_json()  # rules ids made before stay the same
    assert asking.to_json()["on_miss"] == "ask" and asking.to_json()["ask_timeout_ms"] == 5000
    assert parse_network(asking.to_json()) == asking
    from sandbox.errors import CcwError
    with pytest.raises(CcwError, match="on_miss 'maybe'"):
        parse_network({"allow": ["pypi.org"], "on_miss": "maybe"})
    with pytest.raises(CcwError, match="ask_timeout_ms must be an integer from 1000"):
        parse_network({"allow": ["pypi.org"], "on_miss": "ask", "ask_timeout_ms": 10})
    with pytest.raises(CcwError, match="a preset is named where"):
        parse_network({"allow": ["preset:pypi"]})


def test_a_miss_waits_and_passes_once_when_a_person_allows_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with upstream(shout) as up:
            spec = _ask_spec("127.0.0.1:9")
            asking = _asking(tmp_path, spec)
            async with egress(spec) as proxy, trio.open_nursery() as nursery:
                proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 10))
                answered: list[asks.Question] = []

                async def person() -> None:
                    answered.append(await _answer_when_asked(asking.state, "once"))

                nursery.start_soon(person)
                client, head = await _connect(proxy, up.port)
                assert head.startswith(b"HTTP/1.1 200 ")
                await client.send_all(b"held, then through")
                await client.send_eof()
                assert await read_all(client) == b"HELD, THEN THROUGH"
                await client.aclose()
                records = proxy.session.end_exec()
            [record] = records
            assert (record["allowed"], record["rule"]) == (True, f"127.0.0.1:{up.port}")
            assert record["asked"] == {"question": answered[0].id, "answer": "once", "who": "uid 1000 (ccw net)"}
            assert netlive.changes(asking.state, CAP) == []  # once: the rules are as they were

    trio.run(main)


def test_allow_for_the_capsule_adds_the_rule_and_a_denial_tells_the_agent_why(tmp_path: Path) -> None:
    async def main() -> None:
        async with upstream(shout) as up, upstream(shout) as other:
            spec = _ask_spec("127.0.0.1:9")
            asking = _asking(tmp_path, spec)
            async with egress(spec) as proxy, trio.open_nursery() as nursery:
                proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 10))
                nursery.start_soon(_answer_when_asked, asking.state, "capsule")
                client, head = await _connect(proxy, up.port)
                assert head.startswith(b"HTTP/1.1 200 ")
                await client.aclose()
                [change] = netlive.changes(asking.state, CAP)
                assert change.allow == [f"127.0.0.1:{up.port}"] and change.who == "uid 1000 (ccw net)"
                nursery.start_soon(_answer_when_asked, asking.state, "denied", "not a host this project uses")
                body = await _refused(proxy, f"127.0.0.1:{other.port}")
                assert b"denied by uid 1000 (ccw net): not a host this project uses" in body
                assert f"ccw capsule net {CAP} allow 127.0.0.1:{other.port}".encode() in body
                records = proxy.session.end_exec()
            verdicts = {r["port"]: (r["allowed"], r["asked"]["answer"]) for r in records}  # type: ignore[index]
            assert verdicts == {up.port: (True, "capsule"), other.port: (False, "denied")}

    trio.run(main)


def test_nobody_answering_denies_at_the_time_and_says_how_to_allow(tmp_path: Path) -> None:
    async def main() -> None:
        spec = _ask_spec("127.0.0.1:9", timeout_ms=1000)
        asking = _asking(tmp_path, spec)
        async with egress(spec) as proxy:
            proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 0.3))
            assert b"nobody answered within the time to ask" in await _refused(proxy, "127.0.0.1:5")
            [record] = proxy.session.end_exec()
        assert record["asked"]["answer"] == "expired"  # type: ignore[index]

    trio.run(main)


def test_the_client_that_started_the_exec_is_asked_by_elicitation(tmp_path: Path) -> None:
    class Client:
        client_capabilities = types.ClientCapabilities(elicitation=types.ElicitationCapability())
        client_params = SimpleNamespace(client_info=types.Implementation(name="agent-client", version="1"))
        can_send_request = True
        asked: ClassVar[list[str]] = []

        async def elicit_form(self, text: str, schema: Any, related_request_id: Any = None) -> Any:
            self.asked.append(text)
            return types.ElicitResult(action="accept", content={"answer": "allow once"})

    async def main() -> None:
        async with upstream(shout) as up:
            spec = _ask_spec("127.0.0.1:9")
            asking = _asking(tmp_path, spec)
            asking.execs[CAP] = (Asker(Client(), request_id=3), ("curl", "https://example.org"))
            async with egress(spec) as proxy:
                proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 10))
                client, head = await _connect(proxy, up.port)
                assert head.startswith(b"HTTP/1.1 200 ")
                await client.aclose()
                [record] = proxy.session.end_exec()
        assert record["asked"]["who"].endswith("(MCP client agent-client, elicitation)")  # type: ignore[index]
        assert "command: curl https://example.org" in Client.asked[0]

    trio.run(main)


def test_an_allowed_name_still_reaches_no_loopback_address(tmp_path: Path) -> None:
    # A person allows evil.example:PORT; it resolves to 127.0.0.1: core/netspace.py refuses it,
    # since the rule names no exact address.
    async def loopback(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async def main() -> None:
        async with upstream(shout) as up:
            spec = _ask_spec("127.0.0.1:9")
            asking = _asking(tmp_path, spec)
            async with egress(spec, resolver=loopback) as proxy, trio.open_nursery() as nursery:
                proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 10))
                nursery.start_soon(_answer_when_asked, asking.state, "capsule")
                assert b"loopback" in await _refused(proxy, f"evil.example:{up.port}")
                [record] = proxy.session.end_exec()
            assert up.seen == []
            assert record["allowed"] is False and "loopback" in str(record["reason"])

    trio.run(main)


def test_ccw_capsule_create_asks_on_a_miss_with_its_flags() -> None:
    from mcp_server.cli import parse_args
    from mcp_server.cli.capsule import tool_call

    _, create, _ = tool_call(parse_args(["capsule", "create", ".", "--network", "pypi.org", "--ask-on-miss",
                                         "--ask-timeout-ms", "5000"]))
    assert create["network"] == {"allow": ["pypi.org"], "on_miss": "ask", "ask_timeout_ms": 5000}
    assert parse_network(create["network"]) == _ask_spec("pypi.org", timeout_ms=5000)
    with pytest.raises(SystemExit, match="need at least one --network RULE"):
        tool_call(parse_args(["capsule", "create", ".", "--ask-on-miss"]))


# What a jail can put in a SOCKS5 name (any bytes): a title-setting escape and a host the
# person would approve; a name no rule can ever allow is not a question for a person.
SPOOF = b"\x1b]0;pwned\x07\x1b[2K\rgithub.com\xc2\x9b2J"


def test_a_name_no_rule_can_allow_is_denied_without_asking(tmp_path: Path) -> None:
    async def main() -> None:
        spec = _ask_spec("127.0.0.1:9")
        asking = _asking(tmp_path, spec)
        async with egress(spec) as proxy:
            proxy.session.set_asking(lambda attempt, service: asking(CAP, attempt, service, 5))
            client = await proxy.socks()
            await client.send_all(b"\x05\x01\x00")
            assert await client.receive_some(2) == b"\x05\x00"
            await client.send_all(b"\x05\x01\x00\x03" + bytes([len(SPOOF)]) + SPOOF + b"\x01\xbb")
            with trio.fail_after(3):  # at once: nobody is asked, so nothing waits
                answer = await read_all(client)
            await client.aclose()
            [record] = proxy.session.end_exec()
        assert answer[:2] == b"\x05\x02" and record["allowed"] is False, (answer, record)
        assert "a host name is ASCII" in str(record["reason"]) and "asked" not in record, record
        assert asks.pending(asking.state) == []

    trio.run(main)


def test_ccw_net_pending_shows_what_a_jail_named_as_text() -> None:
    from mcp_server.cli.net import render_pending

    question = {"id": 1, "kind": "connection", "capsule_id": CAP, "protocol": "socks5", "waiters": 1,
                "rule": SPOOF.decode("latin-1") + ":443", "command": "sh -c '\x1b[31mok'", "expires_at": "soon"}
    shown = render_pending([question])
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in shown), repr(shown)
    assert "\\x1b]0;pwned\\x07" in shown and "sh -c '\\x1b[31mok'" in shown
