"""capsule_promote: policies first, then an all-or-nothing write into the real tree.

An adapter over mcp_server/capsules/promotion.py, which gives the order of the checks
and why.  ``dry_run`` runs the checks, writes nothing, and lists in ``applied`` what
would be applied.  Default policies: ``["baseline"]``.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.fragments import CAPSULE_ID, POLICY_NAME
from mcp_server.capsules.promotion import Request, promote
from mcp_server.tools.registry import ToolContext, ToolSpec


async def capsule_promote(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Check policies and conflicts, then write the capsule's changes to the workspace."""
    request = Request(args["capsule_id"], args.get("policies") or ["baseline"], bool(args.get("dry_run")))
    return await promote(ctx.capsules, request)


TOOLS = [
    ToolSpec(
        name="capsule_promote",
        family="capsule",
        title="Promote capsule",
        description=(
            "Write the capsule's changes into the real workspace, all or nothing, if the policies "
            "pass (default: baseline) and the workspace has not changed under it (else REPO_CHANGED). "
            "dry_run: report only."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "policies": {"type": "array", "items": POLICY_NAME, "maxItems": 16},
                "dry_run": {"type": "boolean"},
            },
        },
        output_schema={
            "type": "object", "required": ["promoted", "applied", "policy_report"], "additionalProperties": False,
            "properties": {
                "promoted": {"type": "boolean"},
                "dry_run": {"type": "boolean"},
                "applied": {"type": "array", "items": {"type": "string"}},
                "policy_report": {
                    "type": "object",
                    "required": ["passed", "tests_ok", "replay_ok", "resource_ok", "paths_ok", "deny_paths",
                                 "resource_violations", "test_failures", "details"],
                    "properties": {
                        "passed": {"type": "boolean"}, "tests_ok": {"type": "boolean"},
                        "replay_ok": {"type": ["boolean", "null"]}, "resource_ok": {"type": "boolean"},
                        "output_identical": {"type": ["boolean", "null"],
                                             "description": "Whether the replay printed the same output (null: no replay)."},
                        "paths_ok": {"type": "boolean"}, "deny_paths": {"type": "array", "items": {"type": "string"}},
                        "network_ok": {"type": "boolean",
                                       "description": "No connection the runs made is refused by allow_hosts/deny_hosts."},
                        "network_violations": {"type": "array", "items": {"type": "object"},
                                               "description": "Each refused connection: exec, host, port, rule."},
                        "resource_violations": {"type": "array"}, "test_failures": {"type": "array"},
                        "details": {"type": "string"},
                    },
                },
            },
        },
        handler=capsule_promote,
        scope="promote",
        aliases=("capsule/promote",),
        destructive=True,
    ),
]
