"""Proposals: an agent asks for network rules, and someone else decides (issue 37).

An agent whose command met a host its capsule's rules leave out may say what it needs
and why: ``capsule_network {capsule_id, propose: [rules], reason}`` (tools/network.py).
What happens to it:

1. **It waits in the list of questions** (capsules/asks.py, ``kind`` ``proposal``), so a
   person sees it where they see held connections: ``ccw net pending``, ``ccw ui``.  A
   proposal of the same rules already pending is that proposal.  The rules are checked
   (presets expanded, each parsed) before anything is kept, so a person is never asked
   about a rule that could not be added.
2. **Someone decides, never the agent.**  ``ccw net approve ID`` / ``deny ID --reason``
   and the dashboard write the answer into the row directly: they are the state dir's
   user at a terminal or a browser holding ``ccw ui``'s token, not MCP calls.  Over
   MCP, only ``capsule_network {proposal: ID, decide}`` with a bearer token that has the
   ``admin`` scope decides (tools/network.py); an agent's token has ``exec``, which
   proposes and polls and nothing more.  Or a **policy** decides at once: a capsule
   whose network names a policy (``network.policy``, stored with the capsule's rules)
   takes that policy's ``network.approve`` list (rules and presets, capsules/policy.py):
   a proposal all of whose rules are in it is approved there and then, by ``policy
   NAME``.
3. **The rules go in once.**  An approved proposal's rules are added through the one
   way rules change (capsules/netlive.py ``change_rules``), named after who approved it
   and whose proposal it was, by whichever process gets to it first (``asks.claim``): the
   front end an agent polls (``outcome``), or the one ``ccw net approve`` and the
   dashboard tell at once (they call ``capsule_network {proposal: ID}`` through the state
   dir's front end, whose sessions are the live ones).  A person who removes such a rule
   later is not undone by a late poll: the claim is made once.
4. **The agent learns the outcome** from the call itself, waiting up to ``wait_ms`` for
   an answer, or by polling the id it was given: a person may take minutes, longer than
   an MCP client waits for one call, so the call is bounded and the id stays good until
   the proposal is answered or expires (``asks.PROPOSAL_S``).

What a rule allows once added is the rule's business, as for any other rule: the host's
own addresses and private space (core/netspace.py) stay refused unless the rule names
that exact address, whoever approved it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from mcp_server.capsules import asks, netlive
from mcp_server.capsules.networks import Networks
from mcp_server.capsules.policy import PolicyStore
from mcp_server.core.netrules import NetworkSpec, parse_rules
from mcp_server.fs.netpresets import expand_rules
from mcp_server.state import State
from sandbox.errors import CcwError

MAX_WAIT_MS = 60_000


def checked(words: Sequence[str], state_dir: str | Path) -> list[str]:
    """The rules ``words`` stand for (presets expanded), each parsed: INVALID_ARGUMENT or
    NOT_FOUND naming the first that is not a rule or a preset."""
    rules = expand_rules(words, state_dir)
    parse_rules(rules)
    return rules


def propose(state: State, spec: NetworkSpec, capsule_id: str, words: Sequence[str], reason: str,
            proposer: str) -> asks.Question:
    """Keep the proposal (or join the same one pending); approved at once if the capsule's
    policy pre-approves every rule of it."""
    rules = checked(words, state.root)
    made = asks.propose(state, capsule_id, words, reason, proposer)
    policy = spec.policy
    if made.state == "pending" and policy is not None and PolicyStore(state).approves(policy, rules, state.root):
        try:
            made = asks.answer(state, made.id, "capsule", f"policy {policy}")
        except CcwError:
            made = asks.get(state, made.id) or made  # answered meanwhile: that answer stands
    return made


def _proposal(state: State, capsule_id: str, question_id: int) -> asks.Question:
    found = asks.get(state, question_id)
    if found is None or found.kind != "proposal" or found.capsule_id != capsule_id:
        raise CcwError("NOT_FOUND", f"no proposal {question_id} for capsule {capsule_id} (a settled one is kept "
                       f"until {asks.KEEP_ANSWERED} newer questions follow)", {"proposal": question_id})
    return found


async def outcome(networks: Networks, state: State, capsule_id: str, question_id: int,
                  wait_ms: int = 0) -> asks.Question:
    """The proposal, after waiting up to ``wait_ms`` for an answer; an approved one's rules
    are added here if no process has added them yet."""
    found = _proposal(state, capsule_id, question_id)
    with trio.move_on_after(min(max(wait_ms, 0), MAX_WAIT_MS) / 1000):
        while found.state == "pending":
            asks.expire(state)
            await trio.sleep(asks.POLL_S)
            found = _proposal(state, capsule_id, question_id)
    if found.state == "capsule" and asks.claim(state, found.id):
        await _apply(networks, state, found)
    return _proposal(state, capsule_id, question_id)


async def _apply(networks: Networks, state: State, approved: asks.Question) -> None:
    who = f"{approved.who}, approving proposal {approved.id} of {approved.proposer}"
    try:
        made, _ = await netlive.change_rules(networks, state, approved.capsule_id, who,
                                             allow=expand_rules(approved.rules, state.root),
                                             asked={"allow": list(approved.rules)})
    except CcwError as exc:  # the capsule went, or a preset changed under it
        asks.mark_applied(state, approved.id, f"not added: {exc.message}")
        return
    asks.mark_applied(state, approved.id, "already in force" if made is None else f"change {made.seq}")


def decide(state: State, capsule_id: str, question_id: int, verdict: str, who: str,
           reason: str | None) -> asks.Question:
    """An admin token's answer to a proposal (``approve`` or ``deny``)."""
    _proposal(state, capsule_id, question_id)
    return asks.answer(state, question_id, "capsule" if verdict == "approve" else "denied", who, reason)

