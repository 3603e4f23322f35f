"""capsule_promote: policies first, then an all-or-nothing write into the real tree.

An adapter over mcp_server/capsules/promote.py, which gives the order of the checks
and why.  ``dry_run`` runs the checks, writes nothing, and lists in ``applied`` what
would be applied.  Default policies: ``["baseline"]``.  ``allow_hazards`` names the
hazard kinds (mcp_server/core/hazards.py) to promote anyway, after a review.
``include_ignored``, ``paths`` and ``exclude`` set the scope (mcp_server/fs/gitignore.py):
what the live workspace's git ignores is left behind unless ``include_ignored``, and
each path left behind is listed in ``skipped``; past ``SKIPPED_LISTED`` of them (a reinstalled
``node_modules/`` is tens of thousands), a directory stands for what below it was left
behind for the same reason, as the diff's note names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_server.capsules.branch import branch
from mcp_server.capsules.fragments import CAPSULE_ID, POLICY_NAME
from mcp_server.capsules.promote import PROMOTE, Request, promote
from mcp_server.core.hazards import KINDS
from mcp_server.core.paths import parents
from mcp_server.events import record_outcome
from mcp_server.fs.gitignore import Scope
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError

HAZARD = {
    "type": "object", "required": ["kind", "path", "action", "reason", "allowed"], "additionalProperties": False,
    "properties": {
        "kind": {"enum": list(KINDS)},
        "path": {"type": "string"},
        "action": {"enum": ["write", "symlink", "mkdir", "chmod", "delete"]},
        "reason": {"type": "string"},
        "allowed": {"type": "boolean", "description": "Named in allow_hazards: promoted anyway."},
    },
}

SKIPPED_LISTED = 1000

GLOB = {"type": "string", "minLength": 1, "maxLength": 4096}
SKIPPED = {
    "type": "object", "required": ["path", "reason"], "additionalProperties": False,
    "properties": {"path": {"type": "string"},
                   "reason": {"enum": ["ignored", "excluded", "not in paths", "git dir", "pseudoref"]}},
}


async def capsule_promote(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Check policies and conflicts, then write the capsule's changes to the workspace."""
    request = Request(args["capsule_id"], args.get("policies") or ["baseline"], bool(args.get("dry_run")),
                      frozenset(args.get("allow_hazards") or ()),
                      Scope(bool(args.get("include_ignored")), tuple(args.get("paths") or ()),
                            tuple(args.get("exclude") or ())))
    try:
        if args.get("as_branch") is not None:
            result = await branch(ctx.capsules, request, args["as_branch"])
        else:
            result = await promote(ctx.capsules, request)
    except CcwError as exc:  # a refusal (REPO_CHANGED, a hazard...) is shown to watchers too
        record_outcome(ctx.state, request.capsule_id, promotion_events(None, exc))
        raise
    record_outcome(ctx.state, request.capsule_id, promotion_events(result, None))
    return {**result, "skipped": compact_skipped(result["skipped"])} if "skipped" in result else result


def compact_skipped(skipped: list[dict[str, str]]) -> list[dict[str, str]]:
    """``skipped``, or past ``SKIPPED_LISTED`` paths, those not below a skipped directory of
    their reason (a directory is in the list before what is below it)."""
    if len(skipped) <= SKIPPED_LISTED:
        return skipped
    reasons = {one["path"]: one["reason"] for one in skipped}
    return [one for one in skipped if not any(reasons.get(d) == one["reason"] for d in parents(one["path"]))]


def promotion_events(result: Mapping[str, Any] | None, error: BaseException | None) -> list[tuple[str, dict[str, Any]]]:
    """A promotion's events (``ToolSpec.outcome``): its policy report and what it applied, or
    refused: by the policies (POLICY_FAILED, naming those that failed) or by ``error``."""
    if result is None:
        refusal = {"code": getattr(error, "code", None), "message": getattr(error, "message", None)}
        return [("promotion", {"applied": [], "dry_run": None, "refused": refusal})]
    report = result.get("policy_report") or {}
    failed = sorted(key.removesuffix("_ok") for key, value in report.items() if key.endswith("_ok") and value is False)
    refused = None if result.get("promoted") or result.get("dry_run") else {
        "code": "POLICY_FAILED", "message": f"failed: {', '.join(failed) or 'the policies'}"}
    promotion = {"applied": result.get("applied") or [], "dry_run": bool(result.get("dry_run")), "refused": refused}
    made = result.get("branch")
    if made:  # as_branch: the paths went into a commit on a new branch, never into the workspace
        promotion["branch"] = {"name": made.get("name"), "commit": made.get("commit")}
    return [("policy.report", {"passed": report.get("passed"), "report": report}), ("promotion", promotion)]


TOOLS = [
    ToolSpec(
        name="capsule_promote",
        family="capsule",
        title="Promote capsule",
        description=(
            "Write the capsule's changes to the workspace, all or nothing, if the policies pass "
            "(default: baseline) and the workspace is unchanged (else REPO_CHANGED). Hazards (setuid, "
            "world-writable, .git control, autorun files like .envrc) are refused unless in allow_hazards. "
            "Git-ignored files are skipped unless include_ignored; paths/exclude select. dry_run: report only."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "policies": {"type": "array", "items": POLICY_NAME, "maxItems": 16},
                "dry_run": {"type": "boolean"},
                "allow_hazards": {
                    "type": "array", "uniqueItems": True, "items": {"enum": list(KINDS)},
                    "description": "Hazard kinds to promote anyway, once reviewed (setuid: without the bits).",
                },
                "include_ignored": {"type": "boolean",
                                    "description": ("Promote the files the live workspace's git ignores too "
                                                    "(default: false).")},
                "paths": {"type": "array", "items": GLOB, "maxItems": 256,
                          "description": "Promote only the paths these globs match (default: all), relative to "
                                         "the workspace: * ? [..] within a component, ** any number of components; "
                                         "a directory matches everything under it."},
                "exclude": {"type": "array", "items": GLOB, "maxItems": 256,
                            "description": "Leave behind the paths these globs (as in paths) match."},
                "as_branch": {"type": "string", "description": "Instead: commit it to this new git branch."},
            },
        },
        output_schema={
            "type": "object", "required": ["promoted", "applied", "policy_report"], "additionalProperties": False,
            "properties": {
                "promoted": {"type": "boolean"},
                "dry_run": {"type": "boolean"},
                "applied": {"type": "array", "items": {"type": "string"}},
                "skipped": {"type": "array", "items": SKIPPED,
                            "description": "Changes the scope left behind, in order; "
                                           "past 1000, a dir stands for all below it."},
                "ignored": {"const": "not a git repository",
                            "description": "Present when the workspace has no git ignore rules to apply."},
                # as_branch: {name, ref, parent, commit (once made)}.
                "branch": {"type": "object"},
                # Each changed git dir: {gitdir, count, paths, refs, promoted_refs: [{ref, old, new}]}.
                "git": {"type": "array", "items": {"type": "object"}},
                "policy_report": {
                    "type": "object",
                    "required": ["passed", "tests_ok", "replay_ok", "resource_ok", "paths_ok", "deny_paths",
                                 "resource_violations", "test_failures", "details"],
                    "properties": {
                        "passed": {"type": "boolean"}, "tests_ok": {"type": "boolean"},
                        "replay_ok": {"type": ["boolean", "null"]}, "resource_ok": {"type": "boolean"},
                        "output_identical": {"type": ["boolean", "null"],
                                             "description": ("Whether the replay printed the same output "
                                                             "(null: no replay).")},
                        "paths_ok": {"type": "boolean"}, "deny_paths": {"type": "array", "items": {"type": "string"}},
                        "network_ok": {"type": "boolean",
                                       "description": ("No connection the runs made is refused by "
                                                       "allow_hosts/deny_hosts.")},
                        "network_violations": {"type": "array", "items": {"type": "object"},
                                               "description": "Each refused connection: exec, host, port, rule."},
                        "hazards_ok": {"type": "boolean",
                                       "description": "Every hazard found is allowed by allow_hazards (or none)."},
                        "hazards": {"type": "array", "items": HAZARD,
                                    "description": "What would run or escalate on the host, sorted by path."},
                        "resource_violations": {"type": "array"}, "test_failures": {"type": "array"},
                        "details": {"type": "string"},
                        "services": {"type": "array", "items": {"type": "object"},
                                     "description": ("The services running, frozen while the change was read "
                                                     "and written.")},
                    },
                },
            },
        },
        handler=capsule_promote,
        outcome=promotion_events,
        turn=PROMOTE,
        scope="promote",
        aliases=("capsule/promote",),
        destructive=True,
    ),
]
