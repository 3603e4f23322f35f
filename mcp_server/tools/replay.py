"""capsule_replay: re-run a witness in a fresh capsule and compare (seed 003 §5).

An adapter over mcp_server/capsules/replays.py, which says how the base is rebuilt and
the execs re-run; what is compared, and what ``replay_ok`` and ``output_identical``
mean, is in core/replaydiff.py.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.executors import executor_for
from mcp_server.capsules.fragments import PROBLEMS, WITNESS_ID
from mcp_server.capsules.witnesses import locate
from mcp_server.tools.registry import ToolContext, ToolSpec


async def capsule_replay(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Replay a witness and say whether every exec and the change set came out the same."""
    path, expected = locate(ctx.state, args.get("witness_id"), args.get("path"))
    executor = executor_for(ctx.config.reapi_url, ctx.config.reapi_parallel, ctx.config.reapi_platform)
    try:
        return await executor.replay(ctx.capsules, path, expected)
    finally:
        executor.close()


TOOLS = [
    ToolSpec(
        name="capsule_replay",
        family="witness",
        title="Replay witness",
        description=(
            "Re-run a witness's commands in a fresh capsule over its recorded base. replay_ok: the same "
            "exit codes, signals, timeouts, files written and changes (mismatches name the exec or path). "
            "Output is compared apart (output_identical; output_diffs shows the differing lines)."
        ),
        input_schema={
            "type": "object", "additionalProperties": False,
            "properties": {"witness_id": WITNESS_ID, "path": {"type": "string"}},
        },
        output_schema={
            "type": "object", "required": ["replay_ok", "root_hash", "metrics"], "additionalProperties": False,
            "properties": {
                "replay_ok": {"type": "boolean"}, "root_hash": {"type": "string"}, "execs": {"type": "integer"},
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
                "metrics": {
                    "type": "object", "required": ["cpu_ms", "rss_max_kb"], "additionalProperties": False,
                    "properties": {"cpu_ms": {"type": ["integer", "null"]}, "rss_max_kb": {"type": ["integer", "null"]}},
                },
            },
        },
        handler=capsule_replay,
        scope="exec",
        aliases=("capsule/replay",),
        read_only=True,
    ),
]
