"""capsule_network: show a live capsule's allowlist, or change it (a person's power);
propose rules and learn what became of the proposal (an agent's).

An adapter over capsules/netlive.py (the rule sets, the changes, who made them) and
capsules/networks.py (the capsule's egress session, which judges the next connection by
the new rules and cuts those they no longer allow).

Why the ``admin`` scope: an allowlist is what the person let an agent reach.  If a token
that runs commands could widen it, an agent (or what it ran) could let itself out, so
over HTTP only a token with ``admin`` changes or shows rules, and the tool is not in the
``agent`` profile.  Over stdio, the socket and ``ccw`` (the state dir's front end, whose
peers must be its own uid) the caller is the user who owns the state dir, as for every
other tool.  No turn is taken: a change must reach a command that is running now (that
is what it is for), so it never waits behind one.

Proposals (capsules/proposals.py) are the agent's part, so the scope depends on the
arguments (``scope_of``, which the HTTP gate asks: ``CcwServer.scope_for``): ``propose``
and polling a ``proposal`` need ``exec``, the scope of a token that runs commands;
``decide`` on a proposal, like allow/remove/caps and showing the rules, needs
``admin``, and over stdio or the socket (no token) ``decide`` is refused: there the
caller may be an agent running as the person's uid, and the person answers with ``ccw
net approve``.  So no call an agent makes with its own token turns its proposal into a
rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mcp_server.capsules import netlive, proposals
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.core import netrules
from mcp_server.fs.netpresets import expand_rules
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError

_RULES_ARG = {"type": "array", "maxItems": 1024, "items": {"type": "string", "minLength": 1, "maxLength": 300}}
MAX_PROPOSED = 64  # rules in one proposal: a person reads them all
_CAPS = {"type": "object", "additionalProperties": False, "minProperties": 1,
         "properties": {"max_bytes": {"type": "integer", "minimum": 1},
                        "max_connections": {"type": "integer", "minimum": 1}}}


def who(ctx: ToolContext) -> str:
    """Who asked for a change: the HTTP token's name, or the uid the front end serves and through what."""
    token = ctx.runs.owner
    if token is not None:
        return f"token {token}"
    via = "ccw" if ctx.caller_lent else "mcp client"
    return f"uid {os.getuid()} ({via})"


def scope_of(args: Mapping[str, Any]) -> str:
    """The scope a call needs: ``exec`` to propose or poll a proposal, ``admin`` for anything
    else, and for any call that also decides or changes rules, whatever else it says."""
    if any(args.get(key) for key in ("decide", "allow", "remove", "caps")):
        return "admin"
    return "exec" if args.get("propose") or args.get("proposal") is not None else "admin"


async def _proposal(ctx: ToolContext, record: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Propose, poll or decide: the proposal as it stands after (capsules/proposals.py)."""
    state, capsule_id, wait_ms = ctx.state, record.capsule_id, args.get("wait_ms") or 0
    if args.get("propose"):
        if record.network_spec is None:
            raise netlive.none_refusal(capsule_id)
        if not (args.get("reason") or "").strip() or len(args["propose"]) > MAX_PROPOSED \
                or not all(0 < len(rule) <= 300 for rule in args["propose"]):
            raise CcwError("INVALID_ARGUMENT", f"a proposal is 1 to {MAX_PROPOSED} rules (or preset:NAME, each at "
                           "most 300 characters) and a reason: what they are for, for the person who decides")
        made = proposals.propose(state, record.network_spec, capsule_id, args["propose"], args["reason"], who(ctx))
        found = await proposals.outcome(ctx.capsules.networks, state, capsule_id, made.id, wait_ms)
    elif args.get("decide"):
        if ctx.runs.owner is None:
            raise CcwError("PERMISSION_DENIED", "a proposal is decided by a person: ccw net approve ID / ccw net deny "
                           "ID --reason TEXT, or ccw ui; over HTTP, a token with the admin scope")
        proposals.decide(state, capsule_id, args["proposal"], args["decide"], who(ctx), args.get("reason"))
        found = await proposals.outcome(ctx.capsules.networks, state, capsule_id, args["proposal"])
    else:
        found = await proposals.outcome(ctx.capsules.networks, state, capsule_id, args["proposal"], wait_ms)
    spec = ctx.capsules.live_record(capsule_id).network_spec
    return {**_shown(state, capsule_id, spec), "changed": False, "cut": [], "proposal": found.id,
            "outcome": found.outcome()}


def _shown(state: Any, capsule_id: str, spec: netrules.NetworkSpec | None) -> dict[str, Any]:
    history = netlive.changes(state, capsule_id)
    return {"capsule_id": capsule_id, "network": netrules.network_json(spec),
            "rules": None if spec is None else netrules.rules_id(spec),
            "changes": [change.to_json() for change in history]}


async def capsule_network(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The capsule's rules, after adding ``allow``, removing ``remove`` and setting ``caps`` if asked."""
    record = ctx.capsules.live_record(args["capsule_id"])
    if args.get("propose") or args.get("proposal") is not None:
        if any(args.get(key) for key in ("allow", "remove", "caps")):
            raise CcwError("INVALID_ARGUMENT", "propose or proposal, or allow/remove/caps: not both in one call")
        return await _proposal(ctx, record, args)
    asked: Mapping[str, Any] = {key: args[key] for key in ("allow", "remove", "caps") if args.get(key)}
    if not asked:
        return {**_shown(ctx.state, record.capsule_id, record.network_spec), "changed": False, "cut": []}
    if record.network_spec is None:
        raise netlive.none_refusal(record.capsule_id)
    # preset:NAME stands for its rules, in both lists (the row keeps the words as asked).
    allow, remove = (expand_rules(asked.get(key, ()), ctx.state.root) for key in ("allow", "remove"))
    made, cut = await netlive.change_rules(ctx.capsules.networks, ctx.state, record.capsule_id, who(ctx),
                                           allow=allow, remove=remove, caps=asked.get("caps"), asked=asked)
    spec = record.network_spec if made is None else made.spec
    return {**_shown(ctx.state, record.capsule_id, spec), "changed": made is not None, "cut": cut}


def network_text(result: dict[str, Any]) -> str:
    """The rules one per line, then the changes: what ``ccw capsule net`` prints."""
    network = result["network"]
    if network == "none":
        return f"{result['capsule_id']}: network none"
    lines = [f"{result['capsule_id']}: rules {result['rules']} (max_bytes {network['max_bytes']}, "
             f"max_connections {network['max_connections']})"]
    lines += [f"  allow {rule}" for rule in network["allow"]]
    for change in result["changes"]:
        parts = [f"+{rule}" for rule in change["allow"]] + [f"-{rule}" for rule in change["remove"]]
        if change["caps"]:
            parts += [f"{key}={value}" for key, value in sorted(change["caps"].items())]
        lines.append(f"  change {change['seq']} at {change['at']} by {change['who']}: {' '.join(parts)} "
                     f"({change['previous']} -> {change['rules']})")
    for record in result["cut"]:
        lines.append(f"  cut {record['protocol']} {record['host']}:{record['port']}: {record['cut']}")
    outcome = result.get("outcome")
    if outcome:
        lines.append(f"  proposal {result['proposal']} of {outcome['proposer']}: {', '.join(outcome['rules'])} "
                     f"({outcome['reason']}): {outcome['state']}" + (f" by {outcome['who']}" if outcome["who"] else "")
                     + (f": {outcome['why']}" if outcome["why"] else "")
                     + (f", {outcome['applied']}" if outcome["applied"] else ""))
    return "\n".join(lines)


def _proposing(spec: ToolSpec) -> ToolSpec:
    """capsule_network as the agent profile serves it: propose and poll, never change rules
    (over stdio and the socket no token stops an ``allow``; this schema does)."""
    kept = ("capsule_id", "propose", "reason", "proposal", "wait_ms")
    schema = dict(spec.input_schema, properties={name: spec.input_schema["properties"][name] for name in kept})
    return replace(spec, input_schema=schema, narrowed=None, description=(
        "Propose network rules (capsule_create's grammar, preset:NAME) with a reason for a person to decide, "
        "then poll it: proposal: its id (wait_ms). With capsule_id alone: the rules in force."))


TOOLS = [
    ToolSpec(
        name="capsule_network",
        family="capsule",
        title="Show or change a capsule's allowlist",
        description=(
            "Show or change a capsule's network rules (admin): allow/remove (capsule_create's grammar, "
            "preset:NAME), caps; connections no longer allowed are cut; journaled. "
            "An agent may propose rules with a reason for a person to decide, then poll its id (wait_ms)."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, "allow": _RULES_ARG, "remove": _RULES_ARG, "caps": _CAPS,
                           "propose": {"type": "array", "items": {"type": "string"}}, "reason": {"type": "string"},
                           "proposal": {"type": "integer"},
                           "decide": {"enum": ["approve", "deny"]}, "wait_ms": {"type": "integer"}},
        },
        output_schema={
            "type": "object", "required": ["capsule_id", "network", "rules", "changes", "changed", "cut"],
            "properties": {
                "capsule_id": {"type": "string"},
                "network": {"type": ["string", "object"]},  # "none", or the rules in force
                "rules": {"type": ["string", "null"]},  # their id (netrules.rules_id)
                "changes": {"type": "array", "items": {"type": "object"}},
                "changed": {"type": "boolean"},
                "cut": {"type": "array", "items": {"type": "object"}},  # the records of the connections cut
                "proposal": {"type": "integer"},  # its id, to poll
                "outcome": {"type": "object"},  # capsules/asks.py Question.outcome: state, who, why, applied
            },
        },
        handler=capsule_network,
        text=network_text,
        scope="admin",
        scope_of=scope_of,
        other_scopes=("exec",),
        narrowed=_proposing,
    ),
]
