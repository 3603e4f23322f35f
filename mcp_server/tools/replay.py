"""capsule_replay: re-run a witness in a fresh capsule and compare (seed 003 §5).

An adapter over mcp_server/capsules/replay.py, which says how the base is rebuilt and
the execs re-run, and what a replay takes from its replayer (``env``, ``network``,
``workspace``, ``allow_untrusted``) and never from the server; what is compared, and
what ``replay_ok`` and ``output_identical`` mean, is in core/replaydiff.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_server.capsules.executors import executor_for
from mcp_server.capsules.fragments import NETWORK_GRANT, PROBLEMS, WITNESS_ID
from mcp_server.capsules.owners import REPORT_SCHEMA as OWNERS_REPORT
from mcp_server.capsules.replay import ReplayOptions
from mcp_server.capsules.run import RUN_STATUS, WAIT_MS, WAIT_MS_DEFAULT, Run
from mcp_server.capsules.witness import locate
from mcp_server.core import volatile
from mcp_server.core.netrules import parse_network
from mcp_server.events import finished
from mcp_server.fs.netpresets import expand_network
from mcp_server.fs.witness_key import SIGNATURE_SCHEMA as SIGNATURE
from mcp_server.fs.witness_key import SIGNED_BY_SCHEMA as SIGNED_BY
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.checks import ENV_NAME_RE, MAX_ENV


async def capsule_replay(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Replay a witness and say whether every exec and the change set came out the same."""
    path, expected = locate(ctx.state, args.get("witness_id"), args.get("path"))
    options = ReplayOptions(env=dict(args.get("env") or {}),
                            network=parse_network(expand_network(args.get("network"), ctx.state.root)),
                            workspace=args.get("workspace"), allow_untrusted=bool(args.get("allow_untrusted")),
                            volatile=volatile.globs_arg(args.get("volatile")),
                            strict_outputs=bool(args.get("strict_outputs")))

    async def body(run: Run) -> dict[str, Any]:
        executor = executor_for(ctx.config.reapi_url, ctx.config.reapi_parallel, ctx.config.reapi_platform)
        try:
            return await executor.replay(ctx.for_run(run).capsules, path, expected, options)
        finally:
            executor.close()

    return await ctx.runs.call("capsule_replay", None, body, args.get("wait_ms", WAIT_MS_DEFAULT), ctx.progress)


def replay_events(result: Mapping[str, Any] | None, error: BaseException | None) -> list[tuple[str, dict[str, Any]]]:
    """A replay's verdict (``ToolSpec.outcome``, told when its run ends), with the count of
    outputs that differ; a failed or cancelled replay is no event."""
    done = finished(result)
    if done is None:
        return []
    return [("replay", {"replay_ok": done.get("replay_ok"), "root_hash": done.get("root_hash"),
                        "output_identical": done.get("output_identical"),
                        "differences": len(done.get("output_diffs") or [])})]


_NETWORK_SHOWN = {"type": ["string", "object"], "description": "'none' or an allowlist's canonical object."}
_SERVICES_SHOWN = {
    "type": "object", "required": ["started", "not_compared"], "additionalProperties": False,
    "description": ("Only for a witness whose runs had services beside them (capsules/replay_steps.py). started: "
                    "each set the replay started from its specs, ready before the execs named; not_compared: the "
                    "witness's own runs of services, not re-run (each lasted as long as its service)."),
    "properties": {
        "started": {"type": "array", "items": {
            "type": "object", "required": ["services", "execs"], "additionalProperties": False,
            "properties": {"services": {"type": "array", "items": {"type": "string"}},
                           "execs": {"type": "array", "items": {"type": "integer"}}}}},
        "not_compared": {"type": "array", "items": {
            "type": "object", "required": ["exec", "service", "argv"], "additionalProperties": False,
            "properties": {"exec": {"type": "integer"}, "service": {"type": "string"},
                           "argv": {"type": "array", "items": {"type": "string"}}}}},
    },
}

TOOLS = [
    ToolSpec(
        name="capsule_replay",
        family="witness",
        title="Replay witness",
        description=(
            "Re-run a witness's commands in a fresh capsule over its base. replay_ok: the same exits, files "
            "written and changes (mismatches); gitignored files (ignored_differences) and output (output_diffs) "
            "apart. A witness is untrusted: its commands get only the env, network and workspace given here; one "
            "not signed here or by a trusted key needs allow_untrusted."
        ),
        input_schema={
            "type": "object", "additionalProperties": False,
            "properties": {
                "witness_id": WITNESS_ID, "path": {"type": "string"},
                "env": {
                    "type": "object", "maxProperties": MAX_ENV,
                    "propertyNames": {"pattern": f"^{ENV_NAME_RE.pattern}$"},
                    "additionalProperties": {"type": "string"},
                    "description": "Variables for the commands; recorded names not given: env_missing.",
                },
                "network": {**NETWORK_GRANT, "description": (
                    "What the commands may reach, as in capsule_create (default 'none'); "
                    "the recorded one is never used.")},
                "workspace": {"type": "string", "description": (
                    "For a witness without blobs: your copy of its workspace, to replay over.")},
                "allow_untrusted": {"type": "boolean",
                                    "description": "Replay it though not signed here or by a trusted key."},
                "strict_outputs": {"type": "boolean", "description": "Compare gitignored files too."},
                "volatile": {**volatile.GLOBS_SCHEMA, "description": (
                    "Globs of paths to leave out (.nyc_output/*.json), with the witness's own.")},
                "wait_ms": WAIT_MS,
            },
        },
        output_schema={"type": "object", "oneOf": [RUN_STATUS, {
            "type": "object", "required": ["replay_ok", "root_hash", "metrics"], "additionalProperties": False,
            "properties": {
                "replay_ok": {"type": "boolean"}, "root_hash": {"type": "string"},
                "execs": {"type": "integer", "description": "Execs re-run and compared (not the services' own runs)."},
                "output_identical": {"type": "boolean"},
                "mismatches": PROBLEMS,
                "output_diffs": {
                    "type": "array",
                    "items": {
                        "type": "object", "required": ["exec", "stream", "lines"],
                        "properties": {
                            "exec": {"type": "integer"}, "stream": {"enum": ["stdout", "stderr"]},
                            "argv": {"type": "array", "items": {"type": "string"}},
                            "lines": {"type": ["array", "null"], "items": {"type": "string"},
                                      "description": "Unified-diff lines, no context: '-' recorded, '+' replayed."},
                            "lines_omitted": {"type": "integer"}, "expected_bytes": {"type": "integer"},
                            "actual_bytes": {"type": "integer"}, "note": {"type": "string"},
                        },
                    },
                },
                "owners": OWNERS_REPORT,
                "metrics": {
                    "type": "object", "required": ["cpu_ms", "rss_max_kb"], "additionalProperties": False,
                    "properties": {"cpu_ms": {"type": ["integer", "null"]},
                                   "rss_max_kb": {"type": ["integer", "null"]}},
                },
                "signature": SIGNATURE, "signed_by": SIGNED_BY,
                "env_missing": {"type": "array", "items": {"type": "string"}, "description": (
                    "Variables the witness's capsule passed that this replay was not given.")},
                "network": {
                    "type": "object", "required": ["recorded", "used"], "additionalProperties": False,
                    "properties": {"recorded": _NETWORK_SHOWN, "used": _NETWORK_SHOWN},
                },
                "volatile": {
                    "type": "object", "required": ["globs", "paths"], "additionalProperties": False,
                    "properties": {
                        "globs": {"type": "array", "items": {"type": "string"}},
                        "paths": {"type": "array", "items": {
                            "type": "object", "properties": {"exec": {"type": ["integer", "null"]},
                                                             "path": {"type": "string"},
                                                             "recorded": {"type": "boolean"},
                                                             "replayed": {"type": "boolean"}},
                        }},
                    },
                },
                "ignored_differences": PROBLEMS,  # the mismatches in files the witness's base ignores
                "gitdirs": {"type": "object"},  # {not_shown, reason}: the recorded capsule's git dirs a witness lacks
                "services": _SERVICES_SHOWN,
                "expose": {
                    "type": "object", "required": ["used", "dropped"], "additionalProperties": False,
                    "properties": {"used": {"type": "array", "items": {"type": "string"}},
                                   "dropped": {"type": "array", "items": {
                        "type": "object", "properties": {"path": {"type": "string"}, "reason": {"type": "string"}}}}},
                },
            },
        }]},
        handler=capsule_replay,
        outcome=replay_events,
        scope="exec",
        aliases=("capsule/replay",),
        read_only=True,
    ),
]
