"""Proposals (issue 37): an agent proposes rules with a reason and never approves them.

capsules/proposals.py and the proposal rows of capsules/asks.py; capsule_network's scope by
arguments (tools/network.py ``scope_of``, ToolSpec.scope_for, CcwServer.scope_for); a
policy's network section (capsules/policy.py); ``ccw net pending``'s lines.  The real
proxy, tokens over HTTP and the unix socket are vm-tests/test_attack_proposals.py's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from jsonschema import Draft202012Validator

from mcp_server.capsules import asks, netlive, proposals
from mcp_server.capsules.networks import Networks
from mcp_server.capsules.policy import PolicyStore
from mcp_server.cli.net import render_pending
from mcp_server.config import Config
from mcp_server.core import netrules
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord, helper_network
from mcp_server.state import State
from mcp_server.tools import network as network_tool
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec

CAP = "cap_a"


def _state(tmp_path: Path, spec: netrules.NetworkSpec) -> State:
    state = State(tmp_path / "state")
    Journal(state).add_capsule(CapsuleRecord(
        capsule_id=CAP, spec=CapsuleSpec(workspace=str(tmp_path), network=helper_network(spec)),
        parent=None, created_at="t", clock="t", isolation={}, mount="/m", base_fingerprint=None,
        destroyed_at=None, network_spec=spec))
    return state


def _spec(*rules: str, policy: str | None = None) -> netrules.NetworkSpec:
    parsed = netrules.parse_network({"allow": list(rules), **({"policy": policy} if policy else {})})
    assert parsed is not None
    return parsed


def test_a_proposal_waits_in_the_questions_list_once_per_set_of_rules(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))
    made = proposals.propose(state, _spec("pypi.org"), CAP, ["files.pythonhosted.org:443"], "wheels", "token agent")
    again = proposals.propose(state, _spec("pypi.org"), CAP, ["files.pythonhosted.org:443"], "again", "token agent")
    assert again.id == made.id and again.waiters == 2 and made.state == "pending"
    asked = asks.ask(state, CAP, "example.org", 443, "https", ["curl"], 30)  # a held connection: the same list
    listed = [question.to_json() for question in asks.pending(state)]
    assert [q["id"] for q in listed] == [made.id, asked.id]
    assert listed[0]["kind"] == "proposal" and listed[0]["rules"] == ["files.pythonhosted.org:443"]
    assert listed[0]["proposer"] == "token agent" and listed[0]["command"] == "wheels"
    text = render_pending(listed)
    assert f"{made.id}: token agent proposes for {CAP}: files.pythonhosted.org:443" in text
    assert "    reason: wheels" in text and "asks for https example.org:443" in text
    assert [e.kind for e in EventLog(state).since(0)][1:] == ["net.ask", "net.ask"]


def test_a_rule_that_is_not_one_is_refused_before_anyone_is_asked(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))
    for bad in (["127.1"], ["preset:nosuchpreset"], ["host:99999"]):
        with pytest.raises(CcwError):
            proposals.propose(state, _spec("pypi.org"), CAP, bad, "why", "token agent")
    assert asks.pending(state) == []


def test_a_flood_of_proposals_leaves_a_bounded_pending_list(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))
    refused = 0
    for n in range(2000):
        try:
            asks.propose(state, CAP, [f"h{n}.example:443"], "flood", "token agent")
        except CcwError as exc:
            assert exc.code == "UNAVAILABLE" and "proposals pending" in exc.message
            refused += 1
    assert refused == 2000 - asks.MAX_PROPOSALS_PER_CAPSULE
    assert len(asks.pending(state)) == asks.MAX_PROPOSALS_PER_CAPSULE
    # The jail's questions keep their own places: proposals never fill them.
    assert asks.ask(state, CAP, "example.org", 443, "https", ["curl"], 30).state == "pending"
    for c in range(asks.MAX_PROPOSALS // asks.MAX_PROPOSALS_PER_CAPSULE):
        for n in range(asks.MAX_PROPOSALS_PER_CAPSULE):
            try:
                asks.propose(state, f"cap_{c}", [f"h{n}.example:443"], "flood", "token agent")
            except CcwError:
                pass
    with pytest.raises(CcwError, match=f"this state dir has {asks.MAX_PROPOSALS} proposals"):
        asks.propose(state, "cap_other", ["x.example:443"], "one more", "token agent")


def test_an_approved_proposal_is_added_once_naming_who_approved_and_whose_it_was(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))
    networks = Networks()

    async def main() -> None:
        made = proposals.propose(state, _spec("pypi.org"), CAP, ["files.pythonhosted.org:443"], "wheels",
                                 "token agent")
        waited = await proposals.outcome(networks, state, CAP, made.id, 200)  # nobody answered yet
        assert waited.state == "pending" and netlive.changes(state, CAP) == []
        settled = asks.answer(state, made.id, "once", "uid 1000 (ccw net)")
        assert settled.state == "capsule"  # a proposal is about rules: approving adds them
        done = await proposals.outcome(networks, state, CAP, made.id)
        [change] = netlive.changes(state, CAP)
        assert change.allow == ["files.pythonhosted.org:443"]
        assert change.who == f"uid 1000 (ccw net), approving proposal {made.id} of token agent"
        assert done.applied == "change 1"
        # A person takes the rule back; a late poll does not put it back.
        await netlive.change_rules(networks, state, CAP, "uid 1000 (ccw)", remove=["files.pythonhosted.org:443"])
        again = await proposals.outcome(networks, state, CAP, made.id)
        assert again.applied == "change 1" and len(netlive.changes(state, CAP)) == 2
        with pytest.raises(CcwError) as other:
            await proposals.outcome(networks, state, "cap_b", made.id)
        assert other.value.code == "NOT_FOUND"

    trio.run(main)


def test_a_denied_proposal_adds_nothing_and_says_why(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))

    async def main() -> None:
        made = proposals.propose(state, _spec("pypi.org"), CAP, ["0.0.0.0/0:22"], "ssh out", "token agent")
        asks.answer(state, made.id, "denied", "uid 1000 (ccw net)", "no ssh from capsules")
        done = await proposals.outcome(Networks(), state, CAP, made.id)
        assert (done.state, done.reason, done.applied) == ("denied", "no ssh from capsules", None)
        assert netlive.changes(state, CAP) == []

    trio.run(main)


def _policy(state: State, **network: Any) -> None:
    PolicyStore(state).put({"name": "team", "rules": {"network": network}})


def test_a_policy_approves_exactly_the_rules_it_lists(tmp_path: Path) -> None:
    spec = _spec("pypi.org", policy="team")
    state = _state(tmp_path, spec)
    _policy(state, approve=["preset:pypi", "github.com:443"])
    networks = Networks()

    async def main() -> None:
        within = proposals.propose(state, spec, CAP, ["preset:pypi"], "an install", "token agent")
        assert (within.state, within.who) == ("capsule", "policy team")
        await proposals.outcome(networks, state, CAP, within.id)
        [change] = netlive.changes(state, CAP)
        assert change.who.startswith(f"policy team, approving proposal {within.id}") and change.allow == ["preset:pypi"]
        beyond = proposals.propose(state, spec, CAP, ["github.com:443", "gitlab.com:443"], "a mirror", "token agent")
        assert beyond.state == "pending"  # one rule the policy does not list: a person decides
        unnamed = proposals.propose(state, _spec("pypi.org"), CAP, ["github.com:443"], "no policy", "token agent")
        assert unnamed.state == "pending"

    trio.run(main)


def test_a_policy_gives_its_capsules_on_miss_unless_they_say(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    _policy(state, on_miss="ask", ask_timeout_ms=5000)
    store = PolicyStore(state)
    given: dict[str, Any] = {"allow": ["pypi.org"], "policy": "team"}
    taken = store.network_defaults(netrules.parse_network(given), given)
    assert taken is not None and (taken.on_miss, taken.ask_timeout_ms, taken.policy) == ("ask", 5000, "team")
    assert taken.to_json()["policy"] == "team" and netrules.parse_network(taken.to_json()) == taken
    own = {**given, "on_miss": "deny"}
    kept = store.network_defaults(netrules.parse_network(own), own)
    assert kept is not None and (kept.on_miss, kept.ask_timeout_ms) == ("deny", 5000)
    with pytest.raises(CcwError) as missing:
        store.network_defaults(_spec("pypi.org", policy="nosuch"), {"policy": "nosuch"})
    assert missing.value.code == "NOT_FOUND"
    with pytest.raises(CcwError, match="not a policy's name"):
        netrules.parse_network({"allow": ["pypi.org"], "policy": "Bad Name"})
    assert not PolicyStore(state).approves("nosuch", ["pypi.org"], state.root)


def test_proposing_needs_exec_and_deciding_or_changing_needs_admin() -> None:
    spec = Registry.load(Config().toolsets).lookup("capsule_network")
    assert spec is not None
    needs = {json.dumps(args): spec.scope_for(args) for args in (
        {"capsule_id": CAP, "propose": ["a.example"], "reason": "r"}, {"capsule_id": CAP, "proposal": 3},
        {"capsule_id": CAP, "proposal": 3, "decide": "approve"}, {"capsule_id": CAP, "allow": ["a.example"]},
        {"capsule_id": CAP})}
    assert list(needs.values()) == ["exec", "exec", "admin", "admin", "admin"]
    assert set(spec.scopes) == set(needs.values())  # over HTTP an exec token is shown the tool, to propose
    # Proposing beside deciding or changing is not a way around the gate.
    assert spec.scope_for({"capsule_id": CAP, "propose": ["a.example"], "proposal": 3, "decide": "approve"}) == "admin"
    assert spec.scope_for({"capsule_id": CAP, "propose": ["a.example"], "allow": ["a.example"]}) == "admin"
    assert spec.scope_for(None) == "admin"


def _ctx(state: State, owner: str | None) -> Any:
    record = SimpleNamespace(capsule_id=CAP, network_spec=_spec("pypi.org"))
    capsules = SimpleNamespace(live_record=lambda _id: record, networks=Networks())
    return SimpleNamespace(state=state, capsules=capsules, runs=SimpleNamespace(owner=owner))


def test_deciding_without_a_token_is_refused_and_an_admin_token_decides(tmp_path: Path) -> None:
    state = _state(tmp_path, _spec("pypi.org"))

    async def main() -> None:
        made = await network_tool.capsule_network(_ctx(state, "agent"), {
            "capsule_id": CAP, "propose": ["files.pythonhosted.org:443"], "reason": "wheels"})
        ident = made["proposal"]  # the id, as the agent passes it back to poll
        assert isinstance(ident, int) and made["outcome"] == {
            "rules": ["files.pythonhosted.org:443"], "reason": "wheels", "proposer": "token agent", "state": "pending",
            "who": None, "why": None, "applied": None, "expires_at": made["outcome"]["expires_at"]}
        polled = await network_tool.capsule_network(_ctx(state, "agent"), {"capsule_id": CAP, "proposal": ident})
        assert (polled["proposal"], polled["outcome"]) == (ident, made["outcome"])
        output = Draft202012Validator(network_tool.TOOLS[0].output_schema)
        assert output.is_valid(made) and output.is_valid(polled)
        with pytest.raises(CcwError) as socket_caller:
            await network_tool.capsule_network(_ctx(state, None), {"capsule_id": CAP, "proposal": ident,
                                                                   "decide": "approve"})
        assert socket_caller.value.code == "PERMISSION_DENIED" and "ccw net approve" in socket_caller.value.message
        with pytest.raises(CcwError, match="not both"):
            await network_tool.capsule_network(_ctx(state, "agent"), {"capsule_id": CAP, "proposal": ident,
                                                                      "allow": ["a.example"]})
        decided = await network_tool.capsule_network(_ctx(state, "operator"), {
            "capsule_id": CAP, "proposal": ident, "decide": "approve"})
        assert decided["outcome"]["state"] == "approved" and decided["outcome"]["who"] == "token operator"
        assert decided["outcome"]["applied"] == "change 1"
        assert ("proposal 1 of token agent: files.pythonhosted.org:443 (wheels): approved by token operator, "
                "change 1") in network_tool.network_text(decided)
        turned = await network_tool.capsule_network(_ctx(state, "agent"), {
            "capsule_id": CAP, "propose": ["b.example:443"], "reason": "docs"})
        asks.answer(state, turned["proposal"], "denied", "uid 1000 (ccw net)", "not this one")
        told = await network_tool.capsule_network(_ctx(state, "agent"), {"capsule_id": CAP,
                                                                         "proposal": turned["proposal"]})
        assert (told["outcome"]["state"], told["outcome"]["who"], told["outcome"]["why"]) == (
            "denied", "uid 1000 (ccw net)", "not this one")
        with pytest.raises(CcwError, match="reason"):
            await network_tool.capsule_network(_ctx(state, "agent"), {"capsule_id": CAP, "propose": ["b.example"]})

    trio.run(main)
