"""mcp_server/capsules/asks.py and ``ccw net pending|approve|deny`` (cli/net.py): questions
about the network held while a person is asked; one per host, port and protocol; bounded;
answered once, by whoever, with who; expired when nobody answers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules import asks
from mcp_server.cli import main
from mcp_server.events import EventLog
from mcp_server.state import State
from sandbox.errors import CcwError

CMD = ["pip", "install", "flask"]


@pytest.fixture
def state(tmp_path: Path) -> State:
    return State(tmp_path)


def test_a_question_is_one_per_host_port_and_protocol_and_counts_its_waiters(state: State) -> None:
    first = asks.ask(state, "cap_a", "Files.PythonHosted.org", 443, "https", CMD, 30)
    again = asks.ask(state, "cap_a", "files.pythonhosted.org", 443, "https", CMD, 30)
    other_port = asks.ask(state, "cap_a", "files.pythonhosted.org", 80, "http", CMD, 30)
    other_capsule = asks.ask(state, "cap_b", "files.pythonhosted.org", 443, "https", CMD, 30)
    assert again.id == first.id and again.waiters == 2 and first.host == "files.pythonhosted.org"
    assert len({first.id, other_port.id, other_capsule.id}) == 3
    assert [q.id for q in asks.pending(state, "cap_a")] == [first.id, other_port.id]
    assert first.rule == "files.pythonhosted.org:443" and first.command == "pip install flask"
    assert [e.kind for e in EventLog(state).since(0)] == ["net.ask"] * 3


def test_questions_are_bounded_per_capsule_and_per_state_dir(state: State) -> None:
    for n in range(asks.MAX_PENDING_PER_CAPSULE):
        asks.ask(state, "cap_a", f"host{n}.example", 443, "https", CMD, 30)
    with pytest.raises(CcwError) as raised:
        asks.ask(state, "cap_a", "one-more.example", 443, "https", CMD, 30)
    assert raised.value.code == "UNAVAILABLE" and "ccw net pending" in raised.value.message
    asks.ask(state, "cap_a", "host0.example", 443, "https", CMD, 30)  # joining one pending is no new question
    capsules = (asks.MAX_PENDING - asks.MAX_PENDING_PER_CAPSULE) // asks.MAX_PENDING_PER_CAPSULE
    for c in range(capsules):
        for n in range(asks.MAX_PENDING_PER_CAPSULE):
            asks.ask(state, f"cap_{c}", f"host{n}.example", 443, "https", CMD, 30)
    with pytest.raises(CcwError, match="this state dir has 64 questions"):
        asks.ask(state, "cap_new", "host.example", 443, "https", CMD, 30)
    assert len(asks.pending(state)) == asks.MAX_PENDING


def test_what_a_jail_chose_is_bounded_and_one_line(state: State) -> None:
    asked = asks.ask(state, "cap_a", "x" * 1000, 443, "https", ["sh", "-c", "echo hi\n\x1b[31mred\r\n" + "y" * 900], 30)
    assert len(asked.host) == asks.MAX_TEXT and asked.host.endswith("…")
    assert "\n" not in asked.command and "\r" not in asked.command and len(asked.command) <= asks.MAX_TEXT


def test_an_answer_is_given_once_with_who_and_why(state: State) -> None:
    asked = asks.ask(state, "cap_a", "registry.npmjs.org", 443, "https", CMD, 30)
    denied = asks.answer(state, asked.id, "denied", "uid 1000 (ccw net)", "not from this registry")
    assert (denied.state, denied.who, denied.reason, denied.allowed) == (
        "denied", "uid 1000 (ccw net)", "not from this registry", False)
    assert denied.refusal() == ("denied by uid 1000 (ccw net): not from this registry (to allow it: "
                                "ccw capsule net cap_a allow registry.npmjs.org:443)")
    with pytest.raises(CcwError) as raised:
        asks.answer(state, asked.id, "once", "someone else")
    assert raised.value.code == "CONFLICT" and "answered already (denied, by uid 1000" in raised.value.message
    with pytest.raises(CcwError) as missing:
        asks.answer(state, 999, "once", "me")
    assert missing.value.code == "NOT_FOUND"
    with pytest.raises(CcwError, match="use one of once, capsule, denied"):
        asks.answer(state, asked.id, "maybe", "me")
    assert asks.pending(state) == []
    assert [e.kind for e in EventLog(state).since(0)] == ["net.ask", "net.answer"]


def test_a_waiter_gets_the_answer_another_process_writes(tmp_path: Path) -> None:
    state = State(tmp_path)
    asked = asks.ask(state, "cap_a", "github.com", 443, "https", ["git", "push"], 30)

    def person() -> None:
        time.sleep(0.3)
        asks.answer(State(tmp_path), asked.id, "capsule", "uid 1000 (ccw net)")  # its own connection

    threading.Thread(target=person).start()
    got = trio.run(asks.wait, state, asked)
    assert (got.state, got.allowed, got.who) == ("capsule", True, "uid 1000 (ccw net)")


def test_nobody_answering_expires_the_question_with_how_to_allow(state: State) -> None:
    asked = asks.ask(state, "cap_a", "2001:db8::5", 8443, "https", CMD, 0.3)
    got = trio.run(asks.wait, state, asked)
    assert (got.state, got.allowed) == ("expired", False)
    assert got.refusal() == ("nobody answered within the time to ask (to allow it: ccw capsule net cap_a "
                             "allow [2001:db8::5]:8443)")
    with pytest.raises(CcwError, match="answered already"):
        asks.answer(state, asked.id, "once", "too late")


def test_a_question_left_by_a_waiter_that_died_expires_at_the_next_look(state: State) -> None:
    asks.ask(state, "cap_a", "example.org", 443, "https", CMD, 0.05)
    time.sleep(0.1)
    assert asks.pending(state) == []
    assert asks.ask(state, "cap_a", "example.org", 443, "https", CMD, 30).waiters == 1  # a new question


def _cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(["--state-dir", str(tmp_path), "net", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_ccw_net_lists_approves_and_denies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = State(tmp_path)
    one = asks.ask(state, "cap_a", "pypi.org", 443, "https", CMD, 30)
    two = asks.ask(state, "cap_a", "evil.example", 443, "https", ["curl", "evil.example"], 30)
    code, shown = _cli(tmp_path, capsys, "pending")
    assert code == 0 and [q["id"] for q in shown["pending"]] == [one.id, two.id]
    assert shown["pending"][0]["rule"] == "pypi.org:443"
    code, approved = _cli(tmp_path, capsys, "approve", str(one.id), "--always")
    assert code == 0 and approved["state"] == "capsule" and approved["who"].endswith("(ccw net)")
    code, denied = _cli(tmp_path, capsys, "deny", str(two.id), "--reason", "not a host this project uses")
    assert code == 0 and (denied["state"], denied["reason"]) == ("denied", "not a host this project uses")
    assert main(["--state-dir", str(tmp_path), "net", "pending"]) == 0
    assert "no connection is waiting for an answer" in capsys.readouterr().out
    assert main(["--state-dir", str(tmp_path), "net", "approve", str(one.id)]) != 0  # answered already
    assert "CONFLICT" in capsys.readouterr().err


def test_settled_questions_are_kept_up_to_a_bound(state: State, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asks, "KEEP_ANSWERED", 5)
    for n in range(12):
        asked = asks.ask(state, "cap_a", f"h{n}.example", 443, "https", CMD, 30)
        asks.answer(state, asked.id, "denied", "me", "no")
    kept = state.execute("SELECT COUNT(*) AS n FROM net_questions")[0]["n"]
    assert kept <= 6 and asks.get(state, asked.id) is not None  # the newest stay


def test_ccw_net_deny_of_a_proposal_prints_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = asks.propose(State(tmp_path), "cap_a", ["10.0.0.0/8"], "the lan", "token agent")
    assert main(["--state-dir", str(tmp_path), "net", "deny", str(made.id), "--reason", "too broad"]) == 0
    assert capsys.readouterr().out == (f"{made.id}: denied (proposal of token agent in cap_a: 10.0.0.0/8; "
                                       "too broad)\n")
