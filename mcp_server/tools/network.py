"""capsule_network: show a live capsule's allowlist, or change it (a person's power).

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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from mcp_server.capsules import netlive
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.core import netrules
from mcp_server.fs.netpresets import expand_rules
from mcp_server.tools.registry import ToolContext, ToolSpec

_RULES_ARG = {"type": "array", "maxItems": 1024, "items": {"type": "string", "minLength": 1, "maxLength": 300}}
_CAPS = {"type": "object", "additionalProperties": False, "minProperties": 1,
         "properties": {"max_bytes": {"type": "integer", "minimum": 1},
                        "max_connections": {"type": "integer", "minimum": 1}}}


def who(ctx: ToolContext) -> str:
    """Who asked for a change: the HTTP token's name, or the uid the front end serves and through what."""
    token = ctx.runs.owner
    if token is not None:
        return f"token {token}"
    via = "ccw" if getattr(ctx, "caller_env", None) is not None else "mcp client"
    return f"uid {os.getuid()} ({via})"


def _shown(state: Any, capsule_id: str, spec: netrules.NetworkSpec | None) -> dict[str, Any]:
    history = netlive.changes(state, capsule_id)
    return {"capsule_id": capsule_id, "network": netrules.network_json(spec),
            "rules": None if spec is None else netrules.rules_id(spec),
            "changes": [change.to_json() for change in history]}


async def capsule_network(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The capsule's rules, after adding ``allow``, removing ``remove`` and setting ``caps`` if asked."""
    record = ctx.capsules.live_record(args["capsule_id"])
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
    return "\n".join(lines)


TOOLS = [
    ToolSpec(
        name="capsule_network",
        family="capsule",
        title="Show or change a capsule's allowlist",
        description=(
            "Show a live capsule's network rules and their changes, or change them: allow/remove rules "
            "(capsule_create's grammar, preset:NAME), caps. The next connection obeys; open ones no longer "
            "allowed are cut. Journaled with who. Not for a capsule made with network none."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, "allow": _RULES_ARG, "remove": _RULES_ARG, "caps": _CAPS},
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
            },
        },
        handler=capsule_network,
        text=network_text,
        scope="admin",
    ),
]
