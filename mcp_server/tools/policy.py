"""Policy tools: policy_set, policy_list, policy_get (seed 003 §7).

Built-in policies live in ``policies/`` and are read-only: ``policy_set`` on a built-in
name is refused unless ``override_builtin: true`` is passed, so a typo cannot silently
weaken ``strict``.  Stored policies persist in the state database; every policy is
validated against ``policies/policy.schema.json`` before it is stored.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_server.capsules.fragments import POLICY_NAME
from mcp_server.capsules.policy import PolicyStore
from mcp_server.core.policy import RULE_NAMES
from mcp_server.fs.policy import builtin_policies, policy_schema, validate_policy
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError


async def policy_set(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Validate and store a policy."""
    name = args["name"]
    policy: dict[str, Any] = {"name": name, "rules": args["rules"]}
    if args.get("description"):
        policy["description"] = args["description"]
    validate_policy(policy)
    if name in builtin_policies() and not args.get("override_builtin"):
        raise CcwError(
            "CONFLICT",
            f"{name!r} is a built-in policy; to replace it for this state dir call policy_set again "
            "with override_builtin: true, or choose another name",
            {"name": name},
        )
    PolicyStore(ctx.state).put(policy)
    return {"ok": True, "name": name}


async def policy_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Every policy by name, saying which are built in and which override a built-in."""
    store = PolicyStore(ctx.state)
    stored = store.stored()
    builtins = builtin_policies()
    out = []
    for name in sorted(set(stored) | set(builtins)):
        policy = stored.get(name) or builtins[name]
        out.append(
            {
                "name": name,
                "builtin": name in builtins,
                "overridden": name in builtins and name in stored,
                "description": policy.get("description", ""),
                "rules": sorted(policy["rules"]),
            }
        )
    return {"policies": out}


async def policy_get(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """One policy with its rules."""
    name = args["name"]
    store = PolicyStore(ctx.state)
    policy = store.get(name)
    source = "stored" if name in store.stored() else "builtin"
    return {"name": name, "description": policy.get("description", ""), "rules": policy["rules"], "source": source}


def _rules_schema() -> dict[str, Any]:
    rules: dict[str, Any] = json.loads(json.dumps(policy_schema()["$defs"]["rules"]))
    # Unknown rule names get a friendlier error from validate_policy than the schema gives.
    rules["additionalProperties"] = True
    return rules


TOOLS = [
    ToolSpec(
        name="policy_set",
        family="policy",
        title="Set policy",
        description=(
            "Create or replace a promotion policy: rules by name. Built-in policies (baseline, strict) "
            "need override_builtin: true."
        ),
        input_schema={
            "type": "object",
            "required": ["name", "rules"],
            "additionalProperties": False,
            "properties": {
                "name": POLICY_NAME,
                "rules": _rules_schema(),
                "description": {"type": "string", "maxLength": 2000},
                "override_builtin": {"type": "boolean"},
            },
        },
        output_schema={
            "type": "object",
            "required": ["ok"],
            "additionalProperties": False,
            "properties": {"ok": {"const": True}, "name": POLICY_NAME},
        },
        handler=policy_set,
        scope="admin",
        aliases=("policy/set",),
        idempotent=True,
    ),
    ToolSpec(
        name="policy_list",
        family="policy",
        title="List policies",
        description="Every policy: built-in ones and those set with policy_set.",
        input_schema={"type": "object", "additionalProperties": False, "properties": {}},
        output_schema={
            "type": "object",
            "required": ["policies"],
            "additionalProperties": False,
            "properties": {
                "policies": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "builtin", "overridden", "description", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": POLICY_NAME,
                            "builtin": {"type": "boolean"},
                            "overridden": {"type": "boolean"},
                            "description": {"type": "string"},
                            "rules": {"type": "array", "items": {"enum": list(RULE_NAMES)}},
                        },
                    },
                }
            },
        },
        handler=policy_list,
        scope="read",
        aliases=("policy/list",),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="policy_get",
        family="policy",
        title="Get policy",
        description="One policy's rules.",
        input_schema={
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": POLICY_NAME},
        },
        output_schema={
            "type": "object",
            "required": ["name", "description", "rules", "source"],
            "additionalProperties": False,
            "properties": {
                "name": POLICY_NAME,
                "description": {"type": "string"},
                "rules": policy_schema()["$defs"]["rules"],
                "source": {"enum": ["builtin", "stored"]},
            },
        },
        handler=policy_get,
        scope="read",
        aliases=("policy/get",),
        read_only=True,
        idempotent=True,
    ),
]
